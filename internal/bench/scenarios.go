package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

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

// runScenario runs one scenario of the pair cl (the writes' target first);
// run numbers its keys apart from other runs'.
func runScenario(ctx context.Context, cfg *Config, sc string, run int, cl []*cluster) ([]Result, error) {
	prefix := fmt.Sprintf("bench%d", run)
	switch sc {
	case "oneway":
		return runOneway(ctx, cfg, prefix, cl)
	case "bidirectional":
		return runBidirectional(ctx, cfg, prefix, cl)
	case "steady":
		return runSteady(ctx, cfg, prefix, cl)
	case "puts":
		return runPuts(ctx, cfg, prefix, cl)
	case "catchup":
		return runCatchup(ctx, cfg, prefix, cl)
	case "antientropy":
		return runAntiEntropy(ctx, cfg, prefix, cl)
	}
	return nil, fmt.Errorf("unknown scenario %q", sc)
}

// runOneway writes at a, in the configured mode, until b holds every write.
func runOneway(ctx context.Context, cfg *Config, prefix string, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
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
}

// runBidirectional writes the same keys at both clusters at once, until each
// holds the other's writes.
func runBidirectional(ctx context.Context, cfg *Config, prefix string, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
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
}

// runSteady sends single PUTs at a at each of the configured rates in turn.
func runSteady(ctx context.Context, cfg *Config, prefix string, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
	var out []Result
	for _, rate := range cfg.Rates {
		n := int(float64(rate) * cfg.SteadyFor.Seconds())
		before := cpuNow(cl)
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		value := strings.Repeat("v", cfg.ValueSize)
		var failed atomic.Int64
		var lmu sync.Mutex
		lat := make([]time.Duration, 0, n)
		var hostile *hostileCounts
		hctx, hcancel := context.WithCancel(ctx)
		if cfg.Hostile {
			hostile = flood(hctx, a, "bench") // every scenario's keys
		}
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
					t0 := time.Now()
					if a.put(key(fmt.Sprint(prefix, "-", rate), int(i)), value) != nil {
						failed.Add(1)
						continue
					}
					d := time.Since(t0)
					lmu.Lock()
					lat = append(lat, d)
					lmu.Unlock()
				}
			}()
		}
		wg.Wait()
		hcancel()
		if err := waitCaughtUp(ctx, [2]*cluster{a, b}); err != nil {
			return nil, err
		}
		r := Result{Scenario: fmt.Sprintf("steady@%d/s", rate), Note: fmt.Sprintf("single PUTs at a fixed rate for %s", cfg.SteadyFor)}
		if cfg.RESP {
			r.Scenario, r.Note = fmt.Sprintf("steady-resp@%d/s", rate), fmt.Sprintf("RESP SETs (one a connection at a time) at a fixed rate for %s", cfg.SteadyFor)
		}
		r.ClientP50MS, r.ClientP99MS = percentiles(lat)
		r.Note += fmt.Sprintf("; client latency p50 %.2f ms, p99 %.2f ms", r.ClientP50MS, r.ClientP99MS)
		if hostile != nil {
			r.Scenario += "+hostile"
			r.Note += "; " + hostile.String()
		}
		r.finish(cl, before, n, time.Since(start), cfg.ValueSize)
		r.lag(b, start)
		if f := failed.Load(); f > 0 {
			r.Note += fmt.Sprintf("; %d writes failed", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// runPuts measures the server CPU per acknowledged single PUT (closed loop).
func runPuts(ctx context.Context, cfg *Config, prefix string, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
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
}

// runCatchup measures the drain of a backlog built while b was paused, and
// the live write path during it.
func runCatchup(ctx context.Context, cfg *Config, prefix string, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
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
