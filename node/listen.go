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
	"time"
)

// listen binds an address (or takes a given listener), with TLS when
// configured; the peer listener requires client certificates when a client
// CA is set.
func (n *Node) listen(given net.Listener, addr string, peer bool) (net.Listener, error) {
	ln := given
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("node: listen %s: %w", addr, err)
		}
	}
	var cl *connLimiter
	if n.opts.MaxConnections > 0 {
		cl = newConnLimiter(ln, n.opts.MaxConnections)
		ln = cl
	}
	if c := n.tls.server(peer); c != nil {
		ln = tls.NewListener(ln, c)
	}
	if cl != nil {
		n.limitersMu.Lock()
		if n.limiters == nil {
			n.limiters = map[net.Listener]*connLimiter{}
		}
		n.limiters[ln] = cl
		n.limitersMu.Unlock()
	}
	return ln, nil
}

func (n *Node) serve(ln net.Listener, h http.Handler, errc *chan error, tweak ...func(*http.Server)) *http.Server {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.inflight.Add(1)
			defer n.inflight.Done()
			n.limitBody(w, r)
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelDebug),
	}
	n.limitersMu.Lock()
	if cl := n.limiters[ln]; cl != nil {
		srv.ConnState = cl.connState
	}
	n.limitersMu.Unlock()
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
