// Package respnode is the node as the Redis-protocol door (package resp)
// sees it: the node's Go API the HTTP surface calls too, and a Submit that
// queues a connection's writes in order at the submitter of the key's raft
// group, or proposes them to its leader. It holds what it uses.
package respnode

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/groups"
	"github.com/replicator/replicator/links"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/resp"
)

// Reads are the node's Go API the RESP door reads and proposes by (the
// same the HTTP surface calls).
type Reads interface {
	ClusterID() string
	Get(key string) (entry.Record, error)
	Counter(key string) (api.CounterResult, error)
	Scan(o api.ScanOptions) ([]api.Item, string, error)
	Propose(ctx context.Context, w api.Write) (api.WriteResult, error)
	Holding(stream entry.StreamID, from, to uint64) ([]string, error)
	PeerStatus() []api.LinkStatus
}

// Node is the node as package resp sees it: the same reads and writes
// the HTTP surface calls, and a Submit that queues a connection's writes in
// order (submitter). It holds what it uses.
type Node struct {
	Reads
	Sub *replica.Submitter
	// follower proposes to the leader (nil: a node alone); leads says this
	// node leads and its term began.
	Follower *forward.Follower
	Leads    func() bool
	Version  string
	// servers are the raft configuration's (nil: a node alone).
	Servers func() []cluster.Server
	// links are the peer links (their peers, filters and acks).
	Links *links.Set
	// keys routes a key to its raft group (a cluster of several groups).
	Groups *groups.Router
}

// leading: a node alone, or the leader of its cluster with its term begun.
func (r *Node) leading() bool { return r.Follower == nil || r.Leads() }

// Submit queues a RESP connection's write. On the leader (or a node alone)
// it goes to the committer in the connection's order. On a follower it is
// proposed to the leader (a typed proposal: propose.go) when the connection
// waits for it: the writes of a connection are then sent one at a time, in
// order, and one whose pipeline already failed is not sent.
func (r *Node) Submit(ctx context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	if r.Groups.Set != nil {
		// The write's group's submitter when this node leads that group.
		if g, err := r.Groups.For(w); err != nil || (g != nil && (r.Follower == nil || g.Rep.Ready())) {
			if err != nil {
				return func() (api.WriteResult, error) { return api.WriteResult{}, err }, false
			}
			return g.Sub.Submit(ctx, w), false
		}
	} else if r.leading() {
		return r.Sub.Submit(ctx, w), false
	}
	wc := w // the closure's copy, made on this path only (captured, w went to the heap on every write)
	return func() (api.WriteResult, error) {
		if err := ctx.Err(); err != nil {
			return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		return r.Propose(ctx, wc)
	}, true
}

// Figures are INFO's and DBSIZE's kept figures.
func (r *Node) Figures() resp.Figures {
	f := resp.Figures{Version: r.Version, Keys: r.Keys(), Role: "replica", Nodes: 1, Quorum: 1}
	if r.leading() {
		f.Role = "master"
	}
	if r.Servers != nil {
		servers, voters := r.Servers(), 0
		for _, sv := range servers {
			if sv.Voter {
				voters++
			}
		}
		f.Nodes, f.Quorum = len(servers), voters/2+1
	}
	for _, l := range r.PeerStatus() {
		f.Links = append(f.Links, resp.Link{Peer: l.Peer, State: l.State, Acked: l.Acked, Last: l.Last,
			Lag: time.Duration(l.OldestUnackedAge * float64(time.Second))})
	}
	return f
}

// Keys is the kept count of live plain keys (DBSIZE).
func (r *Node) Keys() int64 {
	n := int64(0)
	for _, g := range r.Groups.All() {
		n += g.Store.Live()
	}
	return n
}

// Holding names the peers that hold this cluster's writes from index
// from to index to of stream (WAIT): the leader's links say; a follower
// asks the leader (GET /v1/held, forwarded over the raft port).
func (r *Node) Holding(stream entry.StreamID, from, to uint64) ([]string, error) {
	if r.leading() {
		return r.Reads.Holding(stream, from, to)
	}
	q := url.Values{"stream": {stream.String()}, "from": {strconv.FormatUint(from, 10)}, "index": {strconv.FormatUint(to, 10)}}
	var ans api.HeldReport
	if err := r.Follower.Ask(context.Background(), httpapi.PathHeld+"?"+q.Encode(), &ans); err != nil {
		return nil, err
	}
	return ans.Peers, nil
}

// KeptFrom names the peers whose link's filter keeps some of w home
// (links.Set.KeptFrom).
func (r *Node) KeptFrom(w api.Write, res api.WriteResult) []string {
	return r.Links.KeptFrom(w, res)
}

// Peers is the number of peer links.
func (r *Node) Peers() int { return len(r.Links.Peers()) }

// Acks is closed at the next acknowledgement one of this node's links
// receives (a follower holds no links: its WAIT looks again on a timer).
func (r *Node) Acks() <-chan struct{} {
	if !r.leading() {
		return nil
	}
	return r.Links.Acks()
}
