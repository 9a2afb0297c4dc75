package node

// The listeners a node serves on: bounded in connections, with TLS when
// configured, each request counted so that Close waits for it.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// listeners are the node's bound listeners: each bounded in connections
// and wrapped in TLS when configured, each request counted (Close waits for
// those in flight) and its body held to a minimum rate.
type listeners struct {
	opts *Options
	log  *slog.Logger
	tls  *tlsSetup

	limitersMu sync.Mutex
	limiters   map[net.Listener]*connLimiter // of each bounded listener, by the listener served
	inflight   sync.WaitGroup                // HTTP handlers running
}

// listen binds an address (or takes a given listener), with TLS when
// configured; the peer listener requires client certificates when a client
// CA is set.
func (l *listeners) listen(given net.Listener, addr string, peer bool) (net.Listener, error) {
	return l.listenBounded(given, addr, peer, l.opts.MaxConnections)
}

// listenBounded is listen with a bound of its own on the connections
// (0: none here; the server bounds them itself).
func (l *listeners) listenBounded(given net.Listener, addr string, peer bool, maxConns int) (net.Listener, error) {
	ln := given
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("node: listen %s: %w", addr, err)
		}
	}
	var cl *connLimiter
	if maxConns > 0 {
		cl = newConnLimiter(ln, maxConns)
		ln = cl
	}
	if c := l.tls.server(peer); c != nil {
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

func (l *listeners) serve(ln net.Listener, h http.Handler, errc *chan error, tweak ...func(*http.Server)) *http.Server {
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
