package transport_test

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// wireMeter records when each replicate body went out and its size as sent
// (after compression).
type wireMeter struct {
	next http.RoundTripper
	mu   sync.Mutex
	at   []time.Time
	size []int
}

func (w *wireMeter) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, wire.PathReplicate) && req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(b))
		w.mu.Lock()
		w.at, w.size = append(w.at, time.Now()), append(w.size, len(b))
		w.mu.Unlock()
	}
	return w.next.RoundTrip(req)
}

// since is the bytes sent from t0 on, and the most sent in any window of
// length win starting at a send.
func (w *wireMeter) since(t0 time.Time, win time.Duration) (total, most int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.at {
		if w.at[i].Before(t0) {
			continue
		}
		total += w.size[i]
		n := 0
		for j := i; j < len(w.at) && w.at[j].Sub(w.at[i]) < win; j++ {
			n += w.size[j]
		}
		most = max(most, n)
	}
	return total, most
}

// TestBandwidthChargedWithCompressedBytes: a compressing link's limit holds
// for the bytes that go on the wire when the data's compressibility
// changes. After highly compressible traffic (a lifetime ratio near 100:1),
// incompressible values crossed a link limited to 100 KiB/s at 4-7x the
// limit while the limiter charged each body at the old ratio.
func TestBandwidthChargedWithCompressedBytes(t *testing.T) {
	const limit = 128 << 10
	meter := &wireMeter{next: http.DefaultTransport}
	l := newLinkOpts(t, acceptor.Options{}, meter, 200,
		func(o *transport.Options) {
			o.Link = func(string) entry.LinkSettings { return entry.LinkSettings{Bandwidth: limit} }
		},
		func(p *transport.Peer) { p.Compression = transport.CompressionZstd })
	stop := l.run()
	defer stop()
	clock := hlc.NewClock(nil, 0)
	appendN := func(from, n int, value func() []byte) {
		t.Helper()
		for i := from; i < from+n; i += 50 {
			var ents []*entry.Entry
			for j := i; j < min(i+50, from+n); j++ {
				ents = append(ents, &entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: fmt.Sprintf("k%06d", j), Value: value()})
			}
			if err := l.log.Append(ents); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitAcked := func(n uint64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for l.sh.Acked() < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if l.sh.Acked() != n {
			t.Fatalf("acked %d of %d", l.sh.Acked(), n)
		}
	}
	// 8 MiB that compress about 100:1.
	doc := bytes.Repeat([]byte("tenant=t1 kind=order state=paid "), 128)
	appendN(0, 2000, func() []byte { return doc })
	waitAcked(2000)
	// Then 512 KiB that do not compress: 4 s at the limit.
	rng := rand.New(rand.NewPCG(1, 2))
	// The skew the link reports while the limiter holds its posts.
	var worstSkew atomic.Int64 // microseconds, absolute
	watch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		// Exits when the throttled phase is over (watch closed).
		defer close(watched)
		for {
			select {
			case <-watch:
				return
			case <-time.After(10 * time.Millisecond):
			}
			st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
			if us := int64(math.Abs(st.ClockSkewMS) * 1000); us > worstSkew.Load() {
				worstSkew.Store(us)
			}
		}
	}()
	t0 := time.Now()
	appendN(2000, 256, func() []byte {
		v := make([]byte, 2048)
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		return v
	})
	waitAcked(2256)
	close(watch)
	<-watched
	took := time.Since(t0)
	total, most := meter.since(t0, time.Second)
	st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false })
	t.Logf("%d bytes of incompressible values on the wire in %s (%.0f B/s, limit %d); at most %d in a 1 s window; lifetime %d encoded, %d on the wire",
		total, took.Round(time.Millisecond), float64(total)/took.Seconds(), limit, most, st.BytesRaw, st.BytesOnWire)
	if total < 256*2048 {
		t.Fatalf("only %d bytes on the wire for %d bytes of incompressible values", total, 256*2048)
	}
	// Both ends read one clock: the posts the limiter held are no skew
	// (issue 49: a throttled send read as 5.1 s, the alert fires at 0.25).
	t.Logf("worst clock skew reported while throttled: %.1f ms", float64(worstSkew.Load())/1000)
	if worst := float64(worstSkew.Load()) / 1000; worst > 50 {
		t.Fatalf("clock skew up to %.1f ms between two ends of one clock, measured over sends the limiter held", worst)
	}
	// The bucket's burst is a quarter second of the rate: over 1 s at most
	// 1.25 x the limit, with 10% of slack for the timing of the sends.
	if float64(most) > 1.25*1.1*limit {
		t.Fatalf("%d bytes on the wire in one second over a link limited to %d B/s (%.1fx)", most, limit, float64(most)/limit)
	}
}
