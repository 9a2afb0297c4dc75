package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
)

// mesh is a set of clusters in a full mesh, each link optionally through a
// fault proxy.
type mesh struct {
	t       *testing.T
	nodes   map[string]*proc
	names   []string
	proxies map[string]*faultProxy // "a->b"
}

// newMesh prepares one node per name, every pair linked both ways with a
// shared secret. With proxied, each directed link goes through its own
// fault proxy.
func newMesh(t *testing.T, seed uint64, proxied bool, names ...string) *mesh {
	m := &mesh{t: t, nodes: map[string]*proc{}, names: names, proxies: map[string]*faultProxy{}}
	for _, n := range names {
		m.nodes[n] = newProc(t, n, n)
	}
	for i, from := range names {
		for j, to := range names {
			if from == to {
				continue
			}
			url := m.nodes[to].url
			if proxied {
				px := newFaultProxy(t, url, seed+uint64(i*31+j))
				m.proxies[from+"->"+to] = px
				url = px.url()
			}
			m.nodes[from].args = append(m.nodes[from].args, "--peer", to+"="+url, "--peer-secret", to+"=secret-"+pair(from, to))
		}
	}
	return m
}

func pair(a, b string) string {
	if a > b {
		a, b = b, a
	}
	return a + b
}

func (m *mesh) start() {
	for _, n := range m.names {
		m.nodes[n].start()
	}
	for _, n := range m.names {
		m.nodes[n].waitReady(30 * time.Second)
	}
}

func peersReport(t *testing.T, p *proc) api.PeersReport {
	t.Helper()
	var r api.PeersReport
	if _, err := p.client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &r); err != nil {
		t.Fatalf("%s /admin/peers: %v", p.name, err)
	}
	return r
}

func digestOf(p *proc) (api.DigestReport, error) {
	var d api.DigestReport
	_, err := p.client().Do(bg(), http.MethodGet, "/admin/digest", nil, nil, &d)
	return d, err
}

// converge waits until every node has shipped everything and all digests
// are equal.
func (m *mesh) converge(d time.Duration) api.DigestReport {
	m.t.Helper()
	var last api.DigestReport
	eventually(m.t, d, func() (bool, string) {
		var first *api.DigestReport
		for _, n := range m.names {
			p := m.nodes[n]
			var r api.PeersReport
			if _, err := p.client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &r); err != nil {
				return false, err.Error()
			}
			for _, l := range r.Links {
				if l.EntriesBehind > 0 {
					return false, fmt.Sprintf("%s is %d entries behind towards %s (%s)", n, l.EntriesBehind, l.Peer, l.LastError)
				}
			}
			dg, err := digestOf(p)
			if err != nil {
				return false, err.Error()
			}
			if first == nil {
				first = &dg
				continue
			}
			if dg.Digest != first.Digest {
				return false, fmt.Sprintf("digests differ: %s=%s (%d keys), %s=%s (%d keys)", m.names[0], first.Digest[:12], first.Keys, n, dg.Digest[:12], dg.Keys)
			}
		}
		last = *first
		return true, ""
	})
	return last
}

// written is one acknowledged write: the stamp it got and what it wrote.
type written struct {
	version string
	value   string // "" for a delete
}

// checkHighestStampWins: every key holds the write with the highest stamp
// among all acknowledged writes to it (absent if that was a delete).
func checkHighestStampWins(t *testing.T, p *proc, writes map[string][]written) {
	t.Helper()
	items, err := p.client().ScanAll(bg(), client.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]client.Item{}
	for _, it := range items {
		state[it.Key] = it
	}
	for key, ws := range writes {
		best := ws[0]
		bestSt, _ := entry.ParseStamp(best.version)
		for _, w := range ws[1:] {
			st, _ := entry.ParseStamp(w.version)
			if st.Compare(bestSt) > 0 {
				best, bestSt = w, st
			}
		}
		it, present := state[key]
		switch {
		case best.value == "" && present:
			t.Fatalf("%s: key %s holds %q (%s); its highest write %s was a delete", p.name, key, it.Value, it.Version, best.version)
		case best.value != "" && (!present || string(it.Value) != best.value || it.Version != best.version):
			t.Fatalf("%s: key %s holds %q (%s, present=%v); its highest write is %q (%s)", p.name, key, it.Value, it.Version, present, best.value, best.version)
		}
	}
	if len(state) > len(writes) {
		t.Fatalf("%s holds %d keys, only %d were written", p.name, len(state), len(writes))
	}
}

// workload writes (and with deletes, deletes) keys at every node at once and
// records each acknowledged write's version.
func workload(t *testing.T, m *mesh, seed uint64, perNode, keySpace int, deletes bool) map[string][]written {
	var mu sync.Mutex
	writes := map[string][]written{}
	var wg sync.WaitGroup
	for ni, name := range m.names {
		for w := 0; w < 4; w++ {
			wg.Add(1)
			r := newRand(seed + uint64(ni*10+w))
			c := m.nodes[name].client()
			go func() {
				defer wg.Done()
				for i := 0; i < perNode/4; i++ {
					var key string
					if r.IntN(2) == 0 {
						key = fmt.Sprintf("shared/%03d", r.IntN(keySpace))
					} else {
						key = fmt.Sprintf("own-%s/%04d", name, r.IntN(keySpace*4))
					}
					var res client.WriteResult
					var err error
					value := ""
					if deletes && r.IntN(4) == 0 {
						res, err = c.Delete(bg(), key)
					} else {
						value = fmt.Sprintf("%s-%d-%d", name, w, i)
						res, err = c.Put(bg(), key, []byte(value))
					}
					if err != nil {
						t.Errorf("write at %s: %v", name, err)
						return
					}
					mu.Lock()
					writes[key] = append(writes[key], written{version: res.Version, value: value})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return writes
}

func TestTwoClustersConverge(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, false, "a", "b")
	m.start()
	writes := workload(t, m, s, 2000, 100, false)
	d := m.converge(60 * time.Second)
	for _, n := range m.names {
		checkHighestStampWins(t, m.nodes[n], writes)
	}
	t.Logf("converged on %d keys, digest %s", d.Keys, d.Digest[:16])
}

// TestThreeClusterMeshWithDeletes: writes and deletes of the same keys at
// three clusters converge, and no entry is ever shipped back to its origin.
func TestThreeClusterMeshWithDeletes(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, false, "a", "b", "c")
	m.start()
	writes := workload(t, m, s, 1500, 60, true)
	d := m.converge(60 * time.Second)
	for _, n := range m.names {
		checkHighestStampWins(t, m.nodes[n], writes)
		r := peersReport(t, m.nodes[n])
		for from, c := range r.Incoming {
			if c.DroppedOwn != 0 {
				t.Fatalf("%s received %d of its own entries back from %s", n, c.DroppedOwn, from)
			}
		}
	}
	t.Logf("converged on %d keys (%d tombstones at a)", d.Keys, d.Tombstones)
}

// streamsOf returns what a node applied of each origin, from the persisted
// high-water marks.
func streamsOf(t *testing.T, p *proc) map[string]api.StreamReport {
	out := map[string]api.StreamReport{}
	for _, s := range peersReport(t, p).Streams {
		out[s.Origin+"/"+s.Stream] = s
	}
	return out
}

func walLast(t *testing.T, p *proc) api.WALReport {
	var w api.WALReport
	if _, err := p.client().Do(bg(), http.MethodGet, "/admin/wal", nil, nil, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// checkAppliedOnce: for every stream a node applied, the merges it counted
// (persisted with the data) equal the distinct WAL identities it was sent,
// which is the origin's last index once converged.
func checkAppliedOnce(t *testing.T, receiver *proc, senders ...*proc) {
	t.Helper()
	streams := streamsOf(t, receiver)
	for _, snd := range senders {
		w := walLast(t, snd)
		st, ok := streams[snd.name+"/"+w.Stream]
		if !ok {
			t.Fatalf("%s has no record of %s's stream %s", receiver.name, snd.name, w.Stream)
		}
		if st.HWM != w.Last || st.Merged+st.DeadLettered != w.Last {
			t.Fatalf("%s applied %d merges with hwm %d for %s's %d distinct entries", receiver.name, st.Merged, st.HWM, snd.name, w.Last)
		}
	}
}

// TestReceiverKilledMidStream SIGKILLs the receiver while batches flow,
// restarts it, and checks convergence with every entry applied once.
func TestReceiverKilledMidStream(t *testing.T) {
	s := seed(t)
	r := newRand(s)
	m := newMesh(t, s, false, "a", "b")
	m.start()
	a, b := m.nodes["a"], m.nodes["b"]
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := a.client()
			for i := 0; ctx.Err() == nil; i++ {
				c.Put(ctx, fmt.Sprintf("k/%d/%d", w, i%500), []byte(fmt.Sprint(i)))
			}
		}(w)
	}
	for round := 0; round < 3; round++ {
		time.Sleep(time.Duration(200+r.IntN(400)) * time.Millisecond)
		b.kill()
		time.Sleep(time.Duration(100+r.IntN(300)) * time.Millisecond)
		b.startReady()
	}
	cancel()
	wg.Wait()
	m.converge(60 * time.Second)
	checkAppliedOnce(t, b, a)
}

// TestLostAcksThroughProxy loses answers after the receiver applied the
// batch: the sender resends, the receiver absorbs the duplicates, and the
// state is exact.
func TestLostAcksThroughProxy(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, true, "a", "b")
	px := m.proxies["a->b"]
	m.start()
	// The faults start once the link has proven its secret and shipped:
	// lost answers to the proof only delay the link (the sender backs
	// off), and a workload that finishes meanwhile ships in a handful of
	// batches, too few for the faults to touch.
	a, b := m.nodes["a"], m.nodes["b"]
	if _, err := a.client().Put(bg(), "lost-acks/ready", []byte("1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		_, err := b.client().Get(bg(), "lost-acks/ready")
		return err == nil, fmt.Sprintf("b has not received a's first write: %v", err)
	})
	px.setLoseAck(0.3)
	px.setDup(0.1)
	writes := workload(t, m, s, 2000, 200, true)
	px.setLoseAck(0)
	px.setDup(0)
	m.converge(60 * time.Second)
	checkHighestStampWins(t, m.nodes["b"], writes)
	checkAppliedOnce(t, m.nodes["b"], m.nodes["a"])
	r := peersReport(t, m.nodes["b"])
	if px.lostAcks.Load() == 0 || r.Incoming["a"].Duplicates == 0 {
		t.Fatalf("no lost acks (%d) or no duplicates counted (%+v): the faults did not happen", px.lostAcks.Load(), r.Incoming["a"])
	}
	t.Logf("proxy lost %d acks and duplicated %d batches; b absorbed %d duplicates", px.lostAcks.Load(), px.duplicated.Load(), r.Incoming["a"].Duplicates)
}

// TestSenderKilledMidBatch SIGKILLs the sender while a backlog ships through
// a slow link; restarted, it resumes from its cursor and converges.
func TestSenderKilledMidBatch(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, true, "a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	a.args = append(a.args, "--batch-max-entries", "50")
	m.start()
	px := m.proxies["a->b"]
	px.setDown(true) // build a backlog first
	writes := workload(t, &mesh{t: t, nodes: m.nodes, names: []string{"a"}}, s, 3000, 500, true)
	px.setDelay(20 * time.Millisecond)
	px.setDown(false)
	eventually(t, 30*time.Second, func() (bool, string) {
		st := streamsOf(t, b)
		for _, v := range st {
			if v.HWM > 0 {
				return true, ""
			}
		}
		return false, "nothing shipped yet"
	})
	a.kill()
	px.setDelay(0)
	a.startReady()
	m.converge(60 * time.Second)
	checkHighestStampWins(t, b, writes)
	checkAppliedOnce(t, b, a)
	links := peersReport(t, a).Links
	if len(links) != 1 || links[0].Acked != walLast(t, a).Last {
		t.Fatalf("links after restart: %+v", links)
	}
}

// TestBadReplicateRequestsOverSockets: refused batches apply nothing and the
// node keeps serving.
func TestBadReplicateRequestsOverSockets(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, false, "a", "b")
	m.start()
	a := m.nodes["a"]
	before, _ := digestOf(a)
	for _, hdr := range [][]string{
		{"X-Replicator-Origin", "b", "Authorization", "Bearer wrong"},
		{"X-Replicator-Origin", "c", "Authorization", "Bearer secret-ab"},
		{"X-Replicator-Origin", "b"},
	} {
		req, _ := http.NewRequest("POST", a.url+"/v1/replicate", strings.NewReader("\x80"))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 && resp.StatusCode != 403 {
			t.Fatalf("%v: %d", hdr, resp.StatusCode)
		}
	}
	after, _ := digestOf(a)
	if !reflect.DeepEqual(after, before) {
		t.Fatalf("state changed: %+v -> %+v", before, after)
	}
	// the shared secret shows nowhere an operator looks
	for _, path := range []string{"/admin/peers", "/admin/wal", "/admin/origin", "/metrics"} {
		var body []byte
		a.client().Do(bg(), http.MethodGet, path, nil, nil, &body)
		if strings.Contains(string(body), "secret-ab") {
			t.Fatalf("%s shows the peer secret", path)
		}
	}
	if logb, _ := os.ReadFile(a.log); strings.Contains(string(logb), "secret-ab") {
		t.Fatal("the log shows the peer secret")
	}
	if _, err := a.client().Put(bg(), "still", []byte("serving")); err != nil {
		t.Fatal(err)
	}
}

// TestDemo runs the README's first command: two clusters converge, and the
// batch whose ack was lost is absorbed as duplicates at b.
func TestDemo(t *testing.T) {
	out, err := exec.Command(binPath, "demo").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "EQUAL") || !strings.Contains(string(out), `GET at b`) {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "cluster b: 2000 local writes") && !regexp.MustCompile(`cluster b: .* [1-9][0-9]* duplicates absorbed`).Match(out) {
		t.Fatalf("the lost ack was not absorbed as duplicates:\n%s", out)
	}
}

// TestDemoKeep: `demo --keep` leaves both clusters up, prints where their
// dashboards are (and they answer), and stops cleanly on Ctrl-C.
func TestDemoKeep(t *testing.T) {
	cmd := exec.Command(binPath, "demo", "--keep")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var seen strings.Builder
	var urls []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		seen.WriteString(sc.Text() + "\n")
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "dashboards:"); ok {
			urls = strings.Fields(rest)
			break
		}
	}
	if len(urls) != 2 {
		t.Fatalf("demo --keep printed no dashboard URLs:\n%s", seen.String())
	}
	for _, u := range urls {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "<title>replicator</title>") {
			t.Fatalf("%s: %d %.200s", u, resp.StatusCode, body)
		}
	}
	go io.Copy(io.Discard, stdout)
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("demo --keep after Ctrl-C: %v", err)
	}
}

// TestBenchReportsFloor: `replicator bench` measures this machine's floor in
// the same run (two synced commits and a round trip) and gives every lag
// figure as a multiple of it, with the lag split by stage.
func TestBenchReportsFloor(t *testing.T) {
	out, err := exec.Command(binPath, "bench", "--scenarios", "steady,puts", "--rates", "300", "--steady-for", "2s", "--put-clients", "8", "--json").Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var rep struct {
		Floor struct {
			Commit float64 `json:"synced_commit_ms"`
			Trip   float64 `json:"round_trip_ms"`
			MS     float64 `json:"floor_ms"`
		} `json:"floor"`
		Results []struct {
			Scenario string                `json:"scenario"`
			P50      float64               `json:"lag_p50_ms"`
			P99      float64               `json:"lag_p99_ms"`
			P50x     float64               `json:"lag_p50_x_floor"`
			P99x     float64               `json:"lag_p99_x_floor"`
			Stages   map[string][2]float64 `json:"lag_stages_p50_p99_ms"`
			CPU      map[string]float64    `json:"cpu_seconds_per_million"`
			HTTP     float64               `json:"http_floor_cpu_us"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f := rep.Floor
	if f.Commit <= 0 || f.Trip <= 0 || f.MS != 2*f.Commit+f.Trip {
		t.Fatalf("floor %+v: want 2 x commit + round trip, both measured", f)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("results: %s", out)
	}
	// puts: the server CPU per write at a, beside net/http's own share of
	// it measured under the same load.
	if p := rep.Results[1]; p.CPU["a"] <= 0 || p.HTTP <= 0 || p.HTTP >= p.CPU["a"] {
		t.Fatalf("%s: CPU per write %v, net/http alone %.1f us", p.Scenario, p.CPU, p.HTTP)
	}
	r := rep.Results[0]
	if r.P50 <= 0 || r.P50x != r.P50/f.MS || r.P99x != r.P99/f.MS {
		t.Fatalf("%s: lag %.3f/%.3f ms, as multiples %.3f/%.3f of a %.3f ms floor", r.Scenario, r.P50, r.P99, r.P50x, r.P99x, f.MS)
	}
	for _, stage := range []string{"ship", "wire", "apply"} {
		if _, ok := r.Stages[stage]; !ok {
			t.Fatalf("no %s stage: %s", stage, out)
		}
	}
}

// TestBenchPeerDelay: --peer-delay puts the clusters' replication traffic
// through a proxy that holds it, so every batch's wire stage is at least
// the delay (the proxy never delivers earlier; both ends share one clock).
func TestBenchPeerDelay(t *testing.T) {
	out, err := exec.Command(binPath, "bench", "--scenarios", "steady", "--rates", "200", "--steady-for", "1s", "--peer-delay", "15ms", "--json").Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var rep struct {
		Results []struct {
			Stages map[string][2]float64 `json:"lag_stages_p50_p99_ms"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Results) != 1 {
		t.Fatalf("%v\n%s", err, out)
	}
	if w := rep.Results[0].Stages["wire"]; w[0] < 15 {
		t.Fatalf("wire stage p50 %.2f ms through a 15 ms delay", w[0])
	}
	if err := exec.Command(binPath, "bench", "--addr", "http://127.0.0.1:1", "--peer-addr", "http://127.0.0.1:2", "--peer-delay", "1ms").Run(); err == nil {
		t.Fatal("--peer-delay with --addr was accepted")
	}
}
