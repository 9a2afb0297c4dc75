package node

import (
	"context"
	"fmt"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/replica"
)

// submitter is the write path's admission and queueing, split in two so
// that a caller may queue several writes in order before waiting for any
// (a RESP connection's pipeline: one group commit, its order kept). It
// holds what it uses: the bounds of a write, the admission's checks and
// the committer.
type submitter struct {
	bounds *bounds
	com    *replica.Committer
	// admit admits a write before it queues (the node open and in its
	// cluster, its term begun, its stream's identity confirmed, and not
	// saturated); an error says the write was not written.
	admit func(ctx context.Context) error
}

// newSubmitter is the node's submitter.
func newSubmitter(n *Node) *submitter {
	return &submitter{bounds: &n.bounds, com: n.com, admit: func(ctx context.Context) error {
		if n.closing.Load() {
			return fmt.Errorf("%w: %w", api.ErrClosed, api.ErrNotWritten)
		}
		if err := n.rep.Removed(); err != nil {
			return fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		if err := n.rep.AwaitTerm(ctx); err != nil {
			return err
		}
		select {
		case <-n.rejoin.Fence():
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for the peers to confirm this stream's identity: %w", api.ErrNotWritten, ctx.Err())
		}
		return n.sat.Admit(ctx)
	}}
}

// prepare checks a write of the API and makes it a proposal.
func (w *submitter) prepare(wr api.Write) (*replica.Proposal, error) {
	e := wr.Entry
	var err error
	switch {
	case wr.Ops != nil:
		e, err = w.bounds.batchEntry(wr.Ops)
	case e.Op == entry.OpDeleteRange:
		err = w.bounds.checkRange(e.Key, e.End)
	case e.Op == entry.OpSet || e.Op == entry.OpDelete || e.Op == entry.OpCounter:
		if err = w.bounds.checkKey(e.Key); err == nil {
			err = w.bounds.checkValue(e.Key, len(e.Value))
		}
	default:
		err = fmt.Errorf("%w: op %d is not a write of the API", api.ErrBadRequest, e.Op)
	}
	if err != nil {
		return nil, err
	}
	return &replica.Proposal{Entry: e, Idem: wr.Keyed, Cond: wr.Cond, Delta: wr.Delta}, nil
}

// Submit queues a write behind every write submitted before it returned,
// and returns its wait (resp.Node). Admission (a leader, the identity
// fence, saturation) happens here, in order; an error is wait's.
func (w *submitter) Submit(ctx context.Context, wr api.Write) func() (api.WriteResult, error) {
	p, err := w.prepare(wr)
	if err == nil {
		err = w.enqueue(ctx, p)
	}
	if err != nil {
		return func() (api.WriteResult, error) { return api.WriteResult{}, err }
	}
	return func() (api.WriteResult, error) { return w.await(ctx, p) }
}

// enqueue admits a prepared proposal and queues it behind those enqueued
// before it, without waiting for its commit.
func (w *submitter) enqueue(ctx context.Context, p *replica.Proposal) error {
	idem := p.Idem
	if err := w.admit(ctx); err != nil {
		return err
	}
	if k, ok := policy.KeyFrom(ctx); ok && idem == nil {
		p.Pin = k.HLC
		p.Idem = scopedWrite(k, p)
	}
	return w.com.Enqueue(ctx, p)
}

// await waits for an enqueued proposal and returns what it did.
func (w *submitter) await(ctx context.Context, p *replica.Proposal) (api.WriteResult, error) {
	if err := w.com.Await(ctx, p); err != nil {
		return api.WriteResult{}, err
	}
	// Read once the committer is done with it (it fills in the entry).
	e := p.Entry
	if p.Replay != nil {
		return api.WriteResult{Key: e.Key, Version: p.Replay.Stamp.String(), Origin: p.Replay.Stamp.Origin,
			Outcome: entry.Duplicate, Replay: p.Replay}, nil
	}
	st := p.Entry.LWW()
	return api.WriteResult{Key: e.Key, Version: st.String(), Origin: st.Origin, Outcome: p.Outcome, Index: p.Entry.Index, Stream: p.Entry.Stream,
		Existed: p.Existed, Counter: p.CounterValue}, nil
}
