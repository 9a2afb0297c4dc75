package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/groups"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
)

// A cluster of several raft groups (issue 51, docs/CLUSTER.md "Several raft
// groups per cluster"): the node opens its groups after 0 (package groups),
// routes each write and read to its key's group (groups.Router), forwards a
// write to its group's leader, records the cluster's groups in group 0's
// log, and spreads the groups' leaderships over the nodes. With one group
// every key is group 0's and nothing here runs.

// openGroups opens the groups after 0 (Options.Groups > 1), once group 0's
// replica is open, from group 0's replica's deps.
func (n *Node) openGroups(rd replica.Deps) error {
	n.keys = &groups.Router{Zero: &groups.Group{Store: n.store, Rep: n.rep, Sub: n.sub}, Clock: n.clock, Bounds: n.bounds}
	empty, err := n.store.Empty()
	if err != nil {
		return err
	}
	if err := groups.Check(n.machine.Slots(), n.opts.Groups, !empty); err != nil {
		return err
	}
	n.writes = &writes{keys: n.keys, follower: n.follower, closing: &n.closing, removed: n.rep.Removed}
	n.keeper = &groups.Keeper{Router: n.keys, Count: n.opts.Groups, NodeID: n.nodeID, Fatal: n.stopFatal, Logger: n.log}
	if n.multi() {
		n.keeper.Servers = func() []cluster.Server { return n.group.Status().Servers }
	}
	if n.opts.Groups <= 1 {
		return nil
	}
	o := &n.opts
	d := groups.Deps{Count: o.Groups, Dir: o.DataDir, Replica: rd, Bounds: n.bounds, Logger: n.log,
		Store: *storeOptions(o, n.log),
		Admit: func(ctx context.Context) error { return n.admit(ctx, nil) },
		Collect: func(g *groups.Group) (int, error) {
			return n.links.CollectIn(g.Rep.CommitCommand, g.Rep.Machine().Format)
		},
		CollectEvery: o.GCInterval}
	if n.multi() {
		d.Port, d.Removed = n.group.Port, n.rep.RemovedServer
		d.MemberApplied = func(g int) func(raft.ServerID, string) (uint64, error) { return forward.GroupApplied(n.group.Port, g) }
		d.FormWith = func(g int) func() []raft.Server { return func() []raft.Server { return forward.FormWith(n.group, g) } }
	}
	set, err := groups.Open(d)
	if err != nil {
		return err
	}
	n.keys.Set = set
	n.svc.Groups = func() []forward.GroupState {
		out := make([]forward.GroupState, 0, set.Count()-1)
		for _, g := range set.All() {
			out = append(out, forward.GroupState{Applied: g.Rep.Applied(), Fresh: g.Rep.Group().Fresh()})
		}
		return out
	}
	if n.follower != nil {
		for _, g := range set.All() {
			f := *n.follower
			lead := &forward.Router{Group: g.Rep.Group(), ElectionTimeout: n.fwd.ElectionTimeout}
			f.Leader = func(ctx context.Context) (string, error) {
				id, err := lead.LeaderServer(ctx)
				return string(id), err
			}
			f.Await = g.Rep.AwaitApplied
			n.writes.followers = append(n.writes.followers, &f)
		}
	}
	return nil
}

// storeOptions are the options of each store of a node: the memtable, the
// block cache and the version cache (--memtable-size, --cache-size,
// --version-cache-keys) are the node's budget, split evenly among its
// groups' stores (one group: as they are).
func storeOptions(o *Options, log *slog.Logger) *store.Options {
	so := &store.Options{Logger: log, MemTableSize: o.MemTableSize, CacheSize: o.CacheSize, VersionCacheKeys: o.VersionCacheKeys}
	if g := o.Groups; g > 1 {
		so.MemTableSize, so.CacheSize = max(so.MemTableSize/uint64(g), 1<<20), max(so.CacheSize/int64(g), 1<<20)
		if so.VersionCacheKeys > 0 {
			so.VersionCacheKeys = max(so.VersionCacheKeys/g, 1)
		}
	}
	return so
}

// admit admits a write: the node open and in its cluster (and with several
// groups, once the cluster recorded them), term (group 0's term begun; nil
// for a group after 0, whose submitter waits for its own) and group 0's
// stream's identity confirmed, and not saturated.
func (n *Node) admit(ctx context.Context, term func(context.Context) error) error {
	if n.closing.Load() {
		return fmt.Errorf("%w: %w", api.ErrClosed, api.ErrNotWritten)
	}
	if err := n.rep.Removed(); err != nil {
		return fmt.Errorf("%w: %w", api.ErrNotWritten, err)
	}
	if n.opts.Groups > 1 && n.machine.Slots() == nil {
		return fmt.Errorf("%w: the cluster has not recorded its %d raft groups yet (it is forming): try again", api.ErrNotWritten, n.opts.Groups)
	}
	if term != nil {
		// Group 0's stream: its identity is what peers confirm (a group
		// after 0 has no peers yet).
		if err := term(ctx); err != nil {
			return err
		}
		select {
		case <-n.rejoin.Fence():
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for the peers to confirm this stream's identity: %w", api.ErrNotWritten, ctx.Err())
		}
	}
	return n.sat.Admit(ctx)
}

// writes routes a write to its raft group: proposed here where this node
// leads the group, to the group's leader otherwise. It holds what it uses.
type writes struct {
	keys *groups.Router
	// follower proposes to group 0's leader (nil: a node alone),
	// followers[g-1] to group g's.
	follower  *forward.Follower
	followers []*forward.Follower
	closing   *atomic.Bool
	removed   func() error
}

// Propose is Node.Propose.
func (wr *writes) Propose(ctx context.Context, w api.Write) (api.WriteResult, error) {
	return wr.propose(ctx, w, ctx.Value(proposeHereKey{}) == nil)
}

// proposeHere proposes w to this node's committer of its group: it is
// refused (not written) unless this node leads the group, so a forwarded
// proposal takes one hop.
func (wr *writes) proposeHere(ctx context.Context, w api.Write) (api.WriteResult, error) {
	return wr.propose(ctx, w, false)
}

// propose routes w to its group, and to the group's leader when forward
// allows it and this node does not lead the group.
func (wr *writes) propose(ctx context.Context, w api.Write, forward bool) (api.WriteResult, error) {
	g, err := wr.groupFor(ctx, w)
	switch {
	case err != nil:
		return api.WriteResult{}, err
	case g == nil:
		return wr.proposeEvery(ctx, w) // a range delete over several groups
	}
	if forward && wr.follower != nil && !g.Rep.Ready() {
		if wr.closing.Load() {
			return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrClosed, api.ErrNotWritten)
		}
		if err := wr.removed(); err != nil {
			return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		f := wr.follower
		if g.Number > 0 {
			f = wr.followers[g.Number-1]
		}
		return f.Propose(ctx, w)
	}
	return proposeIn(ctx, g, w)
}

// proposeIn proposes w to group g's committer at this node.
func proposeIn(ctx context.Context, g *groups.Group, w api.Write) (api.WriteResult, error) {
	p, err := g.Sub.Prepare(w)
	if err != nil {
		return api.WriteResult{}, err
	}
	if err := g.Sub.Enqueue(ctx, p); err != nil {
		return api.WriteResult{}, err
	}
	return g.Sub.Await(ctx, p)
}

// groupFor is the group a write goes to (groups.Router.For), or the one
// WithGroup names for a range delete's part.
func (wr *writes) groupFor(ctx context.Context, w api.Write) (*groups.Group, error) {
	if wr.keys.Set == nil {
		return wr.keys.Zero, nil // one group: no context to read on every write
	}
	if g, ok := forward.GroupFrom(ctx); ok && w.Entry.Op == entry.OpDeleteRange && w.Ops == nil {
		if g < 0 || g >= wr.keys.Count() {
			return nil, fmt.Errorf("%w: %w: group %d of %d", api.ErrNotWritten, api.ErrBadRequest, g, wr.keys.Count())
		}
		return wr.keys.Group(g), nil
	}
	return wr.keys.For(w)
}

// applied is this node's applied index in w's group (forward.Leader).
func (wr *writes) applied(ctx context.Context, w api.Write) uint64 {
	if g, err := wr.groupFor(ctx, w); err == nil && g != nil {
		return g.Rep.Applied()
	}
	return wr.keys.Zero.Rep.Applied()
}

// proposeEvery fans a range delete out to every group, each deleting its
// keys in the range: not atomic across groups. It is not written when no
// group wrote it, of unknown outcome when some did and others failed (a
// retry completes it).
func (wr *writes) proposeEvery(ctx context.Context, w api.Write) (api.WriteResult, error) {
	var first api.WriteResult
	var errs []error
	wrote := false
	for _, g := range wr.keys.All() {
		res, err := wr.Propose(forward.WithGroup(ctx, g.Number), w)
		if err != nil {
			errs = append(errs, fmt.Errorf("group %d: %w", g.Number, err))
			continue
		}
		if !wrote {
			first, wrote = res, true
		}
	}
	switch err := errors.Join(errs...); {
	case err == nil:
		return first, nil
	case wrote || !errors.Is(err, api.ErrNotWritten):
		return api.WriteResult{}, fmt.Errorf("%w: a range delete over %d raft groups, some of which deleted: %w", api.ErrUnknownOutcome, wr.keys.Count(), err)
	default:
		return api.WriteResult{}, err
	}
}
