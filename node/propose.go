package node

import (
	"context"
	"net/http"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/node/httpapi"
)

// Writes a follower takes in process (the RESP door's, an embedding
// program's) reach the leader as typed proposals (package forward): the
// follower runs no HTTP handler of its own for them and parses no answer
// of the API; the failure's class crosses as a class.

// Propose checks and proposes one write: a set, delete or counter increment
// of one key, a range delete, or an atomic batch (w.Ops), with its
// precondition and idempotency key. Under an idempotency scope on ctx
// (policy.WithKey) the write is stamped with the scope's pinned HLC, so
// every retry ties. The other write methods are its shorthands. On a
// follower of a cluster of several it is proposed to the leader, and
// answered once this node applied it.
func (n *Node) Propose(ctx context.Context, w api.Write) (api.WriteResult, error) {
	return n.writes.Propose(ctx, w)
}

// proposeHereKey marks the context of a request another node relayed whole
// to this one (surface.go): its writes are proposed here.
type proposeHereKey struct{}

// newFollower is this node's side of the proposals it sends its leader
// (a cluster of several; nil for a node alone), over the raft port's
// service client (set up before: setupReplication).
func (n *Node) newFollower() *forward.Follower {
	if !n.multi() {
		return nil
	}
	return &forward.Follower{
		Self: string(n.group.ID()),
		Leader: func(ctx context.Context) (string, error) {
			id, err := n.fwd.LeaderServer(ctx)
			return string(id), err
		},
		Local:   func(ctx context.Context, w api.Write) (api.WriteResult, error) { return n.writes.proposeHere(ctx, w) },
		Send:    func(req *http.Request) (*http.Response, error) { return n.svc.Client.Do(req) },
		URL:     func(id, uri string) string { return forward.URL(raft.ServerID(id), uri) },
		NotSent: forward.NotSent,
		// A write needs the API scope, which the door that took it checked
		// (the HTTP listener's token, the RESP door's AUTH).
		Header:  http.Header{forward.HeaderCaller: {"a door of this node (HTTP, RESP or the Go API), which checked its caller"}, forward.HeaderScope: {httpapi.ScopeAPI.String()}},
		Await:   n.rep.AwaitApplied,
		Counted: func(how string) { n.metrics.forwards.WithLabelValues(how).Inc() },
	}
}

// servesProposals answers the typed proposals other nodes send over the raft
// port (forward.PathPropose) here, as the leader, once the scope their
// caller was granted allows a write; next answers the rest.
func (n *Node) servesProposals(next http.Handler, refused func(code string)) http.Handler {
	l := &forward.Leader{Propose: n.writes.proposeHere, Applied: n.writes.applied,
		MaxBody: int64(max(n.opts.MaxValueBytes+n.opts.MaxKeyBytes, int(n.opts.MaxReplicateBytes/2))) + 64<<10}
	return l.Route(next, refused)
}
