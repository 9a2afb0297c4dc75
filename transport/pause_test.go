package transport_test

import (
	"errors"
	"fmt"
	"net/http"
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

func appendSet(t *testing.T, l *link, clock *hlc.Clock, key string) {
	t.Helper()
	if err := l.log.Append([]*entry.Entry{{Commit: clock.Now(), Op: entry.OpSet, Key: key, Value: []byte(key)}}); err != nil {
		t.Fatal(err)
	}
}

// TestPauseIsABarrier: a pause issued after the shipper's loop looked at
// the pause flag and before it built its batch (the hook sits there) lets
// nothing out: not the entries written before it, and above all not the
// write made after Pause returned. Before the gate moved next to the send,
// that batch went out with the later write in it (4 of 5 rounds of a
// black-box test saw it). After Resume every entry arrives, once.
func TestPauseIsABarrier(t *testing.T) {
	l := newLink(t, acceptor.Options{}, http.DefaultTransport, 100)
	clock := hlc.NewClock(nil, 0)
	var armed atomic.Bool
	lateIndex := make(chan uint64, 1)
	transport.SetBeforeShip(l.sh, func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		l.sh.Pause()
		appendSet(t, l, clock, "late")
		lateIndex <- l.log.Last()
	})
	stop := l.run()
	defer stop()
	for i := range 10 {
		appendSet(t, l, clock, fmt.Sprintf("k%02d", i))
	}
	waitAcked(t, l.sh, 10)
	armed.Store(true)
	appendSet(t, l, clock, "trigger")
	var late uint64
	select {
	case late = <-lateIndex:
	case <-time.After(10 * time.Second):
		t.Fatal("the shipper never reached its batch")
	}
	// Nothing goes out while paused; give a wrong build every chance.
	time.Sleep(300 * time.Millisecond)
	for _, k := range []string{"late", "trigger"} {
		if _, err := l.dst.Get(k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the peer holds %q, written while the link was paused (%v)", k, err)
		}
	}
	if got := l.sh.Acked(); got != 10 {
		t.Fatalf("acked %d while paused, want 10", got)
	}
	st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
	if st.LastError != "" {
		t.Fatalf("a pause read as a failure: last error %q", st.LastError)
	}
	l.sh.Resume()
	waitAcked(t, l.sh, late)
	if r, err := l.dst.Get("late"); err != nil || string(r.Value) != "late" {
		t.Fatalf("after Resume the peer holds late = %q, %v", r.Value, err)
	}
	if c := l.acc.Counts()["a"]; c.Applied != late {
		t.Fatalf("%d entries applied, want %d", c.Applied, late)
	}
}

// blockOnce holds the first replicate request carrying entries after it
// is armed until release is closed.
type blockOnce struct {
	next    http.RoundTripper
	armed   atomic.Bool
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, wire.PathReplicate) && r.ContentLength > 64 && b.armed.CompareAndSwap(true, false) {
		b.once.Do(func() { close(b.reached) })
		<-b.release
	}
	return b.next.RoundTrip(r)
}

// TestPauseWaitsForTheBatchOnTheWire: Pause returns only once the batch
// on the wire when it was called is answered, so that when it returns no
// batch of the link is in flight.
func TestPauseWaitsForTheBatchOnTheWire(t *testing.T) {
	rt := &blockOnce{next: http.DefaultTransport, reached: make(chan struct{}), release: make(chan struct{})}
	l := newLink(t, acceptor.Options{}, rt, 100)
	stop := l.run()
	defer stop()
	var released sync.Once
	release := func() { released.Do(func() { close(rt.release) }) }
	defer release() // before stop, on a failure
	clock := hlc.NewClock(nil, 0)
	appendSet(t, l, clock, "first")
	waitAcked(t, l.sh, 1)
	rt.armed.Store(true)
	appendSet(t, l, clock, "held")
	<-rt.reached
	paused := make(chan struct{})
	go func() { l.sh.Pause(); close(paused) }()
	select {
	case <-paused:
		t.Fatal("Pause returned while a batch was on the wire")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	select {
	case <-paused:
	case <-time.After(10 * time.Second):
		t.Fatal("Pause did not return after the batch on the wire was answered")
	}
	// The answer to the batch on the wire is taken even though the link
	// is paused now.
	waitAcked(t, l.sh, 2)
	l.sh.Resume()
}
