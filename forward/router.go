package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/listener"
)

// Who answers, in a cluster of several nodes (docs/CLUSTER.md). Any node
// takes a request: what needs the leader (a write, an action, a consistent
// read) is forwarded to it, one hop at most, and the answer waits until
// this node applied the command the leader answered after, so a client that
// stays on one node reads its own writes. Everything else is answered from
// this node's tree.

const (
	// HeaderForwarded marks a request a node forwarded (its node ID): it
	// is answered where it arrives, never forwarded again.
	HeaderForwarded = "X-Replicator-Forwarded"
	// HeaderApplied, on the answer to a forwarded request, is the last log
	// index the leader had applied when it answered: the forwarding node
	// answers once it has applied as far.
	HeaderApplied = "X-Replicator-Applied"
)

// Leadership is what the router reads of this node's lead.
type Leadership interface {
	// Ready: this node leads and its term began.
	Ready() bool
	// AwaitTerm returns once a term this node won began (at once when it
	// does not lead), or ctx ends.
	AwaitTerm(ctx context.Context) error
	// NotLeader is the refusal of a node that does not lead.
	NotLeader() error
}

// Progress is this node's applied index.
type Progress interface {
	Applied() uint64
	// AwaitApplied returns once the index is applied here, or ctx ends.
	AwaitApplied(ctx context.Context, index uint64) error
}

// Router sends what needs the leader to it: one hop at most, over the raft
// port (service.go), and answers once this node applied what the leader
// had. Its fields are what it needs of the node.
type Router struct {
	NodeID   string
	Group    *cluster.Group
	Lead     Leadership
	Progress Progress
	Service  *Service // the raft port's client, and who verified a caller
	// Member is what gossip says of a node (an older leader's API URL).
	Member          func(id string) (api.Member, bool)
	ElectionTimeout time.Duration
	// LegacyClient forwards to a leader of an older build, at its
	// gossiped URL.
	LegacyClient *http.Client
	// Removed is why the cluster keeps this node out (nil: it does not):
	// then nothing is forwarded.
	Removed func() error
	// NeedsLeader reports a request only the leader answers (the node's
	// routes say); WriteErr answers an error as the API does; Counted
	// counts a forward by how it ended.
	NeedsLeader func(r *http.Request) bool
	WriteErr    func(w http.ResponseWriter, err error)
	Counted     func(how string)
}

// Consistent reports a read that asked to see every write committed
// before it (?consistent=true).
func Consistent(r *http.Request) bool {
	v := r.URL.Query().Get("consistent")
	return v == "true" || v == "1"
}

// Route sends what needs the leader to it.
func (f *Router) Route(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.NeedsLeader(r) {
			h.ServeHTTP(w, r)
			return
		}
		if err := f.Removed(); err != nil {
			f.WriteErr(w, err) // 503 removed: no leader of this node's any more
			return
		}
		if Forwarded(r) || f.Group.IsLeader() {
			f.answerAsLeader(h, w, r)
			return
		}
		f.forward(h, w, r)
	})
}

// answerAsLeader answers a request here, as the leader (or as the node that
// was the leader when it was forwarded: a write then finds it no longer
// leads and is not written).
func (f *Router) answerAsLeader(h http.Handler, w http.ResponseWriter, r *http.Request) {
	if Consistent(r) {
		if err := f.consistentRead(r.Context()); err != nil {
			f.WriteErr(w, err)
			return
		}
	}
	if Forwarded(r) {
		w = &appliedWriter{ResponseWriter: w, progress: f.Progress}
	}
	h.ServeHTTP(w, r)
}

// consistentRead returns once this node has applied every command committed
// before the call, having confirmed that it still leads.
func (f *Router) consistentRead(ctx context.Context) error {
	if err := f.Lead.AwaitTerm(ctx); err != nil {
		return err
	}
	if !f.Lead.Ready() {
		return f.Lead.NotLeader()
	}
	if err := f.Group.VerifyLeader(f.ElectionTimeout); err != nil {
		return fmt.Errorf("%w: confirming leadership: %w", api.ErrNotWritten, err)
	}
	ci := f.Group.CommitIndex()
	for {
		at := f.Progress.Applied()
		if at >= ci {
			return nil
		}
		// Raft's own entries (configuration, barriers) never reach the
		// state machine: only a command after the applied one is waited for.
		more, err := f.Group.HasCommand(at+1, ci)
		if err != nil {
			return fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		if !more {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f.Progress.AwaitApplied(wctx, at+1)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: waiting to apply the log up to %d: %w", api.ErrNotWritten, ci, err)
		}
	}
}

// appliedWriter adds HeaderApplied to the answer of a forwarded request:
// the handler answers after its command applied, so the index read as the
// answer's header goes out covers it.
type appliedWriter struct {
	http.ResponseWriter
	progress Progress
	wrote    bool
}

func (a *appliedWriter) WriteHeader(code int) {
	if !a.wrote {
		a.wrote = true
		a.Header().Set(HeaderApplied, strconv.FormatUint(a.progress.Applied(), 10))
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *appliedWriter) Write(b []byte) (int, error) {
	if !a.wrote {
		a.WriteHeader(http.StatusOK)
	}
	return a.ResponseWriter.Write(b)
}

func (a *appliedWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// hopHeaders are not forwarded: hop-by-hop headers, and the browser's
// cross-origin ones (this node checked them; the leader would see its own
// host differ from the page's).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Origin", "Referer", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest", "Sec-Fetch-User"}

// countingBody counts what was read of a request body: a forward whose
// body was never read can go to another leader.
type countingBody struct {
	io.ReadCloser
	read int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	k, err := c.ReadCloser.Read(p)
	c.read += int64(k)
	return k, err
}

// forward sends r to the leader and relays its answer once this node has
// applied as far as the leader had. It goes over the raft port to the
// server raft names as leader (service.go), without the caller's
// credentials: HeaderCaller says what this node verified. A request that
// never reached the leader is not written (a dial that failed is tried once
// more, at the leader elected meanwhile); one that reached it and got no
// answer has an unknown outcome. A leader of an older build takes no
// requests on its raft port: it is sent the request the way that build
// forwarded, on its API at the URL gossip reports, with the caller's
// headers (a rolling upgrade).
func (f *Router) forward(h http.Handler, w http.ResponseWriter, r *http.Request) {
	body := &countingBody{ReadCloser: r.Body}
	if r.Body == nil || r.Body == http.NoBody {
		body = nil
	}
	var last error
	for attempt := 0; attempt < 2; attempt++ {
		id, err := f.LeaderServer(r.Context())
		if err != nil {
			f.WriteErr(w, fmt.Errorf("%w: %w", api.ErrNotWritten, err))
			return
		}
		if id == f.Group.ID() {
			f.answerAsLeader(h, w, r) // elected meanwhile
			return
		}
		out, err := f.outRequest(r, URL(id, r.URL.RequestURI()), body)
		if err != nil {
			f.WriteErr(w, fmt.Errorf("%w: %w", api.ErrNotWritten, err))
			return
		}
		// The caller's credentials stay here: the raft port's
		// authenticates this node, which says whom it verified.
		out.Header.Del("Authorization")
		out.Header.Del("Cookie")
		out.Header.Set(HeaderCaller, f.Service.CallerIdentity(r))
		out.Header.Set(HeaderScope, listener.ScopeOf(r).String())
		resp, err := f.Service.Client.Do(out)
		if err != nil {
			if NotSent(err) && errors.Is(err, cluster.ErrOlderBuild) && (body == nil || body.read == 0) {
				f.forwardLegacy(h, w, r, body, id)
				return
			}
			if NotSent(err) && (body == nil || body.read == 0) {
				last = err
				f.Counted("not_sent")
				continue
			}
			f.Counted("unknown_outcome")
			f.WriteErr(w, fmt.Errorf("%w: forwarded to the leader %s, no answer: %w", api.ErrUnknownOutcome, id, err))
			return
		}
		f.relay(w, r, resp, string(id))
		return
	}
	f.WriteErr(w, fmt.Errorf("%w: the leader could not be reached: %w", api.ErrNotWritten, last))
}

// outRequest is r as forwarded to url: its body (unless none), its headers
// but the hop-by-hop and browser ones, marked forwarded.
func (f *Router) outRequest(r *http.Request, url string, body *countingBody) (*http.Request, error) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, url, nil)
	if err != nil {
		return nil, err
	}
	if body != nil {
		out.Body, out.ContentLength = io.NopCloser(body), r.ContentLength
	}
	out.Header = r.Header.Clone()
	for _, k := range hopHeaders {
		out.Header.Del(k)
	}
	out.Header.Set(HeaderForwarded, f.NodeID)
	return out, nil
}

// forwardLegacy forwards to a leader of an older build, on its API at the
// URL gossip reports for it, as that build's followers do, when the
// cluster has no tokens: a caller's credential never goes to a URL gossip
// claims (a gossip member may lie about the leader's), so with tokens the
// request is not sent (send it to the leader, or upgrade it first).
func (f *Router) forwardLegacy(h http.Handler, w http.ResponseWriter, r *http.Request, body *countingBody, id raft.ServerID) {
	if f.Service.token || r.Header.Get("Authorization") != "" {
		f.WriteErr(w, fmt.Errorf("%w: the leader %s runs an older build, which takes no requests on its raft port, and a caller's token is never sent to the API URL gossip claims for it: send the request to the leader, or upgrade it (docs/CLUSTER.md)", api.ErrNotWritten, id))
		return
	}
	node, inc := cluster.SplitServerID(id)
	m, ok := f.Member(node)
	if !ok || m.Meta.API == "" || (inc != "" && m.Meta.Inc != inc) {
		f.WriteErr(w, fmt.Errorf("%w: the leader %s runs an older build, and gossip does not know its API URL", api.ErrNotWritten, id))
		return
	}
	apiURL := m.Meta.API
	out, err := f.outRequest(r, strings.TrimRight(apiURL, "/")+r.URL.RequestURI(), body)
	if err != nil {
		f.WriteErr(w, fmt.Errorf("%w: %w", api.ErrNotWritten, err))
		return
	}
	resp, err := f.LegacyClient.Do(out)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" && (body == nil || body.read == 0) {
			f.Counted("not_sent")
			f.WriteErr(w, fmt.Errorf("%w: the leader at %s could not be reached: %w", api.ErrNotWritten, apiURL, err))
			return
		}
		f.Counted("unknown_outcome")
		f.WriteErr(w, fmt.Errorf("%w: forwarded to the leader at %s, no answer: %w", api.ErrUnknownOutcome, apiURL, err))
		return
	}
	f.relay(w, r, resp, apiURL)
}

// relay answers with the leader's answer, once this node applied what the
// leader had when it answered.
func (f *Router) relay(w http.ResponseWriter, r *http.Request, resp *http.Response, apiURL string) {
	defer resp.Body.Close()
	idx, _ := strconv.ParseUint(resp.Header.Get(HeaderApplied), 10, 64)
	if idx > 0 && resp.StatusCode < 500 {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		err := f.Progress.AwaitApplied(ctx, idx)
		cancel()
		if err != nil && resp.StatusCode < 300 {
			f.Counted("unknown_outcome")
			f.WriteErr(w, fmt.Errorf("%w: the leader at %s wrote it, and this node has not applied it yet (%v): read it from the leader, or retry under the same Idempotency-Key",
				api.ErrUnknownOutcome, apiURL, err))
			return
		}
	}
	f.Counted("answered")
	hd := w.Header()
	for k, vs := range resp.Header {
		if k == HeaderApplied {
			continue
		}
		hd[k] = vs
	}
	for _, k := range hopHeaders {
		hd.Del(k)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// LeaderServer returns the leader's raft server ID (this node's when it
// leads), waiting up to twice the election timeout for one.
func (f *Router) LeaderServer(ctx context.Context) (raft.ServerID, error) {
	deadline := time.Now().Add(2*f.ElectionTimeout + time.Second)
	for {
		if f.Group.IsLeader() {
			return f.Group.ID(), nil
		}
		if id := f.Group.LeaderServer(); id != "" {
			return id, nil
		}
		if time.Now().After(deadline) {
			return "", errors.New("this node does not lead its cluster and knows no leader (an election may be under way, or a majority is down)")
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
