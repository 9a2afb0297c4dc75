package listener

import (
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits on what one HTTP connection or request may hold of the node, so
// that slow or many clients bound memory and descriptors by configuration,
// not by their number or their patience:
//
//   - a request body must arrive at MinBodyRate after a grace period, or the
//     connection is cut (a trickling body would otherwise hold a handler, a
//     replay permit or a drain forever);
//   - each listener accepts at most MaxConnections at once;
//   - a refusal sent before the body was read closes the connection instead
//     of draining the body first (net/http drains up to 256 KiB to reuse a
//     connection, at the client's pace).

// rateBody enforces the minimum body rate by moving the connection's read
// deadline ahead of each read: start + grace + bytes read / rate.
type rateBody struct {
	body  io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int64 // bytes per second
	read  int64
}

func (b *rateBody) Read(p []byte) (int, error) {
	due := b.start.Add(b.grace + time.Duration((b.read+int64(len(p)))*int64(time.Second)/b.rate))
	_ = b.rc.SetReadDeadline(due)
	n, err := b.body.Read(p)
	b.read += int64(n)
	if err == io.EOF {
		// The body is in: the handler's own work is not bound by it (a
		// deadline left behind would cancel the request's context).
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *rateBody) Close() error { return b.body.Close() }

// limitBody installs the minimum body rate on a request: the deadline
// covers the first read (and net/http's drain) before any Read extends it.
func (l *Set) limitBody(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || l.opts.MinBodyRate <= 0 {
		return
	}
	rc := http.NewResponseController(w)
	now := time.Now()
	_ = rc.SetReadDeadline(now.Add(l.opts.BodyGrace))
	r.Body = &rateBody{body: r.Body, rc: rc, start: now, grace: l.opts.BodyGrace, rate: l.opts.MinBodyRate}
}

// RefuseEarly marks an answer sent without reading the request's body: the
// connection closes after it rather than waiting for the body to drain.
func RefuseEarly(w http.ResponseWriter) { w.Header().Set("Connection", "close") }

// connLimiter bounds the connections a listener holds. At the bound, a new
// connection takes the place of the longest-idle keep-alive connection
// (which a client reopens when it needs it) rather than wait behind it:
// idle connections must not lock out a health check or a new client. With
// none idle, Accept waits until one closes or turns idle, or the listener
// closes.
type connLimiter struct {
	net.Listener
	max int

	mu struct {
		sync.Mutex
		open   int
		idle   map[net.Conn]time.Time
		closed bool
	}
	freed chan struct{} // signalled when a connection closes or turns idle, or the listener closes
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	l := &connLimiter{Listener: ln, max: max, freed: make(chan struct{}, 1)}
	l.mu.idle = map[net.Conn]time.Time{}
	return l
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.mu.closed {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		if l.mu.open < l.max {
			l.mu.open++
			l.mu.Unlock()
			c, err := l.Listener.Accept()
			if err != nil {
				l.release()
				return nil, err
			}
			return &limitedConn{Conn: c, l: l}, nil
		}
		var oldest net.Conn
		var at time.Time
		for c, t := range l.mu.idle {
			if oldest == nil || t.Before(at) {
				oldest, at = c, t
			}
		}
		if oldest != nil {
			delete(l.mu.idle, oldest)
		}
		l.mu.Unlock()
		if oldest != nil {
			oldest.Close() // frees its place
			continue
		}
		<-l.freed
	}
}

func (l *connLimiter) release() {
	l.mu.Lock()
	l.mu.open--
	l.mu.Unlock()
	l.wake()
}

// wake tells a waiting Accept to look again.
func (l *connLimiter) wake() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// Close closes the listener, and ends an Accept waiting for a place.
func (l *connLimiter) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.mu.closed = true
	l.mu.Unlock()
	l.wake()
	return err
}

// connState is the server's ConnState hook: it tracks idle connections. A
// connection that turns idle wakes an Accept waiting at the bound: it may
// take its place (a new client must not wait until some connection closes,
// up to the idle timeout, because it arrived just before one turned idle).
func (l *connLimiter) connState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	if s == http.StateIdle {
		l.mu.idle[c] = time.Now()
	} else {
		delete(l.mu.idle, c)
	}
	l.mu.Unlock()
	if s == http.StateIdle {
		l.wake()
	}
}

type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.mu.idle, c)
		c.l.mu.Unlock()
		c.l.release()
	})
	return err
}
