package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// TestAdversarialPeer: a peer with a valid credential (cluster m, secret
// known to a) sends nested, oversized, lying, replayed, injected and slow
// batches to a while a and b replicate under load. Every hostile request is
// refused for what it is, or with 429 once m's own share of a's body slots
// and permits is taken (its slow bodies hold them). During the attack a
// answers /healthz within a second and b's entries reach a with a p99 lag
// under a second; afterwards a and b hold equal digests and every write
// either acknowledged.
func TestAdversarialPeer(t *testing.T) {
	m := newMesh(t, seed(t), false, "a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	// m's link from a goes nowhere: only its credential matters here.
	a.args = append(a.args, "--peer", "m=http://127.0.0.1:1", "--peer-secret", "m=secret-m")
	m.start()
	const attack = 8 * time.Second
	url := a.url + "/v1/replicate"
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), attack)
	defer cancel()
	var wg sync.WaitGroup
	hostile := map[string]*atomic.Int64{}
	surprises := make(chan string, 100)
	post := func(kind string, body io.Reader, length int64, hdr map[string]string, want ...int) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
		req.ContentLength = length
		req.Header.Set("X-Replicator-Origin", "m")
		req.Header.Set("Authorization", "Bearer secret-m")
		req.Header.Set("Content-Type", wire.ContentType)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			return // cut, or the attack is over
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ok := false
		for _, w := range want {
			ok = ok || resp.StatusCode == w
		}
		if !ok && ctx.Err() == nil {
			select {
			case surprises <- fmt.Sprintf("%s: status %d, want %v", kind, resp.StatusCode, want):
			default:
			}
		}
		hostile[kind].Add(1)
	}
	loop := func(kind string, f func()) {
		hostile[kind] = &atomic.Int64{}
		wg.Add(1)
		go func() {
			// Exits when the attack is over.
			defer wg.Done()
			for ctx.Err() == nil {
				f()
			}
		}()
	}
	mStream := entry.StreamID{0x6d}
	now := func() hlc.Timestamp { return hlc.Timestamp{Wall: time.Now().UnixNano()} }
	batch := func(h wire.Header, ents ...entry.Entry) []byte {
		h.Sender = "m"
		for i := range ents {
			ents[i].Origin, ents[i].Stream = "m", h.Stream
		}
		return wire.EncodeBatch(&wire.Batch{Header: h, Entries: ents})
	}
	// one genuine batch of m's, replayed for ever
	var genuine []entry.Entry
	for i := 1; i <= 10; i++ {
		ts := now()
		genuine = append(genuine, entry.Entry{Index: uint64(i), Commit: ts, Stamp: ts, Op: entry.OpSet, Key: fmt.Sprintf("m/%d", i), Value: []byte("m")})
	}
	replay := batch(wire.Header{Stream: mStream}, genuine...)
	nested := func() []byte {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.EncodeMapLen(4)
		enc.EncodeString("v")
		enc.EncodeUint(1)
		enc.EncodeString("entries")
		buf.Write(bytes.Repeat([]byte{0x91}, 4600000))
		buf.WriteByte(0xc0)
		enc.EncodeString("sender")
		enc.EncodeString("m")
		enc.EncodeString("stream")
		enc.EncodeBytes(mStream[:])
		return buf.Bytes()
	}()
	lying := append(wire.AppendBatchHeader(nil, "m", mStream, 1), 0x81, 0xa1, 'k', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'x')
	big := make([]byte, 20<<20)
	loop("nested", func() { post("nested", bytes.NewReader(nested), int64(len(nested)), nil, 400, 429) })
	loop("oversized", func() { post("oversized", bytes.NewReader(big), int64(len(big)), nil, 413, 429) })
	loop("oversized-chunked", func() { post("oversized-chunked", bytes.NewReader(big), -1, nil, 413, 429) })
	loop("lying", func() { post("lying", bytes.NewReader(lying), int64(len(lying)), nil, 400, 429) })
	loop("replayed", func() { post("replayed", bytes.NewReader(replay), int64(len(replay)), nil, 200, 429) })
	loop("injected", func() {
		ts := now()
		// into m's real stream as a snapshot, an entry of a's, a's own
		// write relayed back unasked, a write of an unknown cluster
		for _, body := range [][]byte{
			batch(wire.Header{Stream: mStream, Snapshot: true}, entry.Entry{Index: 11, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "x", Value: []byte("x")}),
			wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "m", Stream: mStream}, Entries: []entry.Entry{
				{Index: 11, Origin: "a", Stream: mStream, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "x", Value: []byte("x")}}}),
		} {
			// refused (403), or not taken: a gap before m's stream began
			// here (409), a's own write dropped (200)
			post("injected", bytes.NewReader(body), int64(len(body)), nil, 403, 409, 200, 429)
		}
		snap := entry.StreamID{0x73, byte(time.Now().UnixNano())}
		body := batch(wire.Header{Stream: snap, Snapshot: true},
			entry.Entry{Index: 1, Commit: ts, Stamp: ts, StampOrigin: "a", Op: entry.OpSet, Key: "a/forged", Value: []byte("x")},
			entry.Entry{Index: 2, Commit: ts, Stamp: ts, StampOrigin: "zz", Op: entry.OpSet, Key: "zz/forged", Value: []byte("x")})
		post("injected", bytes.NewReader(body), int64(len(body)), nil, 200, 429, 403)
	})
	for i := 0; i < 20; i++ {
		kind := fmt.Sprintf("slow-%d", i)
		loop(kind, func() {
			pr, pw := io.Pipe()
			go func() {
				// Exits when the request is cut or the attack ends.
				defer pw.Close()
				for ctx.Err() == nil {
					if _, err := pw.Write(replay[:1]); err != nil {
						return
					}
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
			}()
			post(kind, pr, -1, nil, 400, 429)
			pr.Close()
		})
	}
	// a's health, probed throughout
	var slowHealth atomic.Int64
	wg.Add(1)
	go func() {
		// Exits when the attack is over.
		defer wg.Done()
		c := &http.Client{Timeout: time.Second}
		for ctx.Err() == nil {
			resp, err := c.Get(a.url + "/healthz")
			if err != nil || resp.StatusCode != 200 {
				slowHealth.Add(1)
			}
			if err == nil {
				resp.Body.Close()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// honest load at both
	var mu sync.Mutex
	acked := map[string]string{}
	for _, p := range []*proc{a, b} {
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(p *proc, w int) {
				// Exits when the attack is over.
				defer wg.Done()
				c := p.client()
				for i := 0; ctx.Err() == nil; i++ {
					k, v := fmt.Sprintf("%s/%d/%d", p.name, w, i), fmt.Sprint(i)
					wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := c.Put(wctx, k, []byte(v))
					wcancel()
					if err == nil {
						mu.Lock()
						acked[k] = v
						mu.Unlock()
					}
				}
			}(p, w)
		}
	}
	wg.Wait()
	close(surprises)
	for s := range surprises {
		t.Error(s)
	}
	if n := slowHealth.Load(); n > 0 {
		t.Errorf("a's /healthz failed or took over a second %d times during the attack", n)
	}
	var lag api.LagReport
	if _, err := a.client().Do(bg(), http.MethodGet, fmt.Sprintf("/admin/lag?since=%d", start.UnixNano()), nil, nil, &lag); err != nil {
		t.Fatal(err)
	}
	if lag.Samples < 100 || lag.P99MS > 1000 {
		t.Errorf("b's entries at a during the attack: %d samples, p99 %.1f ms (want under a second)", lag.Samples, lag.P99MS)
	}
	// a and b converge, with every acknowledged write (a also holds m's own
	// genuine writes, which m never sent b)
	eventually(t, 60*time.Second, func() (bool, string) {
		state := func(p *proc) (map[string]string, error) {
			items, err := p.client().ScanAll(bg(), client.ScanOptions{})
			out := map[string]string{}
			for _, it := range items {
				if !strings.HasPrefix(it.Key, "m/") {
					out[it.Key] = it.Version
				}
			}
			return out, err
		}
		sa, err1 := state(a)
		sb, err2 := state(b)
		if err1 != nil || err2 != nil {
			return false, fmt.Sprint(err1, err2)
		}
		if len(sa) != len(sb) || len(sa) < len(acked) {
			return false, fmt.Sprintf("a holds %d keys, b %d, %d acknowledged", len(sa), len(sb), len(acked))
		}
		for k, v := range sa {
			if sb[k] != v {
				return false, fmt.Sprintf("%s: a has %s, b %s", k, v, sb[k])
			}
		}
		return true, ""
	})
	for _, p := range []*proc{a, b} {
		c := p.client()
		for k, v := range acked {
			if got, err := c.Get(bg(), k); err != nil || string(got.Value) != v {
				t.Fatalf("%s: acknowledged %s=%s: %q %v", p.name, k, v, got.Value, err)
			}
		}
		for _, k := range []string{"a/forged", "zz/forged", "x"} {
			if _, err := c.Get(bg(), k); err == nil {
				t.Errorf("%s holds %s, which m injected", p.name, k)
			}
		}
	}
	counts := map[string]int64{}
	for k, v := range hostile {
		counts[k] = v.Load()
	}
	t.Logf("attack answered: %v; %d honest writes; lag at a p50 %.1f ms p99 %.1f ms (%d samples)",
		counts, len(acked), lag.P50MS, lag.P99MS, lag.Samples)
}
