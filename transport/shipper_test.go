package transport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestShipperBackoff(t *testing.T) {
	b := policy.Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000}
	for i, w := range want {
		if got := b.Delay(i+1, nil); got != w*time.Millisecond {
			t.Errorf("failure %d: %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
}

// faultyTransport loses answers (after the receiver applied) and duplicates
// batches, at rates from a seeded source.
type faultyTransport struct {
	next             http.RoundTripper
	mu               sync.Mutex
	r                *rand.Rand
	loseAck, dup     float64
	lost, duplicated atomic.Int64
}

func (f *faultyTransport) roll(p float64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.Float64() < p
}

func (f *faultyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	send := func() (*http.Response, error) {
		req := r.Clone(r.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		return f.next.RoundTrip(req)
	}
	if f.roll(f.dup) {
		if resp, err := send(); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			f.duplicated.Add(1)
		}
	}
	resp, err := send()
	if err == nil && f.roll(f.loseAck) {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.lost.Add(1)
		return nil, errors.New("fault: answer lost")
	}
	return resp, err
}

// link is a shipper from a's WAL to a real acceptor of b's, over HTTP.
type link struct {
	log      *outLog
	src, dst *store.Store
	acc      *acceptor.Acceptor
	sh       *transport.Shipper
}

// newLink builds a link whose requests go through rt; acc's Local, Secrets
// and Logger are filled in.
func newLink(t *testing.T, acc acceptor.Options, rt http.RoundTripper, maxBatch int, peer ...func(*transport.Peer)) *link {
	t.Helper()
	return newLinkOpts(t, acc, rt, maxBatch, nil, peer...)
}

// newLinkOpts is newLink with the shipper's options changed by opts.
func newLinkOpts(t *testing.T, acc acceptor.Options, rt http.RoundTripper, maxBatch int, opts func(*transport.Options), peer ...func(*transport.Peer)) *link {
	t.Helper()
	dir := t.TempDir()
	l := &link{}
	var err error
	l.log = newOutLog(t, dir+"/wal")
	if l.src, err = store.Open(dir+"/src", &store.Options{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.src.Close() })
	if l.dst, err = store.Open(dir+"/dst", &store.Options{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.dst.Close() })
	acc.Local, acc.Secrets, acc.Logger = "b", map[string]string{"a": "s"}, quiet
	l.acc = acceptor.New(l.dst, direct(t, l.dst, "b"), hlc.NewClock(nil, 0), acc)
	srv := httptest.NewServer(l.acc)
	t.Cleanup(srv.Close)
	p := transport.Peer{Name: "b", URL: srv.URL, Secret: "s"}
	for _, f := range peer {
		f(&p)
	}
	o := transport.Options{
		Local: "a", MaxBatchEntries: maxBatch, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		Client: &http.Client{Transport: rt}, Logger: quiet,
	}
	if opts != nil {
		opts(&o)
	}
	l.sh, err = transport.NewShipper(p, l.log, l.src, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// run starts the shipper; the function it returns stops it and waits.
func (l *link) run() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.sh.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// TestShipperExactUnderLostAcksAndDuplicates ships a WAL through a link that
// loses answers and duplicates batches: the receiver must end up with every
// entry applied exactly once.
func TestShipperExactUnderLostAcksAndDuplicates(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ft := &faultyTransport{next: http.DefaultTransport, r: rand.New(rand.NewPCG(seed, 7)), loseAck: 0.3, dup: 0.2}
	l := newLink(t, acceptor.Options{}, ft, 37)
	log, src, dst, acc, sh := l.log, l.src, l.dst, l.acc, l.sh
	stop := l.run()

	clock := hlc.NewClock(nil, 0)
	const total = 2000
	for i := 0; i < total; i += 50 {
		var ents []*entry.Entry
		for j := i; j < i+50; j++ {
			ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprintf("k%04d", j%700), Value: []byte(fmt.Sprint(j))})
		}
		if err := log.Append(ents); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for sh.Acked() < total && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if sh.Acked() != total {
		t.Fatalf("seed %d: acked %d of %d", seed, sh.Acked(), total)
	}
	c := acc.Counts()["a"]
	if c.Applied+c.Stale != total {
		t.Fatalf("seed %d: %d entries applied for %d distinct WAL identities", seed, c.Applied+c.Stale, total)
	}
	if ft.lost.Load() == 0 || c.Duplicates == 0 {
		t.Fatalf("seed %d: the faults did not happen (lost %d, duplicates %d): the test proved nothing", seed, ft.lost.Load(), c.Duplicates)
	}
	for j := total - 700; j < total; j++ {
		r, err := dst.Get(fmt.Sprintf("k%04d", j%700))
		if err != nil || string(r.Value) != fmt.Sprint(j) {
			t.Fatalf("seed %d: key k%04d = %q %v, want %d", seed, j%700, r.Value, err, j)
		}
	}
	// The persisted cursor is where the shipper stopped.
	cur, ok, err := src.Cursor("b")
	if err != nil || !ok || cur.Index != total || cur.Stream != log.Stream() {
		t.Fatalf("persisted cursor %+v %v %v", cur, ok, err)
	}
	t.Logf("lost %d acks, duplicated %d batches, %d duplicates absorbed", ft.lost.Load(), ft.duplicated.Load(), c.Duplicates)
}

func TestRewindOnGap(t *testing.T) {
	dir := t.TempDir()
	log := newOutLog(t, dir+"/wal")
	src, _ := store.Open(dir+"/src", &store.Options{Logger: quiet})
	defer src.Close()
	dst, _ := store.Open(dir+"/dst", &store.Options{Logger: quiet})
	defer dst.Close()
	acc := acceptor.New(dst, direct(t, dst, "b"), hlc.NewClock(nil, 0), acceptor.Options{Local: "b", Secrets: map[string]string{"a": "s"}, Logger: quiet})
	srv := httptest.NewServer(acc)
	defer srv.Close()
	clock := hlc.NewClock(nil, 0)
	var ents []*entry.Entry
	for j := 0; j < 100; j++ {
		ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprint(j), Value: []byte("v")})
	}
	log.Append(ents)
	// The cursor claims the peer has 60 entries; it has none (its data was
	// wiped): the gap answer must rewind the shipper to 0.
	src.SetCursor("b", entry.Cursor{Stream: log.Stream(), Index: 60})
	sh, err := transport.NewShipper(transport.Peer{Name: "b", URL: srv.URL, Secret: "s"}, log, src, transport.Options{Local: "a", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sh.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if d, _ := dst.Digest(); d.Keys == 100 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if d, _ := dst.Digest(); d.Keys != 100 {
		t.Fatalf("receiver holds %d of 100 keys after the rewind", d.Keys)
	}
	st := sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
	if st.Rewinds == 0 {
		t.Fatalf("no rewind counted: %+v", st)
	}
}

// TestOversizeEntryGoesAsStub (operator event 7): an entry larger than the
// receiver's body limit (a value allowed locally, up to 64 MiB) must not
// wedge the link: the receiver refuses the body before reading it, so the
// shipper sends a stub the receiver sets aside as a dead letter, and every
// entry behind it arrives.
func TestOversizeEntryGoesAsStub(t *testing.T) {
	dir := t.TempDir()
	log := newOutLog(t, dir+"/wal")
	src, _ := store.Open(dir+"/src", &store.Options{Logger: quiet})
	defer src.Close()
	dst, _ := store.Open(dir+"/dst", &store.Options{Logger: quiet})
	defer dst.Close()
	acc := acceptor.New(dst, direct(t, dst, "b"), hlc.NewClock(nil, 0), acceptor.Options{Local: "b", Secrets: map[string]string{"a": "s"},
		MaxBodyBytes: 64 << 10, MaxValueBytes: 1 << 20, Logger: quiet})
	srv := httptest.NewServer(acc)
	defer srv.Close()
	clock := hlc.NewClock(nil, 0)
	var ents []*entry.Entry
	for j := 0; j < 30; j++ {
		v := []byte("small")
		if j == 10 {
			v = bytes.Repeat([]byte("x"), 200<<10) // over the receiver's 64 KiB body limit
		}
		ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprint("k", j), Value: v})
	}
	for _, e := range ents {
		if err := log.Append([]*entry.Entry{e}); err != nil {
			t.Fatal(err)
		}
	}
	sh, err := transport.NewShipper(transport.Peer{Name: "b", URL: srv.URL, Secret: "s"}, log, src, transport.Options{
		Local: "a", BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond, Linger: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sh.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for sh.Acked() < 30 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if sh.Acked() != 30 {
		t.Fatalf("the link stopped at %d of 30 behind an oversize entry", sh.Acked())
	}
	if d, _ := dst.Digest(); d.Keys != 29 {
		t.Fatalf("receiver holds %d keys, want the 29 that fit", d.Keys)
	}
	dls, err := dst.DeadLetters()
	if err != nil || len(dls) != 1 || dls[0].Index != 11 || !strings.Contains(dls[0].Reason, "stub") {
		t.Fatalf("dead letters %+v %v, want entry 11 set aside as a stub", dls, err)
	}
	if hw, _ := hwmOf(dst, "a", log.Stream()); hw.Merged+hw.DeadLettered != 30 {
		t.Fatalf("receiver's mark %+v", hw)
	}
}

func hwmOf(s *store.Store, origin string, stream entry.StreamID) (entry.HWM, error) {
	hs, err := s.HWMs()
	for _, h := range hs {
		if h.Origin == origin && h.Stream == stream {
			return h, err
		}
	}
	return entry.HWM{}, err
}

// overlapTransport delays each request and records how many were on the
// wire at once.
type overlapTransport struct {
	next      http.RoundTripper
	delay     time.Duration
	now, peak atomic.Int64
	requests  atomic.Int64
}

func (o *overlapTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	n := o.now.Add(1)
	defer o.now.Add(-1)
	for p := o.peak.Load(); n > p && !o.peak.CompareAndSwap(p, n); p = o.peak.Load() {
	}
	o.requests.Add(1)
	time.Sleep(o.delay) // a slow link: the next batch forms while this one is out
	return o.next.RoundTrip(r)
}

// TestPipelinedBatches: with writes arriving while a batch is on the wire,
// the next batch goes out behind it when the receiver takes two in order,
// never more than two; with a receiver that takes one (one permit per
// sender), one at a time as before. Either way every entry is applied
// exactly once and in order (the last value of each key wins).
func TestPipelinedBatches(t *testing.T) {
	for _, tc := range []struct {
		name     string
		permits  int
		wantPeak int64
	}{{"receiver takes two", 4, 2}, {"receiver takes one", 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			ot := &overlapTransport{next: http.DefaultTransport, delay: 5 * time.Millisecond}
			l := newLink(t, acceptor.Options{Permits: tc.permits}, ot, 16)
			log, dst, acc, sh := l.log, l.dst, l.acc, l.sh
			stop := l.run()
			clock := hlc.NewClock(nil, 0)
			const total = 1500
			for i := 0; i < total; i += 5 {
				var ents []*entry.Entry
				for j := i; j < i+5; j++ {
					ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprintf("k%03d", j%300), Value: []byte(fmt.Sprint(j))})
				}
				if err := log.Append(ents); err != nil {
					t.Fatal(err)
				}
				time.Sleep(200 * time.Microsecond) // a steady trickle, as writers make it
			}
			for deadline := time.Now().Add(30 * time.Second); sh.Acked() < total && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			stop()
			if sh.Acked() != total {
				t.Fatalf("acked %d of %d", sh.Acked(), total)
			}
			c := acc.Counts()["a"]
			if c.Applied+c.Stale != total {
				t.Fatalf("%d entries applied for %d WAL identities", c.Applied+c.Stale, total)
			}
			for j := total - 300; j < total; j++ {
				if r, err := dst.Get(fmt.Sprintf("k%03d", j%300)); err != nil || string(r.Value) != fmt.Sprint(j) {
					t.Fatalf("k%03d = %q %v, want %d", j%300, r.Value, err, j)
				}
			}
			if p := ot.peak.Load(); p != tc.wantPeak {
				t.Fatalf("at most %d batches were on the wire at once, want %d (%d requests)", p, tc.wantPeak, ot.requests.Load())
			}
			t.Logf("%d requests, at most %d at once, %d gaps refused", ot.requests.Load(), ot.peak.Load(), acc.Refusals()["gap"])
		})
	}
}

// direct is the acceptor's log in tests: the state machine on st, applied
// in order without raft.
func direct(t testing.TB, st *store.Store, local string) *machine.Direct {
	t.Helper()
	d, err := machine.OpenDirect(st, machine.Options{Cluster: local, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
