package e2e

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultProxy sits on a replication link (the sender's --peer URL points at
// it) and does to each batch what the test says: forward it, lose the answer
// after the receiver applied it, forward it twice, delay it, or cut the link.
type faultProxy struct {
	t      *testing.T
	target string
	ln     net.Listener
	srv    *http.Server
	client *http.Client

	mu struct {
		sync.Mutex
		r        *rand.Rand
		down     bool          // refuse every request (connection cut)
		loseAck  float64       // probability of losing the answer after forwarding
		dup      float64       // probability of forwarding twice
		delay    time.Duration // added before forwarding
		loseNext int           // lose the answers of the next n batches
		reset    float64       // probability of cutting the body halfway (both ways)
	}
	forwarded, lostAcks, duplicated, refused, resets atomic.Int64
	// arrivals are the bodies of replicate requests as they arrived whole
	// (time and size), for bandwidth checks.
	arrivals struct {
		sync.Mutex
		at []time.Time
		n  []int
	}
}

// arrived records a body of n bytes read whole now.
func (p *faultProxy) arrived(n int) {
	p.arrivals.Lock()
	p.arrivals.at = append(p.arrivals.at, time.Now())
	p.arrivals.n = append(p.arrivals.n, n)
	p.arrivals.Unlock()
}

// maxWindow is the most bytes that arrived within any window of d, and
// the bytes in all.
func (p *faultProxy) maxWindow(d time.Duration) (most, total int) {
	p.arrivals.Lock()
	defer p.arrivals.Unlock()
	at, n := p.arrivals.at, p.arrivals.n
	sum, j := 0, 0
	for i := range at {
		sum += n[i]
		total += n[i]
		for at[i].Sub(at[j]) >= d {
			sum -= n[j]
			j++
		}
		most = max(most, sum)
	}
	return most, total
}

func newFaultProxy(t *testing.T, target string, seed uint64) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, target: target, ln: ln,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}
	p.mu.r = newRand(seed)
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln) // exits when Close shuts the server down
	t.Cleanup(func() { p.srv.Close() })
	return p
}

func (p *faultProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *faultProxy) setLoseAck(prob float64)  { p.mu.Lock(); p.mu.loseAck = prob; p.mu.Unlock() }
func (p *faultProxy) setDup(prob float64)      { p.mu.Lock(); p.mu.dup = prob; p.mu.Unlock() }
func (p *faultProxy) setDelay(d time.Duration) { p.mu.Lock(); p.mu.delay = d; p.mu.Unlock() }
func (p *faultProxy) loseNextAcks(n int)       { p.mu.Lock(); p.mu.loseNext = n; p.mu.Unlock() }
func (p *faultProxy) setReset(prob float64)    { p.mu.Lock(); p.mu.reset = prob; p.mu.Unlock() }

// heal puts the link back to plain forwarding.
func (p *faultProxy) heal() {
	p.mu.Lock()
	p.mu.down, p.mu.loseAck, p.mu.dup, p.mu.delay, p.mu.loseNext, p.mu.reset = false, 0, 0, 0, 0, 0
	p.mu.Unlock()
}
func (p *faultProxy) setDown(down bool) { p.mu.Lock(); p.mu.down = down; p.mu.Unlock() }

func (p *faultProxy) roll(prob float64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return prob > 0 && p.mu.r.Float64() < prob
}

// cut closes the client's connection without an answer.
func cut(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	w.WriteHeader(http.StatusBadGateway)
}

func (p *faultProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		cut(w)
		return
	}
	if r.URL.Path == "/v1/replicate" {
		// The link's batches and heartbeats, which its bandwidth limit
		// charges (not the proof or anti-entropy's tree requests).
		p.arrived(len(body))
	}
	p.mu.Lock()
	down, loseAck, dup, delay, reset := p.mu.down, p.mu.loseAck, p.mu.dup, p.mu.delay, p.mu.reset
	loseThis := false
	if p.mu.loseNext > 0 {
		p.mu.loseNext--
		loseThis = true
	}
	p.mu.Unlock()
	if down {
		p.refused.Add(1)
		cut(w)
		return
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	if p.roll(reset) {
		// The connection breaks halfway through the body: the receiver
		// reads a truncated request, the sender an error.
		p.resets.Add(1)
		pr, pw := io.Pipe()
		go func() {
			pw.Write(body[:len(body)/2])
			pw.CloseWithError(io.ErrUnexpectedEOF)
		}()
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), pr)
		req.Header = r.Header.Clone()
		req.ContentLength = int64(len(body))
		if resp, err := p.client.Do(req); err == nil {
			resp.Body.Close()
		}
		cut(w)
		return
	}
	forward := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		return p.client.Do(req)
	}
	if p.roll(dup) {
		if resp, err := forward(); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			p.duplicated.Add(1)
		}
	}
	resp, err := forward()
	if err != nil {
		cut(w)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	p.forwarded.Add(1)
	if loseThis || p.roll(loseAck) {
		// The receiver applied the batch; the sender never hears of it.
		p.lostAcks.Add(1)
		cut(w)
		return
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(b)
}
