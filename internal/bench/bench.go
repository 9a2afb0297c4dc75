// Package bench runs `replicator bench`: named scenarios against two
// clusters (started as child processes, or given by address), each measured
// beside a baseline of raw synced Pebble ingest of the same entries in the
// same run.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/internal/loopback"

	"github.com/cockroachdb/pebble/v2"
)

// Config is what the bench runs.
type Config struct {
	Scenarios   []string      // baseline, oneway, bidirectional, steady, puts, catchup
	Writes      int           // writes per scenario (oneway, bidirectional)
	ValueSize   int           // bytes per value
	Keys        int           // key space of bidirectional (overlapping keys); 0 = Writes
	Concurrency int           // concurrent writers
	Mode        string        // bulk (default), batch or put
	BatchOps    int           // writes per request in batch mode
	Rates       []int         // steady: writes/s, each run in turn
	SteadyFor   time.Duration // steady: how long each rate runs
	CatchupN    int           // catchup: entries accumulated while the peer is paused
	PutClients  int           // puts: concurrent single-PUT clients (default 64)
	ServeArgs   []string      // extra `replicator serve` flags (batch bounds, ...)
	// PeerDelay holds the clusters' replication traffic for this long in
	// each direction (a proxy between them), for the round trip of two
	// regions; 0: none.
	PeerDelay time.Duration
	AddrA     string // target running clusters instead of starting them
	AddrB     string
	// Nodes are the cluster sizes the scenarios run with, in turn, each
	// pair started afresh (default 1: a node alone per cluster). With a
	// cluster of several, writes go to its leader.
	Nodes  []int
	Binary string // the replicator binary (default: this process's)
	Log    io.Writer
}

// Result is one scenario's figures.
type Result struct {
	Scenario      string             `json:"scenario"`
	Writes        int                `json:"writes"`
	Seconds       float64            `json:"seconds"`
	WritesPerSec  float64            `json:"writes_per_sec"`
	MBPerSec      float64            `json:"mb_per_sec"`
	LagP50MS      float64            `json:"lag_p50_ms,omitempty"`
	LagP99MS      float64            `json:"lag_p99_ms,omitempty"`
	LagMaxMS      float64            `json:"lag_max_ms,omitempty"`
	CPUSecPerM    map[string]float64 `json:"cpu_seconds_per_million,omitempty"`
	PeakRSSMiB    map[string]float64 `json:"peak_rss_mib,omitempty"`
	RatioBaseline float64            `json:"ratio_to_baseline,omitempty"`
	// LagP50Floor and LagP99Floor are the lag figures as multiples of the
	// run's floor: how close this machine's replication is to its own limit.
	LagP50Floor float64 `json:"lag_p50_x_floor,omitempty"`
	LagP99Floor float64 `json:"lag_p99_x_floor,omitempty"`
	// BatchesApplied counts the replication batches each node applied
	// during the scenario (writes / batches is the batching under load).
	BatchesApplied map[string]float64 `json:"batches_applied,omitempty"`
	// Stages is the lag's p50 and p99 (ms) by stage: ship (the sender's
	// commit to send), wire, apply (received to synced apply).
	Stages map[string][2]float64 `json:"lag_stages_p50_p99_ms,omitempty"`
	// HTTPFloorUS (puts) is the CPU per request of a bare net/http server
	// under the same load: the part of the server CPU per write that
	// serving HTTP/1.1 with net/http costs whatever the node does.
	HTTPFloorUS float64 `json:"http_floor_cpu_us,omitempty"`
	// Nodes is the size of each cluster of the pair; RatioSingle, for a
	// cluster of several, is its writes/s over the same scenario's with a
	// node alone per cluster, measured in the same run.
	Nodes       int     `json:"nodes"`
	RatioSingle float64 `json:"ratio_to_single_node,omitempty"`
	Note        string  `json:"note,omitempty"`
}

// Floor is the least replication lag this machine allows one write,
// measured in the same run, so that lag figures from any machine say how
// close they are to it: the write's local synced commit, the peer's synced
// apply, and one loopback round trip between them.
type Floor struct {
	// CommitMS is the median of 300 synced Pebble commits of one 100-byte
	// entry (default options, a fresh directory on the data's filesystem).
	CommitMS float64 `json:"synced_commit_ms"`
	// CommitP99MS is the p99 of the same commits: the disk's own tail,
	// which a lag p99 pays twice (the sender's fsync and the receiver's).
	CommitP99MS float64 `json:"synced_commit_p99_ms"`
	// RoundTripMS is the median of 300 loopback GET /healthz round trips to
	// a running node.
	RoundTripMS float64 `json:"round_trip_ms"`
	// MS is 2 x CommitMS + RoundTripMS.
	MS float64 `json:"floor_ms"`
	// RaftMS, for clusters of several nodes, adds each cluster's raft
	// round trip (a quorum's append): MS + 2 x RoundTripMS. The quorum's
	// fsyncs run beside the leader's, so they add no commit.
	RaftMS float64 `json:"floor_raft_ms"`
}

// Report is the whole run.
type Report struct {
	Machine string   `json:"machine"`
	Floor   *Floor   `json:"floor,omitempty"`
	Config  Config   `json:"-"`
	Results []Result `json:"results"`
}

// floorSamples is how many commits and round trips the floor's medians take.
const floorSamples = 300

// measureFloor measures the Floor: commits in a fresh Pebble under dir,
// round trips to c.
func measureFloor(dir string, c *cluster) (*Floor, error) {
	db, err := pebble.Open(filepath.Join(dir, "floor"), &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	value := bytes.Repeat([]byte("v"), 100)
	commits := make([]time.Duration, 0, floorSamples)
	for i := 0; i < floorSamples; i++ {
		b := db.NewBatch()
		b.Set([]byte(key("floor", i)), value, nil)
		t0 := time.Now()
		if err := b.Commit(pebble.Sync); err != nil {
			return nil, err
		}
		commits = append(commits, time.Since(t0))
	}
	trips := make([]time.Duration, 0, floorSamples)
	for i := 0; i < floorSamples+1; i++ {
		t0 := time.Now()
		resp, err := hc.Get(c.url + "/healthz")
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i > 0 { // the first one dials
			trips = append(trips, time.Since(t0))
		}
	}
	f := &Floor{CommitMS: medianMS(commits), RoundTripMS: medianMS(trips)}
	f.CommitP99MS = float64(commits[len(commits)*99/100].Nanoseconds()) / 1e6 // sorted by medianMS
	f.MS = 2*f.CommitMS + f.RoundTripMS
	f.RaftMS = f.MS + 2*f.RoundTripMS
	return f, nil
}

func medianMS(d []time.Duration) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)/2].Nanoseconds()) / 1e6
}

func (c *Config) defaults() {
	if len(c.Scenarios) == 0 {
		c.Scenarios = []string{"baseline", "oneway", "bidirectional", "steady", "puts", "catchup"}
	}
	if c.Writes == 0 {
		c.Writes = 200000
	}
	if c.ValueSize == 0 {
		c.ValueSize = 100
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.Mode == "" {
		c.Mode = "bulk"
	}
	if c.BatchOps == 0 {
		c.BatchOps = 100
	}
	if len(c.Rates) == 0 {
		c.Rates = []int{5000, 20000}
	}
	if len(c.Nodes) == 0 {
		c.Nodes = []int{1}
	}
	if c.SteadyFor == 0 {
		c.SteadyFor = 10 * time.Second
	}
	if c.PutClients == 0 {
		c.PutClients = 64
	}
	if c.CatchupN == 0 {
		c.CatchupN = 1000000
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// cluster is one node the bench talks to, maybe its own child.
type cluster struct {
	name, url string
	cmd       *exec.Cmd
	exited    chan struct{} // closed once cmd was waited for (a child only)
	log       string
	peakRSS   atomic.Int64
	proxy     *delayProxy // in front of its peer endpoint (PeerDelay), or nil
}

var hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}

func (c *cluster) getJSON(path string, out any) error {
	resp, err := hc.Get(c.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s%s: %d %s", c.url, path, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *cluster) post(path string, body []byte) error {
	resp, err := hc.Post(c.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s%s: %d %s", c.url, path, resp.StatusCode, b)
	}
	return nil
}

// metric reads one unlabelled series of /metrics.
// put writes one key with a single PUT; anything but 200 is an error.
func (c *cluster) put(k, value string) error {
	req, err := http.NewRequest(http.MethodPut, c.url+"/v1/kv/"+k, strings.NewReader(value))
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("put %s: %d", k, resp.StatusCode)
	}
	return nil
}

func (c *cluster) metric(name string) (float64, error) {
	m, err := c.metrics(name)
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("%s: no %s", c.url, name)
	}
	return v, nil
}

// metrics reads the named unlabelled series from one scrape; a name the
// node does not export is left out.
func (c *cluster) metrics(names ...string) (map[string]float64, error) {
	resp, err := hc.Get(c.url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && slices.Contains(names, name) {
			if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				out[name] = v
			}
		}
	}
	return out, sc.Err()
}

type walDoc struct {
	Stream string `json:"stream"`
	Last   uint64 `json:"last_index"`
}

type peersDoc struct {
	Streams []struct {
		Origin string `json:"origin"`
		Stream string `json:"stream"`
		HWM    uint64 `json:"hwm"`
	} `json:"streams"`
}

// caughtUp reports whether dst applied everything src's WAL holds.
func caughtUp(src, dst *cluster) (bool, error) {
	var w walDoc
	if err := src.getJSON("/admin/wal", &w); err != nil {
		return false, err
	}
	if w.Last == 0 {
		return true, nil
	}
	var p peersDoc
	if err := dst.getJSON("/admin/peers", &p); err != nil {
		return false, err
	}
	for _, s := range p.Streams {
		if s.Stream == w.Stream {
			return s.HWM >= w.Last, nil
		}
	}
	return false, nil
}

func waitCaughtUp(ctx context.Context, pairs ...[2]*cluster) error {
	for {
		all := true
		for _, p := range pairs {
			ok, err := caughtUp(p[0], p[1])
			if err != nil {
				return err
			}
			all = all && ok
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// errStart is a node that did not come up.
var errStart = errors.New("bench: a node did not start")

// lastLine is the last non-empty line of a log.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// start launches the two clusters as child processes: a node alone each,
// or nodes of several (raft) each, with the writes' target (the leader)
// first for each.
func start(cfg *Config, dir string, nodes int) ([]*cluster, error) {
	bin := cfg.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	type spec struct{ cluster, id, api, raft, gossip string }
	var specs []spec
	perNode := 1
	if nodes > 1 {
		perNode = 3
	}
	// Held until the proxies are up, so that none of them takes a node's.
	free, release, err := loopback.Hold(2 * nodes * perNode)
	if err != nil {
		return nil, err
	}
	defer release()
	next := func() string {
		a := free[0]
		free = free[1:]
		return a
	}
	addrs := map[string]string{} // cluster -> its first node's API address
	for _, n := range []string{"a", "b"} {
		for i := 1; i <= nodes; i++ {
			sp := spec{cluster: n, id: fmt.Sprintf("%s%d", n, i), api: next()}
			if nodes > 1 {
				sp.raft, sp.gossip = next(), next()
			}
			if i == 1 {
				addrs[n] = sp.api
			}
			specs = append(specs, sp)
		}
	}
	// What each cluster dials to reach the other: the other's address, or a
	// proxy that delays the traffic.
	via := map[string]string{"a": addrs["a"], "b": addrs["b"]}
	proxies := map[string]*delayProxy{}
	if cfg.PeerDelay > 0 {
		for _, n := range []string{"a", "b"} {
			p, err := startDelayProxy(addrs[n], cfg.PeerDelay)
			if err != nil {
				for _, p := range proxies {
					p.close()
				}
				return nil, err
			}
			proxies[n] = p
			via[n] = p.addr()
		}
	}
	release()
	var out []*cluster
	for _, sp := range specs {
		n := sp.cluster
		peer := map[string]string{"a": "b", "b": "a"}[n]
		args := []string{"serve", "--cluster-id", n, "--data", filepath.Join(dir, sp.id), "--listen", sp.api,
			"--peer", peer + "=http://" + via[peer], "--peer-secret", peer + "=bench",
			"--wal-high-water-entries", "100000000", "--wal-high-water-bytes", "1099511627776", "--wal-high-water-age", "24h",
			"--log-level", "warn"}
		if nodes > 1 {
			args = append(args, "--node-id", sp.id, "--raft-listen", sp.raft, "--gossip-bind", sp.gossip, "--gossip-profile", "local",
				"--bootstrap-expect", strconv.Itoa(nodes))
			if proxies[n] != nil && sp.api == addrs[n] {
				// Peers reach the first node through the delay; the
				// others they learn of by the answers would be direct, so
				// each node says its replicate URL is that one.
				args = append(args, "--advertise-replicate", "http://"+proxies[n].addr())
			}
			for _, o := range specs {
				if o.cluster == n && o.id != sp.id {
					args = append(args, "--join", o.gossip)
				}
			}
		}
		args = append(args, cfg.ServeArgs...)
		logf, err := os.Create(filepath.Join(dir, sp.id+".log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		name := n
		if nodes > 1 {
			name = sp.id
		}
		c := &cluster{name: name, url: "http://" + sp.api, cmd: cmd, exited: make(chan struct{}), log: logf.Name()}
		go func() { cmd.Wait(); close(c.exited) }() // the child's only waiter; ends with it
		if sp.api == addrs[n] {
			c.proxy = proxies[n]
		}
		out = append(out, c)
	}
	for _, c := range out {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var v map[string]any
			if c.getJSON("/healthz", &v) == nil {
				break
			}
			select {
			case <-c.exited:
				b, _ := os.ReadFile(c.log)
				return out, fmt.Errorf("%w: node %s exited at start (logs in %s): %s", errStart, c.name, dir, lastLine(b))
			default:
			}
			if time.Now().After(deadline) {
				return out, fmt.Errorf("%w: node %s did not start (log in %s)", errStart, c.name, dir)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if nodes == 1 {
		return out, nil
	}
	// Each cluster's leader first (named for the cluster), its followers
	// after both.
	var leaders, followers []*cluster
	for _, n := range []string{"a", "b"} {
		var lead *cluster
		deadline := time.Now().Add(30 * time.Second)
		for lead == nil {
			for _, c := range out {
				var r struct {
					State string `json:"state"`
				}
				if strings.HasPrefix(c.name, n) && c.getJSON("/admin/cluster?local=1", &r) == nil && r.State == "leader" {
					lead = c
				}
			}
			if lead == nil {
				if time.Now().After(deadline) {
					return out, fmt.Errorf("cluster %s elected no leader in 30 s (logs in %s)", n, dir)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		for _, c := range out {
			if strings.HasPrefix(c.name, n) && c != lead {
				followers = append(followers, c)
			}
		}
		lead.name = n
		leaders = append(leaders, lead)
	}
	return append(leaders, followers...), nil
}

// Run runs the scenarios, for each cluster size in turn.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	rep := &Report{Config: cfg, Machine: machine()}
	dir, err := os.MkdirTemp("", "replicator-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var baseline float64
	run := 0
	single := map[string]float64{} // scenario -> writes/s with a node alone per cluster
	for ti, nodes := range cfg.Nodes {
		if cfg.AddrA != "" && ti > 0 {
			break
		}
		tdir := filepath.Join(dir, fmt.Sprintf("nodes-%d", nodes))
		var cl []*cluster
		if cfg.AddrA != "" {
			cl = []*cluster{{name: "a", url: strings.TrimRight(cfg.AddrA, "/")}, {name: "b", url: strings.TrimRight(cfg.AddrB, "/")}}
		} else {
			fmt.Fprintf(cfg.Log, "starting two clusters of %d node(s)...\n", nodes)
			if err := os.MkdirAll(tdir, 0o755); err != nil {
				return rep, err
			}
			cl, err = start(&cfg, tdir, nodes)
			if errors.Is(err, errStart) {
				// A port chosen free was taken meanwhile: once more, afresh.
				fmt.Fprintf(cfg.Log, "%v; starting them again\n", err)
				stop(cl)
				os.RemoveAll(tdir)
				os.MkdirAll(tdir, 0o755)
				cl, err = start(&cfg, tdir, nodes)
			}
			if err != nil {
				stop(cl)
				return rep, err
			}
		}
		results, err := runTopology(ctx, &cfg, rep, tdir, cl, nodes, ti == 0, &baseline, &run)
		if cfg.AddrA == "" {
			stop(cl)
		}
		for _, r := range results {
			r.Nodes = nodes
			if nodes == 1 {
				single[r.Scenario] = r.WritesPerSec
			} else if v := single[r.Scenario]; v > 0 && r.WritesPerSec > 0 {
				r.RatioSingle = r.WritesPerSec / v
			}
			rep.Results = append(rep.Results, r)
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runTopology runs the scenarios against one started pair.
func runTopology(ctx context.Context, cfg *Config, rep *Report, dir string, cl []*cluster, nodes int, first bool, baseline *float64, run *int) ([]Result, error) {
	// Sample each node's RSS for the peaks.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	for _, c := range cl {
		if c.cmd != nil {
			continue // a child's peak is read from /proc (VmHWM), not sampled through /metrics
		}
		go func(c *cluster) {
			// Exits with the run.
			for sctx.Err() == nil {
				if v, err := c.metric("process_resident_memory_bytes"); err == nil && int64(v) > c.peakRSS.Load() {
					c.peakRSS.Store(int64(v))
				}
				time.Sleep(100 * time.Millisecond)
			}
		}(c)
	}
	if rep.Floor == nil {
		var err error
		if rep.Floor, err = measureFloor(dir, cl[0]); err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
	}
	floorMS := rep.Floor.MS
	if nodes > 1 {
		floorMS = rep.Floor.RaftMS
	}
	var out []Result
	for _, sc := range cfg.Scenarios {
		fmt.Fprintf(cfg.Log, "running %s (%d node(s) a cluster)...\n", sc, nodes)
		var results []Result
		var err error
		switch sc {
		case "baseline":
			if !first {
				continue
			}
			r, err := runBaseline(cfg, dir)
			if err != nil {
				return out, err
			}
			*baseline = r.WritesPerSec
			results = []Result{r}
		case "oneway", "bidirectional", "steady", "puts", "catchup":
			*run++
			results, err = runScenario(ctx, cfg, sc, *run, cl)
			if err != nil {
				return out, fmt.Errorf("%s: %w", sc, err)
			}
		default:
			return out, fmt.Errorf("unknown scenario %q (baseline, oneway, bidirectional, steady, puts, catchup)", sc)
		}
		for _, r := range results {
			if *baseline > 0 && r.Scenario != "baseline" && r.WritesPerSec > 0 {
				r.RatioBaseline = r.WritesPerSec / *baseline
			}
			if r.LagMaxMS > 0 && floorMS > 0 {
				r.LagP50Floor, r.LagP99Floor = r.LagP50MS/floorMS, r.LagP99MS/floorMS
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func stop(cl []*cluster) {
	for _, c := range cl {
		if c != nil && c.cmd != nil && c.cmd.Process != nil && c.exited != nil {
			c.cmd.Process.Signal(os.Interrupt)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				c.cmd.Process.Kill()
				<-c.exited
			}
		}
		if c != nil && c.proxy != nil {
			c.proxy.close()
		}
	}
}

// runBaseline ingests the same entries into a bare Pebble in synced batches
// of 100.
func runBaseline(cfg *Config, dir string) (Result, error) {
	db, err := pebble.Open(filepath.Join(dir, "baseline"), &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		return Result{}, err
	}
	defer db.Close()
	value := bytes.Repeat([]byte("v"), cfg.ValueSize)
	start := time.Now()
	for i := 0; i < cfg.Writes; i += 100 {
		b := db.NewBatch()
		for j := i; j < min(i+100, cfg.Writes); j++ {
			b.Set([]byte(fmt.Sprintf("d%s", key("base", j))), value, nil)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return Result{}, err
		}
	}
	el := time.Since(start)
	return Result{Scenario: "baseline", Writes: cfg.Writes, Seconds: el.Seconds(),
		WritesPerSec: float64(cfg.Writes) / el.Seconds(), MBPerSec: float64(cfg.Writes*cfg.ValueSize) / el.Seconds() / 1e6,
		Note: "raw Pebble, synced batches of 100, same keys and values"}, nil
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)              {}
func (quietPebble) Errorf(string, ...any)             {}
func (quietPebble) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func key(prefix string, i int) string { return fmt.Sprintf("%s/%012d", prefix, i) }

// appendKey appends key(prefix, i) as a JSON string.
func appendKey(b []byte, prefix string, i int64) []byte {
	q := strconv.AppendQuote(b, prefix)
	q = q[:len(q)-1] // reopen the string
	q = append(q, '/')
	var d [20]byte
	ds := strconv.AppendInt(d[:0], i, 10)
	for range 12 - len(ds) {
		q = append(q, '0')
	}
	q = append(q, ds...)
	return append(q, '"')
}

// write issues n writes at c with keys prefix/<i> (i from first), in the
// configured mode and concurrency.
func write(ctx context.Context, cfg *Config, c *cluster, prefix string, first, n int) error {
	value := strings.Repeat("v", cfg.ValueSize)
	// The driver shares the machine with the nodes: its bodies are built
	// with appends (the value quoted once), not fmt, which was a third of
	// its CPU and the CPU a saturated three-node run lacks.
	qvalue := strconv.Quote(value)
	var next atomic.Int64
	next.Store(int64(first))
	end := int64(first + n)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	chunk := int64(cfg.BatchOps)
	if cfg.Mode == "bulk" {
		chunk = int64(max(5000, n/cfg.Concurrency/4))
	}
	if cfg.Mode == "put" {
		chunk = 1
	}
	for w := 0; w < cfg.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf bytes.Buffer
			for ctx.Err() == nil {
				lo := next.Add(chunk) - chunk
				if lo >= end {
					return
				}
				hi := min(lo+chunk, end)
				buf.Reset()
				var err error
				switch cfg.Mode {
				case "put":
					var req *http.Request
					req, err = http.NewRequestWithContext(ctx, http.MethodPut, c.url+"/v1/kv/"+key(prefix, int(lo)), strings.NewReader(value))
					if err == nil {
						var resp *http.Response
						if resp, err = hc.Do(req); err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != 200 {
								err = fmt.Errorf("put: %d", resp.StatusCode)
							}
						}
					}
				case "batch":
					b := append(buf.AvailableBuffer(), `{"ops":[`...)
					for i := lo; i < hi; i++ {
						if i > lo {
							b = append(b, ',')
						}
						b = append(b, `{"op":"set","key":`...)
						b = appendKey(b, prefix, i)
						b = append(b, `,"value":`...)
						b = append(b, qvalue...)
						b = append(b, '}')
					}
					b = append(b, `]}`...)
					buf.Write(b)
					err = c.post("/v1/batch", buf.Bytes())
				default:
					b := buf.AvailableBuffer()
					for i := lo; i < hi; i++ {
						b = append(b, `{"key":`...)
						b = appendKey(b, prefix, i)
						b = append(b, `,"value":`...)
						b = append(b, qvalue...)
						b = append(b, "}\n"...)
					}
					buf.Write(b)
					err = c.post("/v1/bulk", buf.Bytes())
				}
				if err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// mark is one node's CPU seconds and batches applied at one moment.
type mark struct {
	cpu, batches float64
	ok           bool
}

// cpuMark is every node's mark, by name.
type cpuMark map[string]mark

func cpuNow(cl []*cluster) cpuMark {
	m := cpuMark{}
	for _, c := range cl {
		v, err := c.metrics("process_cpu_seconds_total", "replicator_apply_seconds_count")
		if err == nil {
			m[c.name] = mark{cpu: v["process_cpu_seconds_total"], batches: v["replicator_apply_seconds_count"], ok: true}
		}
	}
	return m
}

func (r *Result) finish(cl []*cluster, before cpuMark, writes int, el time.Duration, valueSize int) {
	r.Writes, r.Seconds = writes, el.Seconds()
	r.WritesPerSec = float64(writes) / el.Seconds()
	r.MBPerSec = float64(writes*valueSize) / el.Seconds() / 1e6
	after := cpuNow(cl)
	r.CPUSecPerM = map[string]float64{}
	r.PeakRSSMiB = map[string]float64{}
	for _, c := range cl {
		if b, a := before[c.name], after[c.name]; b.ok && a.ok {
			r.CPUSecPerM[c.name] = (a.cpu - b.cpu) / float64(writes) * 1e6
			if a.batches > b.batches {
				if r.BatchesApplied == nil {
					r.BatchesApplied = map[string]float64{}
				}
				r.BatchesApplied[c.name] = a.batches - b.batches
			}
		}
		if c.cmd != nil && c.cmd.Process != nil {
			c.peakRSS.Store(vmHWM(c.cmd.Process.Pid))
		}
		r.PeakRSSMiB[c.name] = float64(c.peakRSS.Load()) / (1 << 20)
	}
}

// vmHWM is a process's peak resident set in bytes (0 if unknown). Reading it
// from /proc costs the node nothing, where sampling /metrics ten times a
// second cost it CPU the figures would count.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

type lagDoc struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	Stages  map[string]struct {
		P50 float64 `json:"p50_ms"`
		P99 float64 `json:"p99_ms"`
	} `json:"stages"`
}

func (r *Result) lag(c *cluster, since time.Time) {
	var l lagDoc
	if c.getJSON(fmt.Sprintf("/admin/lag?since=%d", since.UnixNano()), &l) == nil && l.Samples > 0 {
		r.LagP50MS, r.LagP99MS, r.LagMaxMS = l.P50, l.P99, l.Max
		for name, st := range l.Stages {
			if r.Stages == nil {
				r.Stages = map[string][2]float64{}
			}
			r.Stages[name] = [2]float64{st.P50, st.P99}
		}
	}
}

func runScenario(ctx context.Context, cfg *Config, sc string, run int, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
	prefix := fmt.Sprintf("bench%d", run)
	switch sc {
	case "oneway":
		before := cpuNow(cl)
		start := time.Now()
		if err := write(ctx, cfg, a, prefix, 0, cfg.Writes); err != nil {
			return nil, err
		}
		if err := waitCaughtUp(ctx, [2]*cluster{a, b}); err != nil {
			return nil, err
		}
		r := Result{Scenario: "oneway", Note: fmt.Sprintf("%s writes at a (%d writers) until b holds all", cfg.Mode, cfg.Concurrency)}
		r.finish(cl, before, cfg.Writes, time.Since(start), cfg.ValueSize)
		r.lag(b, start)
		return []Result{r}, nil
	case "bidirectional":
		keys := cfg.Keys
		if keys == 0 {
			keys = cfg.Writes / 2
		}
		before := cpuNow(cl)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, c := range cl {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// both sides write the same keys: conflicts on every key
				errs[i] = write(ctx, cfg, c, prefix, 0, min(keys, cfg.Writes/2))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		if err := waitCaughtUp(ctx, [2]*cluster{a, b}, [2]*cluster{b, a}); err != nil {
			return nil, err
		}
		r := Result{Scenario: "bidirectional", Note: "both sides write the same keys at once"}
		r.finish(cl, before, 2*min(keys, cfg.Writes/2), time.Since(start), cfg.ValueSize)
		r.lag(b, start)
		return []Result{r}, nil
	case "steady":
		var out []Result
		for _, rate := range cfg.Rates {
			n := int(float64(rate) * cfg.SteadyFor.Seconds())
			before := cpuNow(cl)
			start := time.Now()
			var next atomic.Int64
			var wg sync.WaitGroup
			value := strings.Repeat("v", cfg.ValueSize)
			var failed atomic.Int64
			for w := 0; w < max(cfg.Concurrency, rate/200); w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(n) || ctx.Err() != nil {
							return
						}
						if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
							time.Sleep(d)
						}
						if a.put(key(fmt.Sprint(prefix, "-", rate), int(i)), value) != nil {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if err := waitCaughtUp(ctx, [2]*cluster{a, b}); err != nil {
				return nil, err
			}
			r := Result{Scenario: fmt.Sprintf("steady@%d/s", rate), Note: fmt.Sprintf("single PUTs at a fixed rate for %s", cfg.SteadyFor)}
			r.finish(cl, before, n, time.Since(start), cfg.ValueSize)
			r.lag(b, start)
			if f := failed.Load(); f > 0 {
				r.Note += fmt.Sprintf("; %d writes failed", f)
			}
			out = append(out, r)
		}
		return out, nil
	case "puts":
		// Closed-loop single PUTs from PutClients connections: the server's
		// CPU per acknowledged write on the single-key HTTP path.
		before := cpuNow(cl)
		start := time.Now()
		acked, failed := closedLoop(ctx, a, cfg, prefix)
		r := Result{Scenario: fmt.Sprintf("puts@%d", cfg.PutClients)}
		r.finish(cl, before, int(acked.Load()), time.Since(start), cfg.ValueSize)
		if err := waitCaughtUp(ctx, [2]*cluster{a, b}); err != nil {
			return nil, err
		}
		// Batches counted to the end of the drain, as the writes are.
		end := cpuNow(cl)
		if e, b := end["b"], before["b"]; e.ok && b.ok {
			r.BatchesApplied = map[string]float64{"b": e.batches - b.batches}
		}
		r.lag(b, start)
		r.Note = fmt.Sprintf("single PUTs from %d clients for %s: server CPU per acknowledged write %.1f us at a (b: %.1f us replicating them)",
			cfg.PutClients, cfg.SteadyFor, r.CPUSecPerM["a"], r.CPUSecPerM["b"])
		if a.cmd != nil {
			// The same load on net/http alone, started from this binary.
			us, err := httpFloorCPU(ctx, cfg, prefix)
			if err != nil {
				return nil, fmt.Errorf("net/http floor: %w", err)
			}
			r.HTTPFloorUS = us
			r.Note += fmt.Sprintf("; net/http alone under the same load: %.1f us", us)
		}
		if f := failed.Load(); f > 0 {
			r.Note += fmt.Sprintf("; %d writes failed", f)
		}
		return []Result{r}, nil
	case "catchup":
		if err := a.post("/admin/peers/b/pause", nil); err != nil {
			return nil, err
		}
		if err := write(ctx, cfg, a, prefix, 0, cfg.CatchupN); err != nil {
			return nil, err
		}
		before := cpuNow(cl)
		start := time.Now()
		if err := a.post("/admin/peers/b/resume", nil); err != nil {
			return nil, err
		}
		// The live write path keeps answering during the drain.
		pctx, pcancel := context.WithCancel(ctx)
		var lat []time.Duration
		var lmu sync.Mutex
		go func() {
			for i := 0; pctx.Err() == nil; i++ {
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPut, a.url+"/v1/kv/"+key(prefix+"-live", i), strings.NewReader("live"))
				if resp, err := hc.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					lmu.Lock()
					lat = append(lat, time.Since(t0))
					lmu.Unlock()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		err := waitCaughtUp(ctx, [2]*cluster{a, b})
		pcancel()
		if err != nil {
			return nil, err
		}
		r := Result{Scenario: "catchup"}
		r.finish(cl, before, cfg.CatchupN, time.Since(start), cfg.ValueSize)
		lmu.Lock()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		if len(lat) > 0 {
			r.Note = fmt.Sprintf("drain of %d entries; %d live PUTs during it, p99 %.1f ms", cfg.CatchupN, len(lat),
				float64(lat[int(0.99*float64(len(lat)-1))].Microseconds())/1000)
		}
		lmu.Unlock()
		return []Result{r}, nil
	}
	return nil, fmt.Errorf("unknown scenario %q", sc)
}

func machine() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	model := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			_, model, _ = strings.Cut(l, ":")
			break
		}
	}
	return fmt.Sprintf("%d CPUs, %s", numCPU(), strings.TrimSpace(model))
}

// closedLoop runs cfg.PutClients clients that each PUT one key after
// another at c for cfg.SteadyFor.
func closedLoop(ctx context.Context, c *cluster, cfg *Config, prefix string) (acked, failed *atomic.Int64) {
	acked, failed = new(atomic.Int64), new(atomic.Int64)
	deadline := time.Now().Add(cfg.SteadyFor)
	var wg sync.WaitGroup
	value := strings.Repeat("v", cfg.ValueSize)
	for w := 0; w < cfg.PutClients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && time.Now().Before(deadline); i++ {
				if c.put(key(fmt.Sprint(prefix, "-", w), i), value) == nil {
					acked.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return acked, failed
}

// httpFloorCPU drives a bare net/http server (ServeHTTPFloor) with the puts
// load and returns its CPU per answered request in microseconds.
func httpFloorCPU(ctx context.Context, cfg *Config, prefix string) (float64, error) {
	f, err := startHTTPFloor()
	if err != nil {
		return 0, err
	}
	defer stop([]*cluster{f})
	pid := f.cmd.Process.Pid
	c0, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	acked, _ := closedLoop(ctx, f, cfg, prefix+"-floor")
	c1, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	if acked.Load() == 0 {
		return 0, errors.New("no request answered")
	}
	return (c1 - c0) / float64(acked.Load()) * 1e6, nil
}
