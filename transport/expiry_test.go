package transport_test

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
)

// TestExpiryHeldBackFromAPeerThatCannotKeepIt: a link ships the entries
// before one that expires to a peer whose acks do not say it keeps expiry,
// and waits at that entry (its last error says why) rather than drop the
// expiry, which would keep the key there for ever; once the peer takes
// expiry, the entry and those behind it go, the expiry with it.
func TestExpiryHeldBackFromAPeerThatCannotKeepIt(t *testing.T) {
	var takes atomic.Bool
	l := newLink(t, acceptor.Options{TakesExpiry: takes.Load}, http.DefaultTransport, 100)
	clock := hlc.NewClock(nil, 0)
	stop := l.run()
	defer stop()
	expires := time.Now().Add(time.Hour).UnixNano()
	if err := l.log.Append([]*entry.Entry{
		{Commit: clock.Now(), Op: entry.OpSet, Key: "before", Value: []byte("v")},
		{Commit: clock.Now(), Op: entry.OpSet, Key: "ttl", Value: []byte("v"), Expires: expires},
		{Commit: clock.Now(), Op: entry.OpSet, Key: "after", Value: []byte("v")},
	}); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, l.sh, 1)
	time.Sleep(300 * time.Millisecond)
	if got := l.sh.Acked(); got != 1 {
		t.Fatalf("acked %d: the entry that expires went to a peer that cannot keep it", got)
	}
	for _, k := range []string{"ttl", "after"} {
		if _, err := l.dst.Get(k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the peer holds %s (%v)", k, err)
		}
	}
	st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
	if !strings.Contains(st.LastError, "expir") {
		t.Fatalf("the link's last error %q does not say it waits for expiry", st.LastError)
	}
	takes.Store(true)
	waitAcked(t, l.sh, 3)
	if r, err := l.dst.Get("ttl"); err != nil || r.Expires != expires {
		t.Fatalf("the peer's ttl: %+v %v, want expiry %d", r, err, expires)
	}
}
