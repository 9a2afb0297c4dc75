package store

import (
	"fmt"

	"github.com/replicator/replicator/entry"
)

// ApplyEntry merges an entry into the batch: its write last-writer-wins, and
// the idempotency record it carries, if any. Every path that applies entries
// (the local committer, recovery from the WAL, the acceptor) goes through it,
// so an entry means the same wherever it lands.
func (b *Batch) ApplyEntry(e *entry.Entry) (entry.Outcome, error) { return b.applyEntry(e, false) }

// ApplyLocal is ApplyEntry of this cluster's own new write: in a batch that
// tracks versions it gives each key written its causal context (e.Ctx, or
// the op's in a batch), which the entry then carries to every peer.
func (b *Batch) ApplyLocal(e *entry.Entry) (entry.Outcome, error) { return b.applyEntry(e, b.tracking) }

func (b *Batch) applyEntry(e *entry.Entry, local bool) (entry.Outcome, error) {
	var out entry.Outcome
	var err error
	if e.Oversize > 0 {
		return 0, fmt.Errorf("%w: entry %d is an oversize stub of %d bytes: its payload never arrived", entry.ErrMalformed, e.Index, e.Oversize)
	}
	if e.IsMarker() {
		return 0, fmt.Errorf("%w: entry %d is a filtered marker: it has nothing to apply", entry.ErrMalformed, e.Index)
	}
	switch e.Op {
	case entry.OpSet, entry.OpDelete:
		w := Write{Key: e.Key, Value: e.Value, Tombstone: e.Op == entry.OpDelete, Stamp: e.LWW(), Ctx: e.Ctx, Local: local, Expires: e.Expires}
		if e.Restores != nil {
			w.Also = e.Restores.Loser
		}
		out, err = b.mergeWrite(&w)
		if local {
			e.Ctx = w.Ctx
		}
		if err == nil && len(e.Floors) > 0 {
			_, err = b.MergeFloors(e.Key, e.Floors, e.LWW())
		}
	case entry.OpDeleteRange:
		out, _, err = b.MergeRange(RangeTombstone{Start: e.Key, End: e.End, Stamp: e.LWW()})
	case entry.OpCounter:
		if e.Clears {
			// The key's expired value goes first: the increment counts
			// from zero (its floors remove what was counted before).
			w := Write{Key: e.Key, Tombstone: true, Stamp: e.LWW(), Ctx: e.Ctx, Local: local}
			if _, err := b.mergeWrite(&w); err != nil {
				return 0, err
			}
			if local {
				e.Ctx = w.Ctx
			}
		}
		if len(e.Floors) > 0 {
			if _, err := b.MergeFloors(e.Key, e.Floors, e.LWW()); err != nil {
				return 0, err
			}
		}
		out, err = b.MergeCounter(e.Key, e.CounterComponent(), *e.Ctr, e.LWW())
	case entry.OpMulti:
		// One stamp for every write; the caller commits them in one batch,
		// so a reader sees all of them or none.
		out = entry.Duplicate
		for i := range e.Ops {
			op := &e.Ops[i]
			var o entry.Outcome
			var err error
			if op.Op == entry.OpDeleteRange {
				// A range delete a link's filter cut into parts.
				o, _, err = b.MergeRange(RangeTombstone{Start: op.Key, End: op.End, Stamp: e.LWW()})
			} else {
				w := Write{Key: op.Key, Value: op.Value, Tombstone: op.Op == entry.OpDelete, Stamp: e.LWW(), Ctx: op.Ctx, Local: local, Expires: op.Expires}
				o, err = b.mergeWrite(&w)
				if local {
					op.Ctx = w.Ctx
				}
				if err == nil && len(op.Floors) > 0 {
					_, err = b.MergeFloors(op.Key, op.Floors, e.LWW())
				}
			}
			if err != nil {
				return 0, err
			}
			if o == entry.Applied || (o == entry.Stale && out == entry.Duplicate) {
				out = o
			}
		}
	default:
		return 0, fmt.Errorf("%w: entry %d: unknown op %d", entry.ErrMalformed, e.Index, e.Op)
	}
	if err != nil {
		return 0, err
	}
	if e.Idem != nil {
		rec := IdemRecord{Key: e.Idem.Key, Fingerprint: e.Idem.Fingerprint, Status: e.Idem.Status,
			Body: e.Idem.Body, Stamp: e.LWW(), Expires: e.Idem.Expires}
		if _, err := b.MergeIdem(&rec); err != nil {
			return 0, err
		}
	}
	return out, nil
}
