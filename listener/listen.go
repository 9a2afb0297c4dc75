package listener

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound what the connections of a Set may hold.
type Limits struct {
	// MaxConnections bounds each listener's connections (0: none).
	MaxConnections int
	// MinBodyRate is the least rate, in bytes a second, a request body
	// must arrive at once BodyGrace has passed (0: none).
	MinBodyRate int64
	BodyGrace   time.Duration
}

// Set is a node's bound listeners: each bounded in connections and wrapped
// in TLS when configured, each request counted (Wait waits for those in
// flight) and its body held to a minimum rate.
type Set struct {
	opts Limits
	log  *slog.Logger
	tls  *TLS

	limitersMu sync.Mutex
	limiters   map[net.Listener]*connLimiter // of each bounded listener, by the listener served
	inflight   sync.WaitGroup                // HTTP handlers running
}

// NewSet returns a set of listeners under lim, with tls's configuration (nil
// or off: plain TCP).
func NewSet(lim Limits, tls *TLS, log *slog.Logger) *Set {
	return &Set{opts: lim, tls: tls, log: log}
}

// Wait returns once no handler of the set's servers runs.
func (l *Set) Wait() { l.inflight.Wait() }

// Listen binds an address (or takes a given listener), with TLS when
// configured; the peer listener requires client certificates when a client
// CA is set.
func (l *Set) Listen(given net.Listener, addr string, peer bool) (net.Listener, error) {
	return l.ListenBounded(given, addr, peer, l.opts.MaxConnections)
}

// ListenBounded is Listen with a bound of its own on the connections
// (0: none here; the server bounds them itself).
func (l *Set) ListenBounded(given net.Listener, addr string, peer bool, maxConns int) (net.Listener, error) {
	ln := given
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listener: listen %s: %w", addr, err)
		}
	}
	var cl *connLimiter
	if maxConns > 0 {
		cl = newConnLimiter(ln, maxConns)
		ln = cl
	}
	if c := l.tls.Server(peer); c != nil {
		ln = tls.NewListener(ln, c)
	}
	if cl != nil {
		l.limitersMu.Lock()
		if l.limiters == nil {
			l.limiters = map[net.Listener]*connLimiter{}
		}
		l.limiters[ln] = cl
		l.limitersMu.Unlock()
	}
	return ln, nil
}

// Serve serves h on ln in a goroutine of its own, which exits when the
// server is shut down or the listener closes (its error, nil then, goes to
// *errc, made here); each request is counted and its body held to the
// minimum rate.
func (l *Set) Serve(ln net.Listener, h http.Handler, errc *chan error, tweak ...func(*http.Server)) *http.Server {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l.inflight.Add(1)
			defer l.inflight.Done()
			l.limitBody(w, r)
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(l.log.Handler(), slog.LevelDebug),
	}
	l.limitersMu.Lock()
	if cl := l.limiters[ln]; cl != nil {
		srv.ConnState = cl.connState
	}
	l.limitersMu.Unlock()
	for _, f := range tweak {
		f(srv)
	}
	*errc = make(chan error, 1)
	ch := *errc
	go func() {
		// Exits when Close shuts the server down.
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
			err = nil // shut down, or its listener closed under it (the raft port's requests)
		}
		ch <- err
	}()
	return srv
}

// Served is a server Serve started and the channel its exit is sent on.
type Served struct {
	Srv  *http.Server
	Errc chan error
}

// Shutdown stops servers (nil ones skipped) and waits for the handlers
// still running, up to 30 s. Shutdown waits for idle connections, and
// counts a connection that never sent a request as busy for 5 s: after a
// grace of a second the connections are closed and only the handlers
// still running (their commits) are waited for.
func (l *Set) Shutdown(servers ...Served) []error {
	var errs []error
	for _, sv := range servers {
		if sv.Srv == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := sv.Srv.Shutdown(ctx); err != nil {
			sv.Srv.Close()
		}
		cancel()
		if err := <-sv.Errc; err != nil {
			errs = append(errs, err)
		}
	}
	done := make(chan struct{})
	go func() { l.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		errs = append(errs, errors.New("node: http handlers still running after 30s"))
	}
	return errs
}
