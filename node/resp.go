package node

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/links"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/resp"
	"github.com/replicator/replicator/store"
)

// The Redis-protocol front door (docs/RESP.md): package resp speaks the
// protocol; the node gives it its Go API (respNode) and a listener with the
// HTTP API's TLS settings and token.

// respReads are the node's Go API the RESP door reads and proposes by (the
// same the HTTP surface calls).
type respReads interface {
	ClusterID() string
	Get(key string) (entry.Record, error)
	Counter(key string) (api.CounterResult, error)
	Scan(o api.ScanOptions) ([]api.Item, string, error)
	Propose(ctx context.Context, w api.Write) (api.WriteResult, error)
	Holding(stream entry.StreamID, from, to uint64) ([]string, error)
	PeerStatus() []api.LinkStatus
}

// respNode is the node as package resp sees it: the same reads and writes
// the HTTP surface calls, and a Submit that queues a connection's writes in
// order (submitter). It holds what it uses.
type respNode struct {
	respReads
	sub *replica.Submitter
	// follower proposes to the leader (nil: a node alone); leads says this
	// node leads and its term began.
	follower *forward.Follower
	leads    func() bool
	version  string
	store    *store.Store
	// servers are the raft configuration's (nil: a node alone).
	servers func() []cluster.Server
	// links are the peer links (their peers, filters and acks).
	links *links.Set
}

func newRESPNode(n *Node) respNode {
	r := respNode{respReads: n, sub: n.sub, follower: n.follower, leads: n.rep.Ready, version: n.opts.BuildVersion,
		store: n.store, links: n.links}
	if n.multi() {
		r.servers = func() []cluster.Server { return n.group.Status().Servers }
	}
	return r
}

// leading: a node alone, or the leader of its cluster with its term begun.
func (r respNode) leading() bool { return r.follower == nil || r.leads() }

// Submit queues a RESP connection's write. On the leader (or a node alone)
// it goes to the committer in the connection's order. On a follower it is
// proposed to the leader (a typed proposal: propose.go) when the connection
// waits for it: the writes of a connection are then sent one at a time, in
// order, and one whose pipeline already failed is not sent.
func (r respNode) Submit(ctx context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	if r.leading() {
		return r.sub.Submit(ctx, w), false
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
func (r respNode) Figures() resp.Figures {
	f := resp.Figures{Version: r.version, Keys: r.store.Live(), Role: "replica", Nodes: 1, Quorum: 1}
	if r.leading() {
		f.Role = "master"
	}
	if r.servers != nil {
		servers, voters := r.servers(), 0
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
func (r respNode) Keys() int64 { return r.store.Live() }

// Holding names the peers that hold this cluster's writes from index
// from to index to of stream (WAIT): the leader's links say; a follower
// asks the leader (GET /v1/held, forwarded over the raft port).
func (r respNode) Holding(stream entry.StreamID, from, to uint64) ([]string, error) {
	if r.leading() {
		return r.respReads.Holding(stream, from, to)
	}
	q := url.Values{"stream": {stream.String()}, "from": {strconv.FormatUint(from, 10)}, "index": {strconv.FormatUint(to, 10)}}
	var ans api.HeldReport
	if err := r.follower.Ask(context.Background(), httpapi.PathHeld+"?"+q.Encode(), &ans); err != nil {
		return nil, err
	}
	return ans.Peers, nil
}

// KeptFrom names the peers whose link's filter keeps some of w home
// (links.Set.KeptFrom).
func (r respNode) KeptFrom(w api.Write, res api.WriteResult) []string {
	return r.links.KeptFrom(w, res)
}

// Peers is the number of peer links.
func (r respNode) Peers() int { return len(r.links.Peers()) }

// Acks is closed at the next acknowledgement one of this node's links
// receives (a follower holds no links: its WAIT looks again on a timer).
func (r respNode) Acks() <-chan struct{} {
	if !r.leading() {
		return nil
	}
	return r.links.Acks()
}

// openRESP listens on Options.RESPListen and serves it (nil, nil when it
// is not set). Its goroutine exits when close closes the listener.
func openRESP(n *Node) (*resp.Door, error) {
	if n.opts.RESPListen == "" && n.opts.RESPListener == nil {
		return nil, nil
	}
	// The RESP server bounds its connections itself (--max-connections):
	// at the bound it closes the oldest connection that has not
	// authenticated to make room, which a listener's bound could not (it
	// would hold new clients in the backlog behind them).
	ln, err := n.lis.ListenBounded(n.opts.RESPListener, n.opts.RESPListen, false, 0)
	if err != nil {
		return nil, fmt.Errorf("node: RESP: %w", err)
	}
	lim := resp.DefaultLimits()
	lim.MaxBulk = max(n.opts.MaxValueBytes, n.opts.MaxKeyBytes) + 4096
	o := resp.Options{Token: n.opts.APIToken, Limits: lim, Logger: n.log, Version: n.opts.BuildVersion, MaxConns: max(n.opts.MaxConnections, 0),
		Now: n.clock.Physical}
	if key := n.opts.Testing.RESPCrashKey; key != "" {
		o.Committed = func(k string) {
			if k == key {
				n.log.Warn("testing: killed between a RESP write's commit and its answer", "key", k)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	d := resp.Open(newRESPNode(n), o, ln)
	n.log.Info("serving RESP", "addr", ln.Addr().String())
	return d, nil
}
