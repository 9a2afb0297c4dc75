// Package bench runs `replicator bench`: named scenarios against two
// clusters (started as child processes, or given by address), each measured
// beside a baseline of raw synced Pebble ingest of the same entries in the
// same run.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
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
	// RESP: the clusters serve the RESP door, and steady writes through
	// it (a SET a connection at a time) instead of single HTTP PUTs.
	RESP bool
	// Hostile: while steady runs, a peer of a holding its secret floods a
	// (hostile.go), and the clients' latencies say what it cost them.
	Hostile     bool
	CatchupN    int      // catchup: entries accumulated while the peer is paused
	PutClients  int      // puts: concurrent single-PUT clients (default 64)
	AEKeys      int      // antientropy: keys at both clusters (default 1,000,000)
	AEDivergent int      // antientropy: of them, deleted beneath b (default 1,000)
	ServeArgs   []string // extra `replicator serve` flags (batch bounds, ...)
	// Values is the value mix: "fixed" (ValueSize bytes of one letter, the
	// default) or "json" (documents of a few hundred bytes with repeated
	// field names and varying content, like real data: what compression
	// is measured on).
	Values string
	// PeerBandwidth and PeerCompression set the started clusters' links
	// (--peer-bandwidth, --peer-compression): "" leaves the default.
	PeerBandwidth, PeerCompression string
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
	if c.Values == "" {
		c.Values = "fixed"
	}
	if c.Values == "json" {
		// Throughput in MB/s counts the documents' mean size.
		vs, _ := valuePool(c)
		total := 0
		for _, v := range vs {
			total += len(v)
		}
		c.ValueSize = total / len(vs)
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
	if c.AEKeys == 0 {
		c.AEKeys = 1000000
	}
	if c.AEDivergent == 0 {
		c.AEDivergent = 1000
	}
	if c.CatchupN == 0 {
		c.CatchupN = 1000000
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
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
		case "oneway", "bidirectional", "steady", "puts", "catchup", "antientropy":
			*run++
			results, err = runScenario(ctx, cfg, sc, *run, cl)
			if err != nil {
				return out, fmt.Errorf("%s: %w", sc, err)
			}
		default:
			return out, fmt.Errorf("unknown scenario %q (baseline, oneway, bidirectional, steady, puts, catchup, antientropy)", sc)
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
