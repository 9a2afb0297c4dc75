package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/api"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/listener"
)

// Requests between the nodes of a cluster (issue 25, docs/SECURITY.md
// "Who may be a member"). Gossip finds nodes; it never says where a
// request goes. A follower forwards to the server raft names as leader, and
// a node asks another its state, over the raft port (cluster.DialService):
// to the member the configuration names, at the address it holds, with
// the raft port's credential on both ends. The caller's bearer token never
// crosses: the node that checked it says so in HeaderCaller, which only a
// request over the raft port can carry. A member's API and replication
// URLs, handed out in not_leader answers and acks, are what it said of
// itself over the raft port (Describe), never what gossip reports.

// HeaderCaller, on a request one node sends another over the raft port, is
// the identity the sending node verified ("token", "certificate <subject>",
// or "none" on a node without credentials). Read on the raft port only.
const HeaderCaller = "X-Replicator-Caller"

// HeaderScope, on a request one node forwards another over the raft port,
// is the scope the forwarding node granted its caller (httpapi.Scope): the
// receiving node answers only a route within it. Read on the raft port only.
const HeaderScope = "X-Replicator-Scope"

// serviceHost is the pseudo host of a request to another node over the raft
// port: its raft server ID, which the dial turns into the address the
// configuration holds.
const serviceHost = ".raft.internal"

// Service is the node's side of the raft port's requests: it serves what
// other nodes of its cluster ask (this node's description, its view of the
// cluster, forwarded requests) and asks them the same.
type Service struct {
	group *cluster.Group
	// token: callers of the API authenticate with a token.
	token bool
	// member is what gossip says of a node; urls the replicate URLs of
	// the members, which acks list (RefreshProven keeps them).
	member func(id string) (api.Member, bool)
	urls   atomic.Pointer[[]string]
	// replicate is this node's own replicate URL (SetDescription).
	replicate string
	// Client sends requests to other nodes over the raft port; Srv serves
	// theirs (Errc: its exit), once Serve ran.
	Client *http.Client
	Srv    *http.Server
	Errc   chan error
	// selfDesc is what this node says of itself on its raft port, set
	// once Start bound the listeners.
	selfDesc atomic.Pointer[string]
	self     Described
	// Groups, when set (before Start), is this node's state in each raft
	// group after 0, told with its description at every ask.
	Groups func() []GroupState
}

// NewService is the raft port's side of a node; token says the API's
// callers authenticate with a token; member is what gossip says of a node.
// It describes the node (DescribeSelf) before its group is open; Attach
// gives it the group once it is.
func NewService(token bool, member func(id string) (api.Member, bool)) *Service {
	s := &Service{token: token, member: member}
	s.Client = s.newClient()
	return s
}

// Attach gives the service its node's raft group, open.
func (s *Service) Attach(group *cluster.Group) { s.group = group }

// URLs are the replicate URLs of this cluster's nodes, this one first
// (RefreshProven keeps them; acks list them).
func (s *Service) URLs() []string {
	if p := s.urls.Load(); p != nil {
		return *p
	}
	return nil
}

// Described is what a node says of itself on its raft port.
type Described struct {
	API       string `json:"api"`
	Replicate string `json:"replicate"`
	// Commands is the newest command encoding the node reads (0: a build
	// before encodings were described, which reads encoding 1).
	Commands int `json:"commands,omitempty"`
	// Groups are the node's raft groups after 0 (issue 51), Groups[g-1]
	// group g: what the cluster's groups form and promote by, which the
	// node's gossip has no room for.
	Groups []GroupState `json:"groups,omitempty"`
}

// GroupState is a node's state in one raft group after 0.
type GroupState struct {
	// Applied is the last index its state machine applied in the group.
	Applied uint64 `json:"a"`
	// Fresh: it holds none of the group's state (the group may form).
	Fresh bool `json:"f,omitempty"`
}

// DescribeSelf is this node's description (cluster.Options.Describe): ""
// until Start has bound the listeners (the raft port answers before).
func (s *Service) DescribeSelf() string {
	p := s.selfDesc.Load()
	if p == nil {
		return ""
	}
	if s.Groups != nil {
		d := s.self
		d.Groups = s.Groups()
		b, _ := json.Marshal(d)
		return string(b)
	}
	return *p
}

// SetDescription records what this node says of itself, once its listeners
// are bound (Start): its URLs (as others reach them) and the command
// encodings it reads.
func (s *Service) SetDescription(d Described) {
	s.replicate, s.self = d.Replicate, d
	b, _ := json.Marshal(d)
	desc := string(b)
	s.selfDesc.Store(&desc)
}

// What a member said of itself, as far as this node knows.
const (
	DescUnknown = iota // not asked yet, or it could not be asked
	DescOlder          // it answered, and runs a build that describes nothing
	DescKnown
)

// Proven returns what member id said of itself over the raft port; wait
// says whether to ask it now when the last answer is too old (a path that
// must not block passes false).
func (sv *Service) Proven(id raft.ServerID, wait bool) (Described, int) {
	var s string
	if wait {
		var err error
		if s, err = sv.group.Describe(id, time.Second); err != nil {
			return Described{}, DescUnknown
		}
	} else {
		var ok bool
		if s, ok = sv.group.Described(id); !ok {
			return Described{}, DescUnknown
		}
	}
	if s == "" {
		return Described{}, DescOlder
	}
	var d Described
	if json.Unmarshal([]byte(s), &d) != nil {
		return Described{}, DescUnknown
	}
	return d, DescKnown
}

// GossipedReplicate is the replicate URL gossip reports for member id, used
// only for a member that answered on its raft port and runs an older build
// (a rolling upgrade), as that build handed it out. Never for a member
// that could not be asked: gossip may be anyone's.
func (s *Service) GossipedReplicate(id raft.ServerID) string {
	node, inc := cluster.SplitServerID(id)
	if m, ok := s.member(node); ok && m.Meta.Inc == inc && m.State == api.LiveAlive {
		return m.Meta.Replicate
	}
	return ""
}

// ReplicateURL is the replicate URL a sender is told to use for member id
// (a leader's): what it said of itself over the raft port (RefreshProven
// asks every member each second), never what gossip reports; a member of
// an older build says nothing, and its gossiped URL is handed out, as that
// build did ("": not known).
func (s *Service) ReplicateURL(id raft.ServerID) string {
	switch d, state := s.Proven(id, false); state {
	case DescKnown:
		return d.Replicate
	case DescOlder:
		return s.GossipedReplicate(id)
	}
	return ""
}

// RefreshProven asks every member of the configuration what it says of
// itself (each at most every 30 s: cluster.Describe caches), and keeps the
// replicate URLs acks list. It runs every second.
func (s *Service) RefreshProven() {
	urls := []string{s.replicate}
	for _, sv := range s.group.Status().Servers {
		id := cluster.ServerID(sv.ID, sv.Incarnation)
		if id == s.group.ID() {
			continue
		}
		switch d, state := s.Proven(id, true); {
		case state == DescKnown && d.Replicate != "":
			urls = append(urls, d.Replicate)
		case state == DescOlder:
			if u := s.GossipedReplicate(id); u != "" {
				urls = append(urls, u)
			}
		}
	}
	s.urls.Store(&urls)
}

// Server serves a handler on a listener (listener.Set): the raft port's
// requests are counted and bounded as the API's are.
type Server interface {
	Serve(ln net.Listener, h http.Handler, errc *chan error, tweak ...func(*http.Server)) *http.Server
}

// Serve serves the requests other nodes send over the raft port: the
// API's routes, answered here (never forwarded again), without the token
// check (the raft port's credential authenticated the sender).
func (s *Service) Serve(lis Server, h http.Handler) {
	ln := s.group.ServiceListener()
	if ln == nil {
		return
	}
	// Exits when Close shuts the server down (or the raft port closes).
	s.Srv = lis.Serve(ln, h, &s.Errc, func(srv *http.Server) {
		srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			if sc, ok := c.(*raftconn.ServiceConn); ok {
				return context.WithValue(ctx, serviceSenderKey{}, sc.Sender)
			}
			return ctx
		}
	})
}

// EnforceScope guards what other nodes send over the raft port: the raft
// port's credential proves the sender is a member, and HeaderScope says
// what the member verified of its caller; a route above that scope (need
// says which a request needs, or false when it refused it itself) is
// refused here, whatever path the request spells. A member of an older
// build sends no scope: its requests reach the API routes, not the admin
// ones (send those to this node, or upgrade the member).
func EnforceScope(need func(w http.ResponseWriter, r *http.Request) (api.Scope, bool), h http.Handler, refused func(code string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		need, ok := need(w, r)
		if !ok {
			return
		}
		got := Granted(r)
		if !got.Allows(need) {
			refused("forbidden")
			httpjson.WriteError(w, http.StatusForbidden, httpjson.Error{Code: "forbidden",
				Message: fmt.Sprintf("forwarded by %s for a caller granted the %s scope: %s needs the %s scope", ServiceSender(r), got, r.URL.Path, need)})
			return
		}
		h.ServeHTTP(w, r.WithContext(listener.WithScope(r.Context(), got)))
	})
}

// Granted is the scope the member that sent r verified of its caller
// (HeaderScope; the API's when it says none: a member of an older build).
func Granted(r *http.Request) api.Scope {
	got, ok := api.ParseScope(r.Header.Get(HeaderScope))
	if !ok {
		got = api.ScopeAPI
	}
	return got
}

type serviceSenderKey struct{}

// ServiceSender is the raft server ID of the node that sent r over the
// raft port ("" for a request on the API).
func ServiceSender(r *http.Request) string {
	s, _ := r.Context().Value(serviceSenderKey{}).(string)
	return s
}

// Forwarded reports a request another node forwarded: over the raft port,
// or (from a node of an older build) on the API with HeaderForwarded.
func Forwarded(r *http.Request) bool {
	return ServiceSender(r) != "" || r.Header.Get(HeaderForwarded) != ""
}

// notSent wraps a failed dial to another node: the request never left.
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// NotSent reports an error after which a request to another node
// certainly never left (its dial failed).
func NotSent(err error) bool {
	var ns notSent
	return errors.As(err, &ns)
}

// newClient returns the client of requests to other nodes over the raft
// port: the URL's host names the server (URL).
func (s *Service) newClient() *http.Client {
	return &http.Client{CheckRedirect: NoRedirects, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			id, ok := strings.CutSuffix(host, serviceHost)
			if !ok {
				return nil, notSent{fmt.Errorf("forward: %s is not a member's service address", addr)}
			}
			timeout := 5 * time.Second
			if d, ok := ctx.Deadline(); ok {
				timeout = min(timeout, time.Until(d))
			}
			c, err := s.group.DialService(raft.ServerID(id), timeout)
			if err != nil {
				return nil, notSent{err}
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

// URL is the URL of a request to member id over the raft port.
func URL(id raft.ServerID, requestURI string) string {
	return "http://" + string(id) + serviceHost + requestURI
}

// CallerOf is who made r, for the logs of what it changes: what this node
// verified, or, for a request another node forwarded over the raft port,
// what that node verified (HeaderCaller, trusted there only).
func (s *Service) CallerOf(r *http.Request) string {
	if sender := ServiceSender(r); sender != "" {
		c := r.Header.Get(HeaderCaller)
		if c == "" {
			c = "unknown"
		}
		return c + ", forwarded by " + sender
	}
	return s.CallerIdentity(r)
}

// CallerIdentity is what this node verified of r's caller, for HeaderCaller.
func (s *Service) CallerIdentity(r *http.Request) string {
	switch {
	case r.TLS != nil && len(r.TLS.PeerCertificates) > 0:
		return "certificate " + r.TLS.PeerCertificates[0].Subject.String()
	case s.token && r.Header.Get("Authorization") != "":
		if listener.ScopeOf(r)&api.ScopeAdmin != 0 {
			return "admin token"
		}
		return "API token"
	}
	return "none"
}

// NoRedirects keeps an internal client from following a redirect: a hop
// answers what it was asked, and a redirect (to a cleaned path, or to
// another host) is relayed as the answer, never followed with the hop's
// trust.
func NoRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
