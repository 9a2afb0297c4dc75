package store

import (
	"bytes"

	"github.com/replicator/replicator/hashtree"

	"github.com/replicator/replicator/entry"
)

// mergeWrite is Merge that gives the caller back what the merge set in w
// (a local write's context).
func (b *Batch) mergeWrite(w *Write) (entry.Outcome, error) {
	if b.tracking {
		if w.Stamp.Origin == "" || len(w.Stamp.Origin) > maxOriginLen {
			return b.Merge(*w) // refused there
		}
		return b.mergeTracked(w)
	}
	return b.Merge(*w)
}

// mergeTracked is Merge in a batch that tracks versions (Track): it always
// reads what the key holds, because a version a write discards must be
// seen to be judged, and a local write's context is what its cluster held
// for the key. This is the read the blind path saves; it is paid only once
// the cluster's log keeps contexts (command format 4).
func (b *Batch) mergeTracked(w *Write) (entry.Outcome, error) {
	dk := dataKey(w.Key)
	var (
		prev *Record
		done = func() {}
		err  error
	)
	// prevDigest is prev's leaf digest when the version cache gave prev
	// (it has no value to digest).
	var prevDigest *hashtree.Sum
	held := b.s.seen.mayHold(dk)
	if held {
		c := b.s.versions
		if _, mine := b.pending[w.Key]; !mine {
			if v, ok := c.get(w.Key); ok && v.answers(w) {
				prev, prevDigest = v.record(), &v.digest
				c.hits.Add(1)
			}
		}
		if prev == nil {
			if prev, done, err = b.recordLocked(w.Key, dk); err != nil {
				return 0, err
			}
			if c.half > 0 {
				c.misses.Add(1)
			}
		}
	}
	// else: a key the tree never held (seen.go): nothing to read, to
	// judge, or to descend from.
	defer done()
	above := b.aboveLocked(w)
	if w.Local {
		var ps entry.Stamp
		var pc entry.Context
		if prev != nil {
			ps, pc = prev.Stamp, prev.Ctx
		}
		w.Ctx = entry.Descend(pc, ps, w.Stamp)
		if w.Also.Origin != "" {
			w.Ctx = w.Ctx.With(w.Also.Origin, w.Also.HLC)
		}
	}
	out := entry.Applied
	if prev != nil {
		switch c := w.Stamp.Compare(prev.Stamp); {
		case c == 0:
			return entry.Duplicate, nil
		case c < 0:
			out = entry.Stale
		}
	}
	if !above && b.coveredLocked(w.Key, w.Stamp) {
		// A range delete newer than this write covers its key: its
		// discards are counted per range, not judged per key. (Also when
		// the write is older than the key's version: that may be the
		// range's own tombstone, which carries no context.)
		return entry.Stale, nil
	}
	conflicted := prev != nil && prev.Conflicted
	if b.judge != nil {
		if conflicted, err = b.judge(prev, w, out); err != nil {
			return 0, err
		}
	}
	if out == entry.Stale {
		if conflicted != prev.Conflicted {
			// The key's version stays; only its flag changes.
			r := *prev
			r.Value = bytes.Clone(prev.Value)
			r.Ctx = append(entry.Context(nil), prev.Ctx...)
			r.Conflicted = conflicted
			if err := b.putRecordLocked(w.Key, dk, &r, versionDigest(&b.digester, w.Key, prev), true); err != nil {
				return 0, err
			}
		}
		return entry.Stale, nil
	}
	if prev != nil && prev.Tombstone {
		// The old tombstone's index entry is dropped with it.
		if err := b.pb.Delete(tombstoneKey(prev.Stamp.HLC, w.Key), nil); err != nil {
			return 0, err
		}
	}
	r := Record{Stamp: w.Stamp, Tombstone: w.Tombstone, Kind: w.Kind, Value: w.Value, Ctx: w.Ctx, Conflicted: conflicted, Expires: w.Expires}
	if w.Tombstone && w.Kind == KindPlain {
		r.Value = nil
	}
	if w.Tombstone {
		if err := b.pb.Set(tombstoneKey(w.Stamp.HLC, w.Key), nil, nil); err != nil {
			return 0, err
		}
	} else if r.Expires != 0 {
		if err := b.pb.Set(expiryKey(r.Expires, w.Key), nil, nil); err != nil {
			return 0, err
		}
	}
	var pd hashtree.Sum
	if prevDigest != nil {
		pd = *prevDigest
	} else {
		pd = versionDigest(&b.digester, w.Key, prev)
	}
	if err := b.putRecordLocked(w.Key, dk, &r, pd, held); err != nil {
		return 0, err
	}
	if above {
		b.max, b.maxOwn = w.Stamp, true
	}
	return entry.Applied, nil
}

// setRecordLocked writes r as the record of data key dk, where the key's
// version had the leaf digest prev, and returns r's digest. It is the only
// way a record enters the tree outside ReplaceFrom: it keeps the keys filter
// (seen.go) free of false negatives, and the leaves (leaves.go) true.
func (b *Batch) setRecordLocked(dk []byte, r *Record, prev hashtree.Sum) (hashtree.Sum, error) {
	b.buf = AppendRecord(b.buf[:0], r)
	if err := b.pb.Set(dk, b.buf, nil); err != nil {
		return hashtree.Sum{}, err
	}
	b.s.seen.add(dk)
	key := string(dk[1:])
	next := versionDigest(&b.digester, key, r)
	b.moveLeafLocked(key, prev, next)
	return next, b.movePlainLiveLocked(key, prev, next)
}

// aboveLocked reports whether w is stamped above every stamp stored, so
// that it beats whatever its key holds. Equal to b.max counts when b.max
// is this batch's own stamp (an atomic batch writes many keys under one),
// except for the keys this batch already wrote.
func (b *Batch) aboveLocked(w *Write) bool {
	switch c := b.max.Compare(w.Stamp); {
	case c < 0:
		return true
	case c == 0 && b.maxOwn:
		_, mine := b.pending[w.Key]
		return !mine
	}
	return false
}

// putRecordLocked writes r as key's record in the batch, over a version of
// leaf digest prev (zero: none, or a tombstone), and remembers it for the
// batch's later merges of the key. held says the tree may have held a
// version of the key before: only then does the commit cache r (versions.go).
func (b *Batch) putRecordLocked(key string, dk []byte, r *Record, prev hashtree.Sum, held bool) error {
	digest, err := b.setRecordLocked(dk, r, prev)
	if err != nil {
		return err
	}
	var flags byte
	if r.Tombstone {
		flags |= flagTombstone
	}
	if b.pending == nil {
		b.pending = make(map[string]pendingRecord, b.expect)
	}
	b.pending[key] = pendingRecord{stamp: r.Stamp, flags: flags, rec: r, digest: digest, held: held}
	return nil
}
