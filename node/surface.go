package node

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/wire"
)

// The node's HTTP surface is package httpapi; the node composes it with
// what belongs to its listeners: forwarding to the leader (package
// forward), the token and the origin checks (package listener).

// Handler returns the node's HTTP API as its listener serves it, without
// the token and origin checks: what needs the leader is forwarded to it.
func (n *Node) Handler() http.Handler {
	h, _ := n.handler()
	return h
}

// handler is Handler and the mux behind it (whose routes decide the scope a
// request needs). Key routes' paths are readied for the mux here, so a
// request made in process (the RESP door's forwards) holds any key.
func (n *Node) handler() (http.Handler, *http.ServeMux) {
	mux := surface(n).Handler()
	route := http.Handler(mux) // a node alone answers all
	if n.multi() {
		// A client's write is answered here: Propose sends it to the
		// leader as a typed proposal (package forward). A request another
		// node relayed whole (a follower of an older build) is proposed
		// here (a node that no longer leads refuses it), never sent a
		// second hop.
		route = n.fwd.Route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(forward.HeaderForwarded) != "" {
				r = r.WithContext(context.WithValue(r.Context(), proposeHereKey{}, true))
			}
			mux.ServeHTTP(w, r)
		}))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if httpapi.CanonicalOrRefuse(w, r, func(string) {}) {
			route.ServeHTTP(w, r)
		}
	}), mux
}

// surface is the node's HTTP API, with the peer endpoint unless it has a
// listener of its own.
func surface(n *Node) *httpapi.API {
	o := httpapi.Options{
		MaxKeyBytes:   n.opts.MaxKeyBytes,
		MaxValueBytes: n.opts.MaxValueBytes,
		MaxBatchBytes: int(n.opts.MaxReplicateBytes / 2),
		Metrics:       n.metrics.handler(),
		Now:           n.clock.Physical,
		// Behind the token (Validate refuses --pprof without one).
		Pprof:       n.opts.Pprof && n.opts.APIToken != "",
		Tree:        n.ae,
		Conflicts:   n.conflicts,
		Settings:    n.settings,
		DeadLetters: n.dead,
		Backup: func(ctx context.Context, w io.Writer) error {
			if n.keys.Set != nil {
				return fmt.Errorf("%w: a backup of a node of several raft groups is not built yet (it would hold group 0's keys alone: docs/CLUSTER.md)", api.ErrBadRequest)
			}
			return n.rep.Backup(ctx, w)
		},
		Caller: n.svc.CallerOf,
		Logger: n.log,
	}
	if n.opts.PeerListen == "" && n.opts.PeerListener == nil {
		o.Peer = n.acceptor
	}
	return httpapi.New(n, o)
}

// needsLeader reports a request the router relays whole to the leader: an
// action of the admin API, a consistent read, GET /v1/held. A write of the
// client API is not one: it is answered here and proposed to the leader as
// a typed write (Propose).
func needsLeader(r *http.Request) bool {
	if r.URL.Path == wire.PathReplicate || r.URL.Path == wire.PathProve || r.URL.Path == wire.PathTree || r.URL.Path == httpapi.PathTreeRebuild {
		// The acceptor redirects the sender itself; any node proves,
		// answers from its tree, and rebuilds its own kept hashes.
		return false
	}
	if r.URL.Path == httpapi.PathHeld {
		return true // the leader holds the links
	}
	if httpapi.ClientWrite(r) {
		return false
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions {
		return forward.Consistent(r)
	}
	return true
}
