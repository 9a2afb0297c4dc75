package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/wire"
)

// The hostile peer of --hostile (issue 46): cluster a is configured with a
// peer "hostile" whose secret the bench holds, and while steady runs the
// bench, as that peer, floods a with what docs/SECURITY.md's side doors
// measured: tree requests that each scan the tree anew (two at a time),
// zstd bombs (ten a second) and, with --resp, clients that write, ask WAIT
// and leave (ten a second). The clients' latencies are reported beside a
// run without it.
const (
	hostileName   = "hostile"
	hostileSecret = "bench-hostile-secret"
)

// hostileArgs are cluster a's flags for the hostile peer (a link that goes
// nowhere: only its credential matters).
func hostileArgs() []string {
	return []string{"--peer", hostileName + "=http://127.0.0.1:1", "--peer-secret", hostileName + "=" + hostileSecret}
}

// hostileCounts are what the flood sent and how it was answered.
type hostileCounts struct {
	trees, treesAnswered, bombs, bombsRefused, waits atomic.Int64
}

func (h *hostileCounts) String() string {
	return fmt.Sprintf("a hostile peer sent %d tree requests (%d answered), %d zstd bombs (%d refused), %d WAITs left behind",
		h.trees.Load(), h.treesAnswered.Load(), h.bombs.Load(), h.bombsRefused.Load(), h.waits.Load())
}

// flood runs the hostile peer against c until ctx ends; scope is a key
// prefix the tree requests scan.
func flood(ctx context.Context, c *cluster, scope string) *hostileCounts {
	h := &hostileCounts{}
	var wg sync.WaitGroup
	post := func(path string, body []byte, enc string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+path, bytes.NewReader(body))
		if err != nil {
			return 0
		}
		req.Header.Set("Content-Type", wire.ContentType)
		req.Header.Set(wire.HeaderOrigin, hostileName)
		req.Header.Set("Authorization", "Bearer "+hostileSecret)
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	every := func(d time.Duration, f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				f(i)
				if d > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(d):
					}
				}
			}
		}()
	}
	var pass atomic.Uint64
	for g := 0; g < 2; g++ {
		every(0, func(int) {
			body, _ := wire.EncodeTree(&wire.TreeRequest{Protocol: hashtree.Version, Op: wire.TreeSums, Nodes: []int{0},
				Pass: pass.Add(1), Filters: []wire.Filter{{Include: []string{scope}}}})
			h.trees.Add(1)
			if post(wire.PathTree, body, "") == http.StatusOK {
				h.treesAnswered.Add(1)
			}
		})
	}
	var buf bytes.Buffer
	w, _ := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	w.Write(make([]byte, 8<<20))
	w.Close()
	bomb := buf.Bytes()
	every(100*time.Millisecond, func(int) {
		h.bombs.Add(1)
		if code := post(wire.PathReplicate, bomb, wire.EncodingZstd); code >= 400 {
			h.bombsRefused.Add(1)
		}
	})
	if c.resp != "" {
		every(100*time.Millisecond, func(i int) {
			nc, err := net.DialTimeout("tcp", c.resp, time.Second)
			if err != nil {
				return
			}
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(nc, "SET hostile/%d v\r\nWAIT 5 0\r\n", i)
			bufio.NewReader(nc).ReadString('\n')
			h.waits.Add(1)
		})
	}
	go func() {
		<-ctx.Done()
		wg.Wait()
	}()
	return h
}

// percentiles are the p50 and p99 of ds, in milliseconds.
func percentiles(ds []time.Duration) (p50, p99 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) float64 { return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))]) / 1e6 }
	return at(0.50), at(0.99)
}
