package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/listener"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/transport"
)

// Requests between the nodes of a cluster (issue 25, docs/SECURITY.md
// "Who may be a member"). Gossip finds nodes; it never says where a
// request goes. A follower forwards to the server raft names as leader, and
// a node asks another its state, over the raft port (cluster.DialService):
// to the member the configuration names, at the address it holds, with
// the raft port's credential on both ends. The caller's bearer token never
// crosses: the node that checked it says so in headerCaller, which only a
// request over the raft port can carry. A member's API and replication
// URLs, handed out in not_leader answers and acks, are what it said of
// itself over the raft port (Describe), never what gossip reports.

// headerCaller, on a request one node sends another over the raft port, is
// the identity the sending node verified ("token", "certificate <subject>",
// or "none" on a node without credentials). Read on the raft port only.
const headerCaller = "X-Replicator-Caller"

// headerScope, on a request one node forwards another over the raft port,
// is the scope the forwarding node granted its caller (httpapi.Scope): the
// receiving node answers only a route within it. Read on the raft port only.
const headerScope = "X-Replicator-Scope"

// serviceHost is the pseudo host of a request to another node over the raft
// port: its raft server ID, which the dial turns into the address the
// configuration holds.
const serviceHost = ".raft.internal"

// service is the node's side of the raft port's requests: it serves what
// other nodes of its cluster ask (this node's description, its view of the
// cluster, forwarded requests) and asks them the same.
type service struct {
	group *cluster.Group
	// token: callers of the API authenticate with a token.
	token bool
	// member is what gossip says of a node; urls the replicate URLs of
	// the members, which acks list (refreshProven keeps them).
	member func(id string) (transport.Member, bool)
	urls   *nodeURLs
	// replicate is this node's own replicate URL (setDescription).
	replicate string
	// client sends requests to other nodes over the raft port; srv serves
	// theirs (errc: its exit).
	svcClient *http.Client
	svcSrv    *http.Server
	svcErr    chan error
	// selfDesc is what this node says of itself on its raft port, set
	// once Start bound the listeners.
	selfDesc atomic.Pointer[string]
}

// described is what a node says of itself on its raft port.
type described struct {
	API       string `json:"api"`
	Replicate string `json:"replicate"`
	// Commands is the newest command encoding the node reads (0: a build
	// before encodings were described, which reads encoding 1).
	Commands int `json:"commands,omitempty"`
}

// describeSelf is this node's description (cluster.Options.Describe): ""
// until Start has bound the listeners (the raft port answers before).
func (s *service) describeSelf() string {
	if p := s.selfDesc.Load(); p != nil {
		return *p
	}
	return ""
}

// setDescription records what this node says of itself, once its listeners
// are bound (Start): its URLs (gossip's, when set, name them as others reach
// them) and the command encodings it reads.
func (s *service) setDescription(d described, g *GossipOptions) {
	if g != nil {
		if g.APIURL != "" {
			d.API = g.APIURL
		}
		if g.ReplicateURL != "" {
			d.Replicate = g.ReplicateURL
		}
	}
	s.replicate = d.Replicate
	b, _ := json.Marshal(d)
	desc := string(b)
	s.selfDesc.Store(&desc)
}

// What a member said of itself, as far as this node knows.
const (
	descUnknown = iota // not asked yet, or it could not be asked
	descOlder          // it answered, and runs a build that describes nothing
	descKnown
)

// proven returns what member id said of itself over the raft port; wait
// says whether to ask it now when the last answer is too old (a path that
// must not block passes false).
func (sv *service) proven(id raft.ServerID, wait bool) (described, int) {
	var s string
	if wait {
		var err error
		if s, err = sv.group.Describe(id, time.Second); err != nil {
			return described{}, descUnknown
		}
	} else {
		var ok bool
		if s, ok = sv.group.Described(id); !ok {
			return described{}, descUnknown
		}
	}
	if s == "" {
		return described{}, descOlder
	}
	var d described
	if json.Unmarshal([]byte(s), &d) != nil {
		return described{}, descUnknown
	}
	return d, descKnown
}

// gossipedReplicate is the replicate URL gossip reports for member id, used
// only for a member that answered on its raft port and runs an older build
// (a rolling upgrade), as that build handed it out. Never for a member
// that could not be asked: gossip may be anyone's.
func (s *service) gossipedReplicate(id raft.ServerID) string {
	node, inc := cluster.SplitServerID(id)
	if m, ok := s.member(node); ok && m.Meta.Inc == inc && m.State == transport.LiveAlive {
		return m.Meta.Replicate
	}
	return ""
}

// refreshProven asks every member of the configuration what it says of
// itself (each at most every 30 s: cluster.Describe caches), and keeps the
// replicate URLs acks list. It runs every second.
func (s *service) refreshProven() {
	urls := []string{s.replicate}
	for _, sv := range s.group.Status().Servers {
		id := cluster.ServerID(sv.ID, sv.Incarnation)
		if id == s.group.ID() {
			continue
		}
		switch d, state := s.proven(id, true); {
		case state == descKnown && d.Replicate != "":
			urls = append(urls, d.Replicate)
		case state == descOlder:
			if u := s.gossipedReplicate(id); u != "" {
				urls = append(urls, u)
			}
		}
	}
	s.urls.v.Store(&urls)
}

// serveService serves the requests other nodes send over the raft port:
// the API's routes, answered here (never forwarded again), without the
// token check (the raft port's credential authenticated the sender).
func (s *service) serveService(lis *listener.Set, h http.Handler) {
	ln := s.group.ServiceListener()
	if ln == nil {
		return
	}
	// Exits when Close shuts the server down (or the raft port closes).
	s.svcSrv = lis.Serve(ln, h, &s.svcErr, func(srv *http.Server) {
		srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			if sc, ok := c.(*raftconn.ServiceConn); ok {
				return context.WithValue(ctx, serviceSenderKey{}, sc.Sender)
			}
			return ctx
		}
	})
}

// enforceScope guards what other nodes send over the raft port: the raft
// port's credential proves the sender is a member, and headerScope says
// what the member verified of its caller; a route above that scope is
// refused here, whatever path the request spells. A member of an older
// build sends no scope: its requests reach the API routes, not the admin
// ones (send those to this node, or upgrade the member).
func (s *service) enforceScope(mux *http.ServeMux, h http.Handler, refused func(code string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !canonical(w, r, refused) {
			return
		}
		got, ok := httpapi.ParseScope(r.Header.Get(headerScope))
		if !ok {
			got = httpapi.ScopeAPI
		}
		_, pattern := mux.Handler(r)
		if need := httpapi.RouteScope(pattern); !got.Allows(need) {
			refused("forbidden")
			writeError(w, http.StatusForbidden, apiError{Code: "forbidden",
				Message: fmt.Sprintf("forwarded by %s for a caller granted the %s scope: %s needs the %s scope", serviceSender(r), got, r.URL.Path, need)})
			return
		}
		h.ServeHTTP(w, r.WithContext(listener.WithScope(r.Context(), got)))
	})
}

type serviceSenderKey struct{}

// serviceSender is the raft server ID of the node that sent r over the
// raft port ("" for a request on the API).
func serviceSender(r *http.Request) string {
	s, _ := r.Context().Value(serviceSenderKey{}).(string)
	return s
}

// forwarded reports a request another node forwarded: over the raft port,
// or (from a node of an older build) on the API with headerForwarded.
func forwarded(r *http.Request) bool {
	return serviceSender(r) != "" || r.Header.Get(headerForwarded) != ""
}

// errNotSent wraps a failed dial to another node: the request never left.
type errNotSent struct{ err error }

func (e errNotSent) Error() string { return e.err.Error() }
func (e errNotSent) Unwrap() error { return e.err }

// newServiceClient returns the client of requests to other nodes over the
// raft port: the URL's host names the server (serviceURL).
func (s *service) newServiceClient() *http.Client {
	return &http.Client{CheckRedirect: noRedirects, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			id, ok := strings.CutSuffix(host, serviceHost)
			if !ok {
				return nil, errNotSent{fmt.Errorf("node: %s is not a member's service address", addr)}
			}
			timeout := 5 * time.Second
			if d, ok := ctx.Deadline(); ok {
				timeout = min(timeout, time.Until(d))
			}
			c, err := s.group.DialService(raft.ServerID(id), timeout)
			if err != nil {
				return nil, errNotSent{err}
			}
			return c, nil
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// A fresh connection per request would cost a preamble and a TLS
		// handshake each: connections are kept, and one to a member that
		// changed (another incarnation at the address) fails its next
		// request, which is retried on a new dial.
	}}
}

// serviceURL is the URL of a request to member id over the raft port.
func serviceURL(id raft.ServerID, requestURI string) string {
	return "http://" + string(id) + serviceHost + requestURI
}

// callerOf is who made r, for the logs of what it changes: what this node
// verified, or, for a request another node forwarded over the raft port,
// what that node verified (headerCaller, trusted there only).
func (s *service) callerOf(r *http.Request) string {
	if sender := serviceSender(r); sender != "" {
		c := r.Header.Get(headerCaller)
		if c == "" {
			c = "unknown"
		}
		return c + ", forwarded by " + sender
	}
	return s.callerIdentity(r)
}

// callerIdentity is what this node verified of r's caller, for headerCaller.
func (s *service) callerIdentity(r *http.Request) string {
	switch {
	case r.TLS != nil && len(r.TLS.PeerCertificates) > 0:
		return "certificate " + r.TLS.PeerCertificates[0].Subject.String()
	case s.token && r.Header.Get("Authorization") != "":
		if listener.ScopeOf(r)&httpapi.ScopeAdmin != 0 {
			return "admin token"
		}
		return "API token"
	}
	return "none"
}

// noRedirects keeps an internal client from following a redirect: a hop
// answers what it was asked, and a redirect (to a cleaned path, or to
// another host) is relayed as the answer, never followed with the hop's
// trust.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
