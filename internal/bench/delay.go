package bench

import (
	"net"
	"sync"
	"time"
)

// delayProxy forwards TCP connections to target and holds every chunk for
// delay in each direction, so that two clusters on loopback see the round
// trip of two regions (2 x delay). It models latency, not bandwidth or loss.
type delayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
}

func startDelayProxy(target string, delay time.Duration) (*delayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &delayProxy{ln: ln, target: target, delay: delay}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *delayProxy) addr() string { return p.ln.Addr().String() }

// accept serves connections until close; each connection's goroutines exit
// when either end closes.
func (p *delayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.pipe(t, c) }()
		go func() { defer p.wg.Done(); p.pipe(c, t) }()
	}
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, each chunk delivered delay after it was read.
func (p *delayProxy) pipe(dst, src net.Conn) {
	ch := make(chan chunk, 256)
	go func() {
		// Exits at src's end or error, closing ch.
		defer close(ch)
		for {
			b := make([]byte, 64<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at.Add(p.delay)))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range ch {
	}
}

func (p *delayProxy) close() {
	p.ln.Close()
}
