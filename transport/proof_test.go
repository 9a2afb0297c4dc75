package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// forger answers posts in the receiver's place, without the secret, while
// on: the answer a node that was named by gossip or a forged redirect, or a
// man in the middle without TLS, could give.
type forger struct {
	next   http.RoundTripper
	on     atomic.Bool
	answer func() (int, string)
	forged atomic.Int64
}

func (f *forger) RoundTrip(r *http.Request) (*http.Response, error) {
	if !f.on.Load() || strings.HasSuffix(r.URL.Path, wire.PathProve) {
		return f.next.RoundTrip(r)
	}
	io.Copy(io.Discard, r.Body)
	f.forged.Add(1)
	status, body := f.answer()
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

func appendN(t *testing.T, log *outLog, from, n int) {
	t.Helper()
	clock := hlc.NewClock(nil, 0)
	var ents []*entry.Entry
	for j := from; j < from+n; j++ {
		ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprintf("k%04d", j), Value: []byte("v")})
	}
	if err := log.Append(ents); err != nil {
		t.Fatal(err)
	}
}

func waitAcked(t *testing.T, sh *transport.Shipper, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); sh.Acked() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("acked %d of %d", sh.Acked(), n)
		}
	}
}

// Issue 25, finding 2: a node's answer moved the shipper whoever gave it:
// a fake "gap, hwm 0" made it rewind and send everything again (16-35 k
// posts in 10 s), and a fake ack would have moved its cursor past entries
// the peer never got. Every answer that moves the shipper must now carry
// the MAC of the post's nonce under the shared secret.
func TestForgedAnswersDoNotMoveTheShipper(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func() (int, string)
	}{
		{"gap", func() (int, string) { return 409, `{"error":{"code":"gap","hwm":0,"message":"forged"}}` }},
		{"ack", func() (int, string) { return 200, `{"accepted":50,"applied":50,"hwm":1000000}` }},
		{"redirect", func() (int, string) {
			return 503, `{"error":{"code":"not_leader","leader":"http://127.0.0.1:1","nodes":["http://127.0.0.1:1"],"message":"forged"}}`
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &forger{next: http.DefaultTransport, answer: c.answer}
			l := newLink(t, acceptor.Options{}, f, 20)
			stop := l.run()
			defer stop()
			appendN(t, l.log, 0, 100)
			waitAcked(t, l.sh, 100)
			f.on.Store(true)
			appendN(t, l.log, 100, 50)
			for deadline := time.Now().Add(5 * time.Second); f.forged.Load() < 3 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if f.forged.Load() < 3 {
				t.Fatal("the forger answered no post: the test proved nothing")
			}
			time.Sleep(200 * time.Millisecond)
			if got := l.sh.Acked(); got != 100 {
				t.Fatalf("forged answers moved the cursor to %d (the peer has 100)", got)
			}
			if cur, _, _ := l.src.Cursor("b"); cur.Index != 100 {
				t.Fatalf("the persisted cursor is %d (the peer has 100)", cur.Index)
			}
			st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
			if !strings.Contains(st.LastError, "without a valid") {
				t.Fatalf("the link does not say why: %q", st.LastError)
			}
			f.on.Store(false)
			waitAcked(t, l.sh, 150)
			if c := l.acc.Counts()["a"]; c.Applied+c.Stale != 150 {
				t.Fatalf("%d entries applied for 150", c.Applied+c.Stale)
			}
		})
	}
}

// A node that cannot prove it holds the secret (a URL gossip or a redirect
// named) gets neither the secret nor a batch: the shipper asks for the
// proof first. A node of a build before proofs (its proof endpoint answers
// 404) gets them only under Peer.AllowUnproven.
func TestShipperSendsNothingToAnUnprovenNode(t *testing.T) {
	for _, c := range []struct {
		name          string
		prove         func(w http.ResponseWriter, nonce string)
		allowUnproven bool
		wantPosts     bool
	}{
		{"wrong proof", func(w http.ResponseWriter, _ string) {
			io.WriteString(w, `{"cluster":"b","proof":"`+strings.Repeat("0", 64)+`"}`)
		}, false, false},
		{"replayed proof of another nonce", func(w http.ResponseWriter, _ string) {
			io.WriteString(w, `{"cluster":"b","proof":"`+wire.ProofMAC("s", "a", "b", wire.NewNonce())+`"}`)
		}, false, false},
		{"older build", func(w http.ResponseWriter, _ string) { http.NotFound(w, nil) }, false, false},
		{"older build, allowed", func(w http.ResponseWriter, _ string) { http.NotFound(w, nil) }, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var posts, secrets int
			fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				if strings.Contains(r.Header.Get("Authorization"), "s") {
					secrets++
				}
				mu.Unlock()
				if r.URL.Path == wire.PathProve {
					c.prove(w, r.Header.Get(wire.HeaderNonce))
					return
				}
				mu.Lock()
				posts++
				mu.Unlock()
				io.WriteString(w, `{"accepted":0,"applied":0,"hwm":0}`)
			}))
			defer fake.Close()
			dir := t.TempDir()
			log := newOutLog(t, dir+"/wal")
			src, _ := store.Open(dir+"/src", &store.Options{Logger: quiet})
			defer src.Close()
			appendN(t, log, 0, 10)
			sh, err := transport.NewShipper(transport.Peer{Name: "b", URL: fake.URL, Secret: "s", AllowUnproven: c.allowUnproven}, log, src,
				transport.Options{Local: "a", BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { sh.Run(ctx); close(done) }()
			time.Sleep(300 * time.Millisecond)
			cancel()
			<-done
			mu.Lock()
			defer mu.Unlock()
			if c.wantPosts {
				if posts == 0 || secrets == 0 {
					t.Fatalf("an older build, allowed: %d posts, %d with the secret", posts, secrets)
				}
				return
			}
			if posts > 0 || secrets > 0 {
				t.Fatalf("the unproven node got %d posts and the secret %d times", posts, secrets)
			}
			if st := sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false }); !strings.Contains(st.LastError, "prove") && !strings.Contains(st.LastError, "secret") {
				t.Fatalf("the link does not say why: %q", st.LastError)
			}
		})
	}
}
