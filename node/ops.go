package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// bounds are what a write may be: a key and a value within this node's
// limits and within what every peer said it accepts (a write a peer would
// refuse could never replicate there), a batch that fits a replication
// batch, a range that is neither empty nor everything, a pinned stamp
// within the pin window.
type bounds struct {
	opts  *Options
	clock *hlc.Clock
	links func() []*transport.Shipper
}

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

// checkRange refuses a range delete of no key or of every key.
func (b *bounds) checkRange(start, end string) error {
	if end == "" && strings.Trim(start, "\x00") == "" {
		// [NUL..., end of the key space) holds every key there is.
		return fmt.Errorf("%w: the range [%q, end) holds every key; deleting everything is not an API call", api.ErrBadRequest, start)
	}
	if err := errors.Join(b.checkKey(start), b.checkValue(start, 0)); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if end != "" {
		if err := errors.Join(b.checkKey(end), b.checkValue(end, 0)); err != nil {
			return fmt.Errorf("end: %w", err)
		}
		if end <= start {
			return fmt.Errorf("%w: the range [%q, %q) is empty", api.ErrInvalidKey, start, end)
		}
	}
	return nil
}

// Increment adds delta (negative decrements) to the PN-counter at key. The
// write carries this cluster's resulting totals, so a re-applied increment
// is a no-op wherever it lands.
func (n *Node) Increment(ctx context.Context, key string, delta int64) (api.CounterResult, error) {
	res, err := n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: key}, Delta: delta,
		Keyed: scopedIncrement(ctx, key, delta)})
	if err != nil {
		return api.CounterResult{}, err
	}
	c, err := n.Counter(key)
	c.Origin = res.Origin
	return c, err
}

// scopedWrite makes a write under an idempotency scope (policy.WithKey) a
// keyed request, as scopedIncrement does for increments: its pinned stamp
// makes a retry a tie, and its record makes a retry that reaches another
// leader (whose clock may be behind the pin by more than the clock offset)
// answered from the first attempt's record before the pin is checked,
// instead of refused although it applied.
func scopedWrite(k policy.Key, p *replica.Proposal) *api.Keyed {
	if k.ID == "" || len(k.ID) > entry.MaxIdemKey || p.Entry.Op == entry.OpCounter {
		return nil
	}
	answer := machine.AnswerWrite
	switch p.Entry.Op {
	case entry.OpDeleteRange:
		answer = machine.AnswerRange
	case entry.OpMulti:
		answer = machine.AnswerBatch
	}
	h := sha256.New()
	e := &p.Entry
	fmt.Fprintf(h, "go-scope\x00write\x00%d\x00%d:%s\x00%d:%s\x00%d:", e.Op, len(e.Key), e.Key, len(e.End), e.End, len(e.Value))
	h.Write(e.Value)
	for _, op := range e.Ops {
		fmt.Fprintf(h, "\x00%d\x00%d:%s\x00%d:", op.Op, len(op.Key), op.Key, len(op.Value))
		h.Write(op.Value)
	}
	if c := p.Cond; c != nil {
		fmt.Fprintf(h, "\x00if-match:%s\x00if-none-match:%v", c.IfMatch, c.IfNoneMatch)
	}
	fmt.Fprintf(h, "\x00%s", k.HLC)
	return &api.Keyed{Key: k.ID, Fingerprint: h.Sum(nil), Answer: answer}
}

// scopedIncrement makes an increment under an idempotency scope
// (policy.WithKey) a keyed request: a pinned stamp makes a retried put a tie,
// but a counter delta is not deduplicated by its stamp, so the scope's key
// and pinned HLC identify the operation, recorded with the write, and a
// retry replays the first answer instead of adding the delta again.
func scopedIncrement(ctx context.Context, key string, delta int64) *api.Keyed {
	k, ok := policy.KeyFrom(ctx)
	if !ok || k.ID == "" || len(k.ID) > entry.MaxIdemKey {
		return nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "go-scope\x00counter\x00%d:%s\x00%d\x00%s", len(key), key, delta, k.HLC)
	return &api.Keyed{Key: k.ID, Fingerprint: h.Sum(nil), Answer: machine.AnswerCounter}
}

// Counter reads a counter (ErrNotFound when the key holds none).
func (n *Node) Counter(key string) (api.CounterResult, error) {
	if err := n.bounds.checkKey(key); err != nil {
		return api.CounterResult{}, err
	}
	if err := n.rep.Readable(); err != nil {
		return api.CounterResult{}, err
	}
	c, err := n.store.Counter(key)
	if errors.Is(err, store.ErrNotFound) {
		return api.CounterResult{}, fmt.Errorf("%w: no counter %q", api.ErrNotFound, key)
	}
	if err != nil {
		return api.CounterResult{}, err
	}
	// Totals are kept per stream (see entry.Component); a reader wants them
	// per cluster.
	totals := make(map[string]entry.PN, len(c.Totals))
	for comp, t := range c.Totals {
		cl := entry.ComponentCluster(comp)
		sum := totals[cl]
		sum.P += t.P
		sum.N += t.N
		totals[cl] = sum
	}
	return api.CounterResult{Key: key, Value: c.Value(), Version: c.Stamp.String(), Totals: totals, Components: c.Totals}, nil
}

// Batch applies ops atomically under one stamp: one WAL entry, one Pebble
// batch here and at every peer, never partly visible.
func (n *Node) Batch(ctx context.Context, ops []api.BatchOp) (api.WriteResult, error) {
	if ops == nil {
		ops = []api.BatchOp{} // refused as empty, as a batch
	}
	return n.Propose(ctx, api.Write{Ops: ops})
}

func (b *bounds) batchEntry(ops []api.BatchOp) (entry.Entry, error) {
	if len(ops) == 0 {
		return entry.Entry{}, fmt.Errorf("%w: a batch needs at least one op", api.ErrBadRequest)
	}
	if len(ops) > wire.MaxBatchOps {
		return entry.Entry{}, fmt.Errorf("%w: %d ops, limit %d", api.ErrBadRequest, len(ops), wire.MaxBatchOps)
	}
	// One stamp for every op: a key twice would tie with itself, and the
	// first would win; keep the last, as a caller reading the list expects.
	last := make(map[string]int, len(ops))
	for i, op := range ops {
		last[op.Key] = i
	}
	e := entry.Entry{Op: entry.OpMulti, Ops: make([]entry.BatchOp, 0, len(last))}
	size := 0
	for i, op := range ops {
		if err := b.checkKey(op.Key); err != nil {
			return e, fmt.Errorf("op %d: %w", i, err)
		}
		if err := b.checkValue(op.Key, len(op.Value)); err != nil {
			return e, fmt.Errorf("op %d: %w", i, err)
		}
		if op.Delete && len(op.Value) > 0 {
			return e, fmt.Errorf("%w: op %d deletes %q with a value", api.ErrBadRequest, i, op.Key)
		}
		size += len(op.Key) + len(op.Value)
		if last[op.Key] != i {
			continue
		}
		w := entry.BatchOp{Op: entry.OpSet, Key: op.Key, Value: op.Value}
		if op.Delete {
			w.Op = entry.OpDelete
		}
		e.Ops = append(e.Ops, w)
	}
	if int64(size) > b.opts.MaxReplicateBytes/2 {
		return e, fmt.Errorf("%w: a batch of %d bytes would not fit a replication batch", api.ErrValueTooLarge, size)
	}
	if err := b.checkValue("", size); err != nil {
		return e, fmt.Errorf("the batch as a whole: %w", err)
	}
	return e, nil
}
