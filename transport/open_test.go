package transport_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// sawRequests records what each request to the peer carried, in order.
type sawRequests struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string // "open", "entries" or "other"
}

func (s *sawRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.URL.Path == "/v1/replicate" {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		what := "other"
		if b, err := wire.DecodeBatch(body); err == nil {
			switch {
			case len(b.Open) > 0:
				what = "open"
			case len(b.Entries) > 0:
				what = "entries"
			}
		}
		s.mu.Lock()
		s.seen = append(s.seen, what)
		s.mu.Unlock()
	}
	return s.next.RoundTrip(req)
}

// TestOpenStreamsToldBeforeEntries (issue 51): to a peer that records
// this cluster's open streams, a shipper tells them in a heartbeat before
// the first batch of entries goes (its first heartbeat learns only what
// the peer takes), and the peer's log then holds them.
func TestOpenStreamsToldBeforeEntries(t *testing.T) {
	saw := &sawRequests{next: http.DefaultTransport}
	var l *link
	l = newLinkOpts(t, acceptor.Options{TakesOpenStreams: func() bool { return true },
		OpenOf: func(peer string) []entry.StreamID {
			ls, err := l.dst.LinkSettings()
			if err != nil {
				return nil
			}
			return ls[peer].Open
		}}, saw, 50, func(o *transport.Options) {
		o.OpenStreams = func() []entry.StreamID { return []entry.StreamID{l.log.Stream()} }
	})
	clock := hlc.NewClock(nil, 0)
	var ents []*entry.Entry
	for i := range 20 {
		ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprint("k", i), Value: []byte("v")})
	}
	if err := l.log.Append(ents); err != nil {
		t.Fatal(err)
	}
	stop := l.run()
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for l.sh.Acked() < 20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if l.sh.Acked() < 20 {
		t.Fatalf("acked %d of 20", l.sh.Acked())
	}
	saw.mu.Lock()
	seen := slices.Clone(saw.seen)
	saw.mu.Unlock()
	first, told := slices.Index(seen, "entries"), slices.Index(seen, "open")
	if first < 0 || told < 0 || told > first {
		t.Fatalf("requests %v: the open streams were not told before the first entries", seen)
	}
	ls, err := l.dst.LinkSettings()
	if err != nil || !slices.Equal(ls["a"].Open, []entry.StreamID{l.log.Stream()}) {
		t.Fatalf("the peer records open streams %v (%v), want [%s]", ls["a"].Open, err, l.log.Stream())
	}
}
