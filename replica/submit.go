package replica

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/policy"
)

// Submitter is the write path's admission and queueing, split in two so
// that a caller may queue several writes in order before waiting for any
// (a RESP connection's pipeline: one group commit, its order kept). It
// holds what it uses: the bounds of a write, the admission's checks and
// the committer.
type Submitter struct {
	Bounds *Bounds
	Com    *Committer
	// Format is the command format the cluster's log is at (nil: the
	// newest this build reads).
	Format func() int
	// admit admits a write before it queues (the node open and in its
	// cluster, its term begun, its stream's identity confirmed, and not
	// saturated); an error says the write was not written.
	Admit func(ctx context.Context) error
}

// Prepare checks a write of the API and makes it a proposal.
func (w *Submitter) Prepare(wr api.Write) (*Proposal, error) {
	e := wr.Entry
	var err error
	switch {
	case wr.Ops != nil:
		e, err = w.Bounds.BatchEntry(wr.Ops)
	case e.Op == entry.OpDeleteRange:
		err = w.Bounds.CheckRange(e.Key, e.End)
	case e.Op == entry.OpSet || e.Op == entry.OpDelete || e.Op == entry.OpCounter:
		if err = w.Bounds.CheckKey(e.Key); err == nil {
			err = w.Bounds.CheckValue(e.Key, len(e.Value))
		}
	default:
		err = fmt.Errorf("%w: op %d is not a write of the API", api.ErrBadRequest, e.Op)
	}
	if err == nil && wr.Cond != nil && len(wr.Cond.Keys) > 0 {
		err = w.checkKeyVersions(wr)
	}
	if err == nil && e.HasExpiry() {
		err = w.checkExpiry(&e)
	}
	if err != nil {
		return nil, err
	}
	return &Proposal{Entry: e, Idem: wr.Keyed, Cond: wr.Cond, Delta: wr.Delta}, nil
}

// checkKeyVersions checks a batch's condition on keys' versions: only a
// batch has one, each key valid, and every node of the cluster reads it
// (command format 10), or it is not written.
func (w *Submitter) checkKeyVersions(wr api.Write) error {
	if wr.Ops == nil {
		return fmt.Errorf("%w: a condition on keys' versions is a batch's", api.ErrBadRequest)
	}
	if n := len(wr.Cond.Keys); n > api.MaxConditionKeys {
		return fmt.Errorf("%w: a condition on %d keys, limit %d", api.ErrBadRequest, n, api.MaxConditionKeys)
	}
	for _, kv := range wr.Cond.Keys {
		if err := w.Bounds.CheckKey(kv.Key); err != nil {
			return fmt.Errorf("the condition: %w", err)
		}
	}
	if w.Format != nil {
		if f := w.Format(); f < machine.FormatBatchConditions {
			return fmt.Errorf("%w: a write conditional on keys' versions (a transaction that reads, or WATCH) needs command format %d; "+
				"the cluster's log is at %d until every node runs a build that reads it (a rolling upgrade: docs/OPERATIONS.md)",
				api.ErrNotWritten, machine.FormatBatchConditions, f)
		}
	}
	return nil
}

// checkExpiry checks a write with an expiry: on a set, after the epoch,
// and every node of the cluster reads it (command format 11), or it is not
// written.
func (w *Submitter) checkExpiry(e *entry.Entry) error {
	if e.Expires < 0 || (e.Expires != 0 && e.Op != entry.OpSet) {
		return fmt.Errorf("%w: an expiry on %s", api.ErrBadRequest, e.Op)
	}
	if w.Format != nil {
		if f := w.Format(); f < machine.FormatExpiry {
			return fmt.Errorf("%w: a write that expires needs command format %d; the cluster's log is at %d until every node "+
				"runs a build that reads it (a rolling upgrade: docs/OPERATIONS.md)", api.ErrNotWritten, machine.FormatExpiry, f)
		}
	}
	return nil
}

// Submit queues a write behind every write submitted before it returned,
// and returns its wait (resp.Node). Admission (a leader, the identity
// fence, saturation) happens here, in order; an error is wait's.
func (w *Submitter) Submit(ctx context.Context, wr api.Write) func() (api.WriteResult, error) {
	p, err := w.Prepare(wr)
	if err == nil {
		err = w.Enqueue(ctx, p)
	}
	if err != nil {
		return func() (api.WriteResult, error) { return api.WriteResult{}, err }
	}
	return func() (api.WriteResult, error) { return w.Await(ctx, p) }
}

// Enqueue admits a prepared proposal and queues it behind those enqueued
// before it, without waiting for its commit.
func (w *Submitter) Enqueue(ctx context.Context, p *Proposal) error {
	idem := p.Idem
	if err := w.Admit(ctx); err != nil {
		return err
	}
	if k, ok := policy.KeyFrom(ctx); ok && idem == nil {
		p.Pin = k.HLC
		p.Idem = scopedWrite(k, p)
	}
	return w.Com.Enqueue(ctx, p)
}

// Await waits for an enqueued proposal and returns what it did.
func (w *Submitter) Await(ctx context.Context, p *Proposal) (api.WriteResult, error) {
	if err := w.Com.Await(ctx, p); err != nil {
		return api.WriteResult{}, err
	}
	// Read once the committer is done with it (it fills in the entry).
	e := p.Entry
	if p.Replay != nil {
		return api.WriteResult{Key: e.Key, Version: p.Replay.Stamp.String(), Origin: p.Replay.Stamp.Origin,
			Outcome: entry.Duplicate, Replay: p.Replay}, nil
	}
	if e.Index == 0 {
		// A delete of keys that hold no value here wrote nothing.
		return api.WriteResult{Key: e.Key, Existed: p.Existed}, nil
	}
	st := p.Entry.LWW()
	return api.WriteResult{Key: e.Key, Version: st.String(), Origin: st.Origin, Outcome: p.Outcome, Index: p.Entry.Index, Stream: p.Entry.Stream,
		Existed: p.Existed, Counter: p.CounterValue}, nil
}

// scopedWrite makes a write under an idempotency scope (policy.WithKey) a
// keyed request, as scopedIncrement does for increments: its pinned stamp
// makes a retry a tie, and its record makes a retry that reaches another
// leader (whose clock may be behind the pin by more than the clock offset)
// answered from the first attempt's record before the pin is checked,
// instead of refused although it applied.
func scopedWrite(k policy.Key, p *Proposal) *api.Keyed {
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
		for _, kv := range c.Keys {
			fmt.Fprintf(h, "\x00%d:%s\x00%d:%s", len(kv.Key), kv.Key, len(kv.Version), kv.Version)
		}
	}
	fmt.Fprintf(h, "\x00%s", k.HLC)
	return &api.Keyed{Key: k.ID, Fingerprint: h.Sum(nil), Answer: answer}
}

// ScopedIncrement makes an increment under an idempotency scope
// (policy.WithKey) a keyed request: a pinned stamp makes a retried put a tie,
// but a counter delta is not deduplicated by its stamp, so the scope's key
// and pinned HLC identify the operation, recorded with the write, and a
// retry replays the first answer instead of adding the delta again.
func ScopedIncrement(ctx context.Context, key string, delta int64) *api.Keyed {
	k, ok := policy.KeyFrom(ctx)
	if !ok || k.ID == "" || len(k.ID) > entry.MaxIdemKey {
		return nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "go-scope\x00counter\x00%d:%s\x00%d\x00%s", len(key), key, delta, k.HLC)
	return &api.Keyed{Key: k.ID, Fingerprint: h.Sum(nil), Answer: machine.AnswerCounter}
}
