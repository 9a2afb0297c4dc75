package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	twal "github.com/tidwall/wal"

	"github.com/replicator/replicator/api"
)

// BenchmarkDurableWrites measures fsynced, applied writes per second through
// the node's Go API with 1, 16 and 64 concurrent writers of 100-byte values.
//
//	go test ./node -run '^$' -bench 'DurableWrites|RawWAL' -benchtime 200000x -count 5
func BenchmarkDurableWrites(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			n := openNode(b, testOptions(b.TempDir()))
			defer n.Close()
			b.SetBytes(100)
			b.ResetTimer()
			putKeys(b, n, writers, int64(b.N))
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// BenchmarkRawWALBatch is the ceiling the write path is compared with: bare
// tidwall/wal appends of 100-byte entries, one fsync per batch, no framing,
// no stamping, no Pebble.
func BenchmarkRawWALBatch(b *testing.B) {
	for _, batch := range []int{64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			l, err := twal.Open(b.TempDir(), &twal.Options{SegmentSize: 8 << 20, NoCopy: true})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			value := make([]byte, 100)
			var wb twal.Batch
			b.SetBytes(100)
			b.ResetTimer()
			idx := uint64(1)
			for done := 0; done < b.N; {
				wb.Clear()
				for j := 0; j < batch && done < b.N; j++ {
					wb.Write(idx, value)
					idx++
					done++
				}
				if err := l.WriteBatch(&wb); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// BenchmarkReplicationOneway: 200,000 durable 100-byte writes at a (64
// writers), timed from the first write until b holds all of them; b applies
// with synced Pebble batches. Compare with BenchmarkRawPebbleIngest.
//
//	go test ./node -run '^$' -bench 'ReplicationOneway|RawPebbleIngest' -benchtime 1x -count 5
func BenchmarkReplicationOneway(b *testing.B) {
	const total = 200000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		m := newTestMesh(b, nil, nil, "a", "b")
		na, nb := m.nodes["a"], m.nodes["b"]
		b.StartTimer()
		start := time.Now()
		putKeys(b, na, 64, total)
		local := time.Since(start)
		for {
			hw, _ := nb.store.HWMs()
			if len(hw) == 1 && hw[0].Index == total {
				break
			}
			time.Sleep(time.Millisecond)
		}
		el := time.Since(start)
		b.StopTimer()
		b.ReportMetric(total/el.Seconds(), "entries/s")
		b.ReportMetric(total/local.Seconds(), "local-writes/s")
		na.Close()
		nb.Close()
	}
}

// BenchmarkRawPebbleIngest is the ceiling: the same 200,000 keys and values
// into a bare Pebble in synced batches of 100.
func BenchmarkRawPebbleIngest(b *testing.B) {
	const total, batch = 200000, 100
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		db, err := pebble.Open(b.TempDir(), &pebble.Options{Logger: pebbleQuiet{}})
		if err != nil {
			b.Fatal(err)
		}
		value := make([]byte, 100)
		b.StartTimer()
		start := time.Now()
		for j := 0; j < total; j += batch {
			pb := db.NewBatch()
			for k := j; k < j+batch; k++ {
				pb.Set([]byte(fmt.Sprintf("dkey-%012d", k)), value, nil)
			}
			if err := pb.Commit(pebble.Sync); err != nil {
				b.Fatal(err)
			}
		}
		el := time.Since(start)
		b.StopTimer()
		b.ReportMetric(total/el.Seconds(), "entries/s")
		db.Close()
	}
}

type pebbleQuiet struct{}

func (pebbleQuiet) Infof(string, ...any)  {}
func (pebbleQuiet) Errorf(string, ...any) {}
func (pebbleQuiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// BenchmarkReplicationLag writes at a steady 10,000 writes/s at a for 5
// seconds and reports the replication lag at b (apply time minus commit
// HLC) as percentiles.
//
//	go test ./node -run '^$' -bench ReplicationLag -benchtime 1x -count 3
func BenchmarkReplicationLag(b *testing.B) {
	const rate, seconds = 10000, 5
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		var mu sync.Mutex
		var lags []time.Duration
		m := newTestMesh(b, nil, func(o *Options) {
			o.ObserveLag = func(_ string, d time.Duration) {
				mu.Lock()
				lags = append(lags, d)
				mu.Unlock()
			}
			o.BatchLinger = 0 // the default
		}, "a", "b")
		na, nb := m.nodes["a"], m.nodes["b"]
		value := make([]byte, 100)
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		for j := 0; j < rate*seconds; j++ {
			due := start.Add(time.Duration(j) * time.Second / rate)
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			sem <- struct{}{}
			wg.Add(1)
			go func(j int) {
				defer wg.Done()
				defer func() { <-sem }()
				na.Put(context.Background(), fmt.Sprintf("key-%012d", j), value)
			}(j)
		}
		wg.Wait()
		for {
			mu.Lock()
			n := len(lags)
			mu.Unlock()
			if n == rate*seconds {
				break
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		mu.Lock()
		sort.Slice(lags, func(x, y int) bool { return lags[x] < lags[y] })
		pct := func(p float64) float64 { return float64(lags[int(p*float64(len(lags)-1))].Microseconds()) / 1000 }
		b.ReportMetric(pct(0.5), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
		b.ReportMetric(pct(1), "max-ms")
		mu.Unlock()
		na.Close()
		nb.Close()
	}
}

// rssMiB reads this process's resident set size.
func rssMiB(b *testing.B) float64 {
	debug.FreeOSMemory()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			var kb float64
			fmt.Sscanf(strings.TrimPrefix(line, "VmRSS:"), "%f", &kb)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// BenchmarkBacklogRSS: a node whose only peer is down takes 2,000,000
// writes (100-byte values); its RSS is compared with the same node idle.
// The WAL holds the backlog on disk: tidwall keeps one segment and a small
// cache in memory, and the byte index keeps a mark per 1,024 entries.
//
//	go test ./node -run '^$' -bench BacklogRSS -benchtime 1x
func BenchmarkBacklogRSS(b *testing.B) {
	const total = 2_000_000
	for i := 0; i < b.N; i++ {
		m := newTestMesh(b, nil, func(o *Options) {
			o.WaterMarks = api.WaterMarks{HighEntries: 3 * total}
		}, "a", "b")
		na := m.nodes["a"]
		m.nodes["b"].Close()
		time.Sleep(200 * time.Millisecond)
		idle := rssMiB(b)
		putKeys(b, na, 64, total)
		st := na.PeerStatus()[0]
		if st.EntriesBehind != total {
			b.Fatalf("backlog %d, want %d", st.EntriesBehind, total)
		}
		full := rssMiB(b)
		b.ReportMetric(idle, "idle-MiB")
		b.ReportMetric(full, "backlog-MiB")
		b.ReportMetric(full-idle, "delta-MiB")
		b.ReportMetric(float64(st.BytesBehind)/(1<<20), "backlog-on-disk-MiB")
		na.Close()
	}
}

// BenchmarkBulkLoad streams 200,000 NDJSON records (100-byte values) to
// POST /v1/bulk at a, and times the load and b holding all of them.
//
//	go test ./node -run '^$' -bench BulkLoad -benchtime 1x -count 3
func BenchmarkBulkLoad(b *testing.B) {
	const total = 200000
	var body bytes.Buffer
	value := strings.Repeat("v", 100)
	for i := 0; i < total; i++ {
		fmt.Fprintf(&body, `{"key":"bulk/%08d","value":"%s"}`+"\n", i, value)
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		m := newTestMesh(b, nil, nil, "a", "b")
		na, nb := m.nodes["a"], m.nodes["b"]
		b.StartTimer()
		start := time.Now()
		resp, err := http.Post(na.URL()+"/v1/bulk", "application/x-ndjson", bytes.NewReader(body.Bytes()))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("bulk: %d", resp.StatusCode)
		}
		loaded := time.Since(start)
		for {
			d, _ := nb.store.Digest()
			if d.Keys == total {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		el := time.Since(start)
		b.StopTimer()
		b.ReportMetric(total/loaded.Seconds(), "loaded-keys/s")
		b.ReportMetric(total/el.Seconds(), "replicated-keys/s")
		na.Close()
		nb.Close()
	}
}

// BenchmarkHTTPWrites: durable single-key PUTs over loopback HTTP from 64
// concurrent keep-alive clients (in this process, sharing its 2 cores).
//
//	go test ./node -run '^$' -bench HTTPWrites -benchtime 100000x -count 3
func BenchmarkHTTPWrites(b *testing.B) {
	n := openNode(b, testOptions(b.TempDir()))
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	value := bytes.Repeat([]byte("v"), 100)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				req, _ := http.NewRequest(http.MethodPut, n.URL()+"/v1/kv/"+fmt.Sprintf("key-%012d", i), bytes.NewReader(value))
				resp, err := hc.Do(req)
				if err != nil || resp.StatusCode != 200 {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
}

// putKeys writes key-000000000001 .. key-<total> with 100-byte values through
// n.Put from the given number of concurrent writers, and returns once all
// are acknowledged (a failure fails b).
func putKeys(b *testing.B, n *Node, writers int, total int64) {
	value := make([]byte, 100)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > total {
					return
				}
				if _, err := n.Put(context.Background(), fmt.Sprintf("key-%012d", i), value); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
