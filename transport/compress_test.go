package transport_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// encodings records each replicate request's Content-Encoding and can play
// an older receiver: one that does not say it decodes zstd, or one rolled
// back to such a build after it said it did (its first compressed body is
// refused 415).
type encodings struct {
	next      http.RoundTripper
	old       bool // strip the receiver's X-Replicator-Accept-Encoding
	refuseOne bool // answer the first compressed request 415, as a build without zstd would
	mu        sync.Mutex
	seen      []string
}

func (e *encodings) RoundTrip(req *http.Request) (*http.Response, error) {
	enc := req.Header.Get("Content-Encoding")
	e.mu.Lock()
	if strings.HasSuffix(req.URL.Path, wire.PathReplicate) {
		e.seen = append(e.seen, enc)
	}
	refuse := e.refuseOne && enc != ""
	if refuse {
		// Rolled back to a build without zstd: it refuses the body, and
		// no longer says it decodes zstd.
		e.refuseOne, e.old = false, true
	}
	e.mu.Unlock()
	if refuse {
		body := `{"error":{"code":"unsupported_encoding","message":"zstd","retryable":false}}`
		return &http.Response{StatusCode: http.StatusUnsupportedMediaType, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	}
	resp, err := e.next.RoundTrip(req)
	e.mu.Lock()
	old := e.old
	e.mu.Unlock()
	if err == nil && old {
		resp.Header.Del(wire.HeaderAcceptEncoding)
	}
	return resp, err
}

func (e *encodings) count() (plain, zstd int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.seen {
		if s == wire.EncodingZstd {
			zstd++
		} else {
			plain++
		}
	}
	return plain, zstd
}

// TestCompressionNegotiated: a link set to zstd compresses only toward a
// receiver that says it decodes zstd; toward one that says nothing (an
// older build) every body is plain; a 415 makes it send plain from then
// on. In every case the receiver holds every entry, once.
func TestCompressionNegotiated(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rt             *encodings
		wantCompressed bool
	}{
		{"a receiver that decodes zstd", &encodings{next: http.DefaultTransport}, true},
		{"an older receiver", &encodings{next: http.DefaultTransport, old: true}, false},
		{"a receiver rolled back to a build without zstd", &encodings{next: http.DefaultTransport, refuseOne: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(t, acceptor.Options{}, tc.rt, 200, func(p *transport.Peer) { p.Compression = transport.CompressionZstd })
			stop := l.run()
			defer stop()
			clock := hlc.NewClock(nil, 0)
			const total = 2000
			doc := bytes.Repeat([]byte(`{"tenant":"t1","kind":"order","state":"paid"}`), 4)
			for i := 0; i < total; i += 100 {
				var ents []*entry.Entry
				for j := i; j < i+100; j++ {
					ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprintf("k%05d", j), Value: doc})
				}
				if err := l.log.Append(ents); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			deadline := time.Now().Add(30 * time.Second)
			for l.sh.Acked() < total && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if l.sh.Acked() != total {
				t.Fatalf("acked %d of %d", l.sh.Acked(), total)
			}
			if c := l.acc.Counts()["a"]; c.Applied != total {
				t.Fatalf("%d entries applied of %d", c.Applied, total)
			}
			plain, z := tc.rt.count()
			switch {
			case tc.wantCompressed && z == 0:
				t.Fatalf("toward a receiver that decodes zstd: %d plain bodies, none compressed", plain)
			case tc.name == "an older receiver" && z != 0:
				t.Fatalf("toward an older receiver: %d compressed bodies", z)
			case tc.name != "an older receiver" && !tc.wantCompressed && z != 1:
				t.Fatalf("after a 415: %d compressed bodies, want the refused one only", z)
			}
			st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
			if tc.wantCompressed && st.BytesOnWire*2 > st.BytesRaw {
				t.Fatalf("%d bytes encoded, %d on the wire", st.BytesRaw, st.BytesOnWire)
			}
			t.Logf("%d plain, %d compressed; %d bytes encoded, %d on the wire", plain, z, st.BytesRaw, st.BytesOnWire)
		})
	}
}
