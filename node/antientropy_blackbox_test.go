package node_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/wire"
)

var (
	aeKeys      = flag.Int("ae-keys", 4000, "TestDiffFindsAndRepairsDivergence: keys at both clusters (the issue's figure: 2000000)")
	aeDivergent = flag.Int("ae-divergent", 40, "TestDiffFindsAndRepairsDivergence: of them, made divergent beneath replication (the issue's: 1000)")
)

// TestDiffFindsAndRepairsDivergence: two paired clusters hold the same keys
// (-ae-keys); then some (-ae-divergent) are made divergent beneath
// replication, by the test-only repair command with no peer (no outbound
// entry): half written again at a, a quarter deleted at a, a quarter
// written again at b, while both clusters keep taking replicated writes.
// A comparison reports exactly those keys, with who lacks each, and none of
// the writes in flight; a repair of each side applies exactly what it
// lacked, and the digests are then equal.
func TestDiffFindsAndRepairsDivergence(t *testing.T) {
	n, d := *aeKeys, *aeDivergent
	if d < 4 || d > n {
		t.Fatalf("-ae-divergent %d of -ae-keys %d", d, n)
	}
	m := nodetest.NewMesh(t, hlc.SystemClock{}, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	ctx := context.Background()
	key := func(i int) string { return fmt.Sprintf("key-%09d", i) }
	t0 := time.Now()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, 8)
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first := int(next.Add(1000)) - 1000
				if first >= n {
					return
				}
				var ops []api.BatchOp
				for i := first; i < min(first+1000, n); i++ {
					ops = append(ops, api.BatchOp{Key: key(i), Value: []byte("v")})
				}
				if _, err := a.Batch(ctx, ops); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	m.Converged(time.Duration(10+n/20000) * time.Second)
	t.Logf("%d keys at both clusters in %.1fs", n, time.Since(t0).Seconds())

	// The divergent keys, spread over the key space.
	pick := func(j int) string { return key(j * (n / d)) }
	var aWrites, aDeletes, bWrites []string
	for j := 0; j < d; j++ {
		switch {
		case j < d/2:
			aWrites = append(aWrites, pick(j))
		case j < d/2+d/4:
			aDeletes = append(aDeletes, pick(j))
		default:
			bWrites = append(bWrites, pick(j))
		}
	}
	a = diverge(t, m, "a", aWrites, []byte("only at a"), false)
	a = diverge(t, m, "a", aDeletes, nil, true)
	b = diverge(t, m, "b", bWrites, []byte("only at b"), false)

	// Both clusters keep taking writes, replicated as usual, meanwhile.
	var (
		stop    atomic.Bool
		written atomic.Int64
	)
	for _, nd := range []*node.Node{a, b} {
		wg.Add(1)
		go func(nd *node.Node) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if _, err := nd.Put(ctx, fmt.Sprintf("live-%s-%d", nd.ClusterID(), i), []byte("x")); err == nil {
					written.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		}(nd)
	}
	rep, err := adminOf(a).Diff(ctx, "b", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a's comparison: %d leaves differing, %d keys compared, %d candidates, %d in flight, %d divergent, %d bytes, %.2fs",
		rep.LeavesDiffering, rep.Compared, rep.Candidates, rep.InFlight, len(rep.Divergent), rep.Bytes, rep.Seconds)
	want := map[string]client.Lacks{}
	for _, k := range append(append([]string(nil), aWrites...), aDeletes...) {
		want[k] = client.LacksPeer
	}
	for _, k := range bWrites {
		want[k] = client.LacksLocal
	}
	checkDivergent(t, "a's comparison", rep, want)
	if rep.Bytes == 0 || rep.Equal {
		t.Fatalf("report: %+v", rep)
	}

	// Each side repairs what it lacks.
	rb, err := adminOf(b).Diff(ctx, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	if rb.Repaired != len(aWrites)+len(aDeletes) {
		t.Fatalf("b repaired %d versions, want the %d it lacked", rb.Repaired, len(aWrites)+len(aDeletes))
	}
	ra, err := adminOf(a).Diff(ctx, "b", true)
	if err != nil {
		t.Fatal(err)
	}
	if ra.Repaired != len(bWrites) {
		t.Fatalf("a repaired %d versions, want the %d it lacked", ra.Repaired, len(bWrites))
	}
	stop.Store(true)
	wg.Wait()
	if written.Load() == 0 {
		t.Fatal("no write was taken during the comparisons")
	}
	m.Converged(20 * time.Second)
	after, err := adminOf(a).Diff(ctx, "b", false)
	if err != nil || !after.Equal || len(after.Divergent) != 0 {
		t.Fatalf("after repair: %+v %v", after, err)
	}
	if r, err := b.Get(aWrites[0]); err != nil || string(r.Value) != "only at a" {
		t.Fatalf("b's %s after repair: %q %v", aWrites[0], r.Value, err)
	}
	if _, err := b.Get(aDeletes[0]); err == nil {
		t.Fatal("b still holds a key a deleted beneath replication")
	}
}

// TestTreeEndpointRefusesBadRequests: the peer endpoint answers only a
// configured peer with its secret, and refuses a body that does not decode,
// with a JSON error, and keeps serving.
func TestTreeEndpointRefusesBadRequests(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, nil, "a", "b")
	url := "http://" + m.Addrs["a"] + wire.PathTree
	good, _ := wire.EncodeTree(&wire.TreeRequest{Protocol: 1, Op: wire.TreeSums, Nodes: []int{0}})
	for _, c := range []struct {
		name   string
		body   []byte
		hdr    []string
		status int
	}{
		{"no origin", good, nil, http.StatusUnauthorized},
		{"wrong secret", good, []string{wire.HeaderOrigin, "b", "Authorization", "Bearer wrong"}, http.StatusUnauthorized},
		{"unknown peer", good, []string{wire.HeaderOrigin, "z", "Authorization", "Bearer s"}, http.StatusUnauthorized},
		{"malformed", []byte{0xc1, 0x00}, []string{wire.HeaderOrigin, "b", "Authorization", "Bearer s"}, http.StatusBadRequest},
		{"bad op", mustTree(t, &wire.TreeRequest{Protocol: 1, Op: 9}), []string{wire.HeaderOrigin, "b", "Authorization", "Bearer s"}, http.StatusBadRequest},
		{"other protocol", mustTree(t, &wire.TreeRequest{Protocol: 99, Op: wire.TreeSums, Nodes: []int{0}}), []string{wire.HeaderOrigin, "b", "Authorization", "Bearer s"}, http.StatusServiceUnavailable},
		{"good", good, []string{wire.HeaderOrigin, "b", "Authorization", "Bearer s"}, http.StatusOK},
	} {
		resp, body := nodetest.Do(t, http.MethodPost, url, bytes.NewReader(c.body), c.hdr...)
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, body, c.status)
			continue
		}
		if c.status != http.StatusOK && !bytes.Contains(body, []byte(`"code"`)) {
			t.Errorf("%s: not a JSON error: %s", c.name, body)
		}
	}
}

func mustTree(t *testing.T, r *wire.TreeRequest) []byte {
	t.Helper()
	b, err := wire.EncodeTree(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiffOfAFilteredLink: a link that carries only shared/ keys compares
// only those: what its filter holds back is not divergence; a divergence
// under shared/ is found and repaired.
func TestDiffOfAFilteredLink(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	ctx := context.Background()
	if _, err := setFilter(a, "b", entry.Filter{Include: []string{"shared/"}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		for _, k := range []string{"shared/", "private/"} {
			if _, err := a.Put(ctx, fmt.Sprintf("%s%d", k, i), []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.Settle()
	rep, err := adminOf(a).Diff(ctx, "b", false)
	if err != nil || !rep.Equal || len(rep.Divergent) != 0 {
		t.Fatalf("a filtered link that carried everything it should: %+v %v", rep, err)
	}
	a = diverge(t, m, "a", []string{"shared/7", "private/7"}, []byte("beneath"), false)
	rep, err = adminOf(b).Diff(ctx, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	checkDivergent(t, "b's comparison", rep, map[string]client.Lacks{"shared/7": client.LacksLocal})
	if rep.Repaired != 1 {
		t.Fatalf("b repaired %d, want 1", rep.Repaired)
	}
	if _, err := b.Get("private/7"); err == nil {
		t.Fatal("a repair pulled a key the link's filter holds back")
	}
}

// TestBackgroundPassRepairs: with a background pass every second and
// automatic repair, a cluster pulls by itself what it lacks, and its link
// status and metrics say what the last pass found.
func TestBackgroundPassRepairs(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) {
		o.AntiEntropyInterval = time.Second
		o.AntiEntropyRepair = true
	}, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	ctx := context.Background()
	if _, err := a.Put(ctx, "shared", []byte("v")); err != nil {
		t.Fatal(err)
	}
	m.Settle()
	a = diverge(t, m, "a", []string{"x1", "x2", "x3"}, []byte("beneath"), false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var st *client.AntiEntropyStatus
		for _, l := range b.PeerStatus() {
			if l.Peer == "a" {
				st = l.AntiEntropy
			}
		}
		_, err := b.Get("x3")
		if err == nil && st != nil && st.Repaired == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b did not repair by itself: %v, status %+v", err, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// a's next pass finds nothing left to differ.
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, body := nodetest.Do(t, http.MethodGet, a.URL()+"/metrics", nil)
		if bytes.Contains(body, []byte(`replicator_divergent_keys{cluster="a",peer="b"} 0`)) &&
			bytes.Contains(body, []byte(`replicator_antientropy_last_pass_timestamp_seconds{cluster="a",peer="b"}`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's metrics never showed a clean pass:\n%s", nodetest.GrepLines(body, "antientropy", "divergent"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRepairRefusesWhatInboundRefuses: a repair does not pull what the
// inbound path would refuse from the peer: a value or a key past this
// node's limits (the peer runs with larger ones), a stamp further ahead of
// its clock than the max offset. Each is counted refused; the rest is
// pulled.
func TestRepairRefusesWhatInboundRefuses(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) {
		o.AntiEntropyInterval = -1
		if o.ClusterID == "b" {
			o.MaxKeyBytes, o.MaxValueBytes = 100, 1024
		}
	}, "a", "b")
	b := m.Nodes["b"]
	ctx := context.Background()
	long := strings.Repeat("k", 200)
	m.Restart("a", func(dir string) {
		now := time.Now().UnixNano()
		nodetest.Diverge(t, dir, "a", now, []string{"big", long}, bytes.Repeat([]byte("v"), 2048), false)
		nodetest.Diverge(t, dir, "a", now+1, []string{"small", long}, []byte("v"), false)
		nodetest.Diverge(t, dir, "a", now+int64(time.Hour), []string{"ahead"}, []byte("v"), false)
	})
	rep, err := adminOf(b).Diff(ctx, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 4 || rep.Refused != 3 || rep.Repaired != 1 {
		t.Fatalf("%d divergent, %d refused, %d repaired; want 4, 3, 1: %+v", len(rep.Divergent), rep.Refused, rep.Repaired, rep.Divergent)
	}
	if _, err := b.Get("small"); err != nil {
		t.Fatalf("the version within limits was not pulled: %v", err)
	}
	for _, k := range []string{"big", "ahead"} {
		if _, err := b.Get(k); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("%s: a refused version was pulled: %v", k, err)
		}
	}
}

// TestAntiEntropyOverAThirdClustersFilter (issue 45, case 2): c's link to b
// keeps c-only/ from b, and c's writes there reach a. A comparison between
// a and b found those keys divergent on every pass, and a repair at b
// copied them across c's filter, where they then went stale (c's next
// write reached a, not b). Now the comparison lists them apart (a third
// cluster's versions), b's repair takes nothing of them, and b never holds
// them.
func TestAntiEntropyOverAThirdClustersFilter(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, nil, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	if _, err := setFilter(c, "b", entry.Filter{Exclude: []string{"c-only/"}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"c-only/1", "c-only/2", "shared/1"} {
		if _, err := c.Put(ctx, k, []byte("v1")); err != nil {
			t.Fatal(err)
		}
	}
	m.Settle()
	rep, err := adminOf(a).Diff(ctx, "b", false)
	if err != nil {
		t.Fatal(err)
	}
	checkDivergent(t, "a's comparison with b", rep, map[string]client.Lacks{})
	var third []string
	for _, d := range rep.ThirdOrigin {
		third = append(third, d.Key+"="+string(d.Lacks))
	}
	sort.Strings(third)
	if fmt.Sprint(third) != "[c-only/1=third_origin c-only/2=third_origin]" {
		t.Fatalf("a's comparison with b lists apart %v, want c's two keys", third)
	}
	back, err := adminOf(b).Diff(ctx, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	if back.Repaired != 0 || len(back.Divergent) != 0 || len(back.ThirdOrigin) != 2 {
		t.Fatalf("b's repair from a: repaired %d, divergent %+v, third origin %d", back.Repaired, back.Divergent, len(back.ThirdOrigin))
	}
	if _, err := c.Put(ctx, "c-only/1", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	m.Settle()
	if r, err := a.Get("c-only/1"); err != nil || string(r.Value) != "v2" {
		t.Fatalf("a's c-only/1: %q %v", r.Value, err)
	}
	if _, err := b.Get("c-only/1"); err == nil {
		t.Fatal("b holds c-only/1, which c's filter keeps from it: a repair copied it across")
	}
}

// TestRelaysKeepToTheOriginsFilter (issue 45, case 2's other door): c's
// link to b keeps c-only/ home; a holds c's writes there. A re-seed of b by
// a relays every key a holds, and used to hand b c's c-only/ keys, which
// then went stale (c's later writes never reach b). c now tells b its
// filter toward it in its heartbeats, b's log records it, and b takes no
// relay of c's writes that filter keeps home (counted as withheld).
func TestRelaysKeepToTheOriginsFilter(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, nil, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	if _, err := setFilter(c, "b", entry.Filter{Exclude: []string{"c-only/"}}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		f := linkOf(t, b, "c").PeerFilter
		return f != nil && f.String() == "-c-only/", fmt.Sprintf("b records c's filter toward it as %v", f)
	})
	for _, k := range []string{"c-only/1", "c-only/2", "shared/1"} {
		if _, err := c.Put(ctx, k, []byte("v1")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Put(ctx, "c-only/by-a", []byte("a's")); err != nil { // a's own write under c's prefix crosses
		t.Fatal(err)
	}
	m.Settle()
	if err := a.ReseedPeer("b"); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		l := nodetest.Link(t, a, "b")
		return l.Reseed.Runs == 1 && !l.Reseed.Running, fmt.Sprintf("%+v", l.Reseed)
	})
	m.Settle()
	for _, k := range []string{"c-only/1", "c-only/2"} {
		if _, err := b.Get(k); err == nil {
			t.Fatalf("b holds %s: a's re-seed relayed a write c's filter keeps from b", k)
		}
	}
	for _, k := range []string{"shared/1", "c-only/by-a"} {
		if _, err := b.Get(k); err != nil {
			t.Fatalf("b lacks %s after a's re-seed: %v", k, err)
		}
	}
	if got := b.PeersReport().Incoming["a"].Withheld; got != 2 {
		t.Fatalf("b withheld %d relayed entries of a's re-seed, want 2", got)
	}
}

// TestWipedClusterTakesNoRelayBeforeTheOriginsFilter: c's link to b keeps
// c-only/ home. b is wiped while c cannot reach it, so b's log no longer
// records c's filter when a's re-seed arrives, relaying c's writes. b used
// to take them all (c-only/ included: found by a robustness run, seed 1),
// and kept c's keys that c's filter keeps from it for good. Now b takes no
// relay of a cluster whose filter toward it it has not heard (nor a mark
// of that cluster's stream): c's writes reach b from c, once c reaches it,
// kept to c's filter.
func TestWipedClusterTakesNoRelayBeforeTheOriginsFilter(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) { o.AntiEntropyInterval = -1 }, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := setFilter(c, "b", entry.Filter{Exclude: []string{"c-only/"}}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		f := linkOf(t, b, "c").PeerFilter
		return f != nil && f.String() == "-c-only/", fmt.Sprintf("b records c's filter toward it as %v", f)
	})
	must(c.Put(ctx, "c-only/1", []byte("v1")))
	must(c.Put(ctx, "shared/1", []byte("v1")))
	must(a.Put(ctx, "shared/a", []byte("a")))
	m.Settle()
	m.Cut("c", "b", true)
	old := b.OriginReport().Stream
	m.Restart("b", func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	})
	b = m.Nodes["b"]
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		if b.OriginReport().Stream == old {
			return false, "b did not notice its wipe"
		}
		l := nodetest.Link(t, a, "b")
		return l.Reseed.Runs >= 1 && !l.Reseed.Running, fmt.Sprintf("a's re-seed of b: %+v", l.Reseed)
	})
	m.Settle()
	if _, err := b.Get("shared/a"); err != nil {
		t.Fatalf("b lacks a's own write after a's re-seed: %v", err)
	}
	if _, err := b.Get("c-only/1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("b holds c-only/1 (%v): a's re-seed relayed a write of c before b heard c's filter toward it", err)
	}
	if f := linkOf(t, b, "c").PeerFilter; f != nil {
		t.Fatalf("b records c's filter as %v while c cannot reach it", f)
	}
	if got := b.PeersReport().Incoming["a"].WithheldUnheard; got != 2 {
		t.Fatalf("b withheld %d of a's relays of c's writes while c's filter was unheard, want 2", got)
	}
	m.Cut("c", "b", false)
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		if r := b.PeersReport().Rejoin; len(r.Phases) > 0 || len(r.Requests) > 0 {
			return false, fmt.Sprintf("b's rejoin: %+v", r)
		}
		_, err := b.Get("shared/1")
		return err == nil, fmt.Sprintf("b's shared/1, once c reaches it: %v", err)
	})
	m.Settle()
	if _, err := b.Get("c-only/1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("b holds c-only/1 (%v), which c's filter keeps from it", err)
	}
}

// diverge writes (or deletes) keys at cluster name's node beneath
// replication, stamped now, with the node stopped: its peers never hear of
// them. It returns the node started again.
func diverge(t *testing.T, m *nodetest.Mesh, name string, keys []string, value []byte, del bool) *node.Node {
	t.Helper()
	m.Restart(name, func(dir string) {
		nodetest.Diverge(t, dir, name, time.Now().UnixNano(), keys, value, del)
	})
	return m.Nodes[name]
}
