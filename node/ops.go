package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
)

// condPtr is c, or nil when it asks nothing.
func condPtr(c api.Condition) *api.Condition {
	if c.IfMatch == "" && !c.IfNoneMatch {
		return nil
	}
	return &c
}

// PutIf writes value at key if the condition holds (ErrPrecondition, a
// *PreconditionError with the current version, otherwise).
func (n *Node) PutIf(ctx context.Context, key string, value []byte, c api.Condition) (api.WriteResult, error) {
	return n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: value}, Cond: condPtr(c)})
}

// DeleteIf deletes key if the condition holds.
func (n *Node) DeleteIf(ctx context.Context, key string, c api.Condition) (api.WriteResult, error) {
	return n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpDelete, Key: key}, Cond: condPtr(c)})
}

// DeleteRange deletes every key in [start, end) (end "" = to the end of the
// key space) as of one stamp, on every cluster: keys with an older stamp go,
// newer writes survive, and older writes that arrive later stay deleted.
func (n *Node) DeleteRange(ctx context.Context, start, end string) (api.WriteResult, error) {
	return n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: start, End: end}})
}

// Increment adds delta (negative decrements) to the PN-counter at key. The
// write carries this cluster's resulting totals, so a re-applied increment
// is a no-op wherever it lands.
func (n *Node) Increment(ctx context.Context, key string, delta int64) (api.CounterResult, error) {
	res, err := n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: key}, Delta: delta,
		Keyed: replica.ScopedIncrement(ctx, key, delta)})
	if err != nil {
		return api.CounterResult{}, err
	}
	c, err := n.Counter(key)
	c.Origin = res.Origin
	return c, err
}

// Counter reads a counter (ErrNotFound when the key holds none).
func (n *Node) Counter(key string) (api.CounterResult, error) {
	if err := n.bounds.CheckKey(key); err != nil {
		return api.CounterResult{}, err
	}
	g := n.keys.Of(key)
	if err := g.Rep.Readable(); err != nil {
		return api.CounterResult{}, err
	}
	// A key's plain integer and its counter read as one.
	v, _, _, err := g.Store.Read(key, n.clock.Physical())
	if err != nil {
		return api.CounterResult{}, err
	}
	val, isInt := entry.ParseInt(v.Value)
	switch {
	case !v.Present:
		return api.CounterResult{}, fmt.Errorf("%w: no counter %q", api.ErrNotFound, key)
	case !v.Counted && !isInt:
		return api.CounterResult{}, fmt.Errorf("%w: %q holds a value that is not an integer", api.ErrNotInteger, key)
	case v.Counted:
		val = v.Int
	}
	c, err := g.Store.Counter(key)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return api.CounterResult{}, err
	}
	return api.CounterResult{Key: key, Value: val, Version: v.Version.String(), Totals: entry.ClusterTotals(c.Totals), Components: c.Totals}, nil
}

// Batch applies ops atomically under one stamp: one WAL entry, one Pebble
// batch here and at every peer, never partly visible.
func (n *Node) Batch(ctx context.Context, ops []api.BatchOp) (api.WriteResult, error) {
	if ops == nil {
		ops = []api.BatchOp{} // refused as empty, as a batch
	}
	return n.Propose(ctx, api.Write{Ops: ops})
}
