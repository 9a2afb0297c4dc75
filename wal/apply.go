package wal

import (
	"fmt"

	"github.com/replicator/replicator/store"
)

// Apply merges the entry into a store batch: its write last-writer-wins, and
// the idempotency record it carries, if any. Every path that applies entries
// (the local committer, recovery from the WAL, the acceptor) goes through it,
// so an entry means the same wherever it lands.
func (e *Entry) Apply(b *store.Batch) (store.Outcome, error) {
	var out store.Outcome
	var err error
	if e.Oversize > 0 {
		return 0, fmt.Errorf("%w: entry %d is an oversize stub of %d bytes: its payload never arrived", ErrMalformed, e.Index, e.Oversize)
	}
	switch e.Op {
	case store.OpSet, store.OpDelete:
		out, err = b.Merge(store.Write{Key: e.Key, Value: e.Value, Tombstone: e.Op == store.OpDelete, Stamp: e.LWW()})
	case store.OpDeleteRange:
		out, _, err = b.MergeRange(store.RangeTombstone{Start: e.Key, End: e.End, Stamp: e.LWW()})
	case store.OpCounter:
		out, err = b.MergeCounter(e.Key, e.CounterComponent(), *e.Ctr, e.LWW())
	case store.OpMulti:
		// One stamp for every write; the caller commits them in one batch,
		// so a reader sees all of them or none.
		out = store.Duplicate
		for _, op := range e.Ops {
			o, err := b.Merge(store.Write{Key: op.Key, Value: op.Value, Tombstone: op.Op == store.OpDelete, Stamp: e.LWW()})
			if err != nil {
				return 0, err
			}
			if o == store.Applied || (o == store.Stale && out == store.Duplicate) {
				out = o
			}
		}
	default:
		return 0, fmt.Errorf("%w: entry %d: unknown op %d", ErrMalformed, e.Index, e.Op)
	}
	if err != nil {
		return 0, err
	}
	if e.Idem != nil {
		rec := store.IdemRecord{Key: e.Idem.Key, Fingerprint: e.Idem.Fingerprint, Status: e.Idem.Status,
			Body: e.Idem.Body, Stamp: e.LWW(), Expires: e.Idem.Expires}
		if _, err := b.MergeIdem(&rec); err != nil {
			return 0, err
		}
	}
	return out, nil
}
