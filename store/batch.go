package store

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
)

// Batch gathers merges and bookkeeping that commit atomically. It holds the
// store's apply lock from NewBatch to Close, so reads inside it see every
// committed write and the batch's own earlier merges. Not safe for concurrent
// use; always Close it.
type Batch struct {
	// collected is the collection cutoff the batch sets (nil: none); the
	// store keeps it once the batch commits.
	collected *hlc.Timestamp
	s         *Store
	pb        *pebble.Batch
	pending   map[string]pendingRecord
	expect    int // keys the batch expects to write (Reserve)
	closed    bool
	buf       []byte
	// max is the highest stamp stored or merged so far, as this batch sees;
	// maxOwn says a blind write of this batch set it.
	max    entry.Stamp
	maxOwn bool
	// pendingIdem holds idempotency records merged in this batch.
	pendingIdem map[string]*IdemRecord
	// pendingCtr holds counters merged in this batch.
	pendingCtr map[string]*Counter
	// pendingRanges are range tombstones added by this batch.
	pendingRanges []RangeTombstone
	// replaceRanges, when set, is the store's range list after collection.
	replaceRanges *[]RangeTombstone
	// rangesGrown: a pending range tombstone replaces a shorter one of the
	// same stamp and start (MergeRange).
	rangesGrown bool
	// LegacyRangePieces applies range deletes as builds before command
	// format 7 did: a piece of a range delete that begins where a kept one
	// does is written over it, shorter or not. The machine sets it while
	// the log is below that format, so that every node of a cluster keeps
	// the same range tombstones whatever its build.
	LegacyRangePieces bool
	// hlc is the clock high-water mark this batch raises the store's to
	// (zero: it does not).
	hlc hlc.Timestamp
	// marks are the high-water marks this batch sets (deleted: a zero
	// Origin), for the store's copy once it commits.
	marks []markChange
	// backfilled are the B keys this batch set, backfillCleared the
	// senders whose B keys it cleared (backfill.go).
	backfilled      map[string]bool
	backfillCleared map[string]bool
	// judge, when set (Track), sees every version a merge discards.
	judge    Judge
	tracking bool
	// it reads the committed data keys of a tracking batch.
	it *pebble.Iterator
	// pendingConflicts are the conflict records this batch wrote (nil:
	// removed), by key and ID.
	pendingConflicts map[string]map[string]*entry.Conflict
	// conflictStats are the log's figures as this batch left them (nil:
	// untouched).
	conflictStats *ConflictStats
	// RangeDeleted counts the live keys the batch's range deletes deleted.
	RangeDeleted int
	// leafMoves are what the batch's merges add to the leaves, applied
	// at its commit (leaves.go).
	leafMoves []leafMove
	// liveMoves is what the batch adds to the store's count of live keys.
	liveMoves int64
	digester  hashtree.Digester
	// deletedRecords are the keys whose records the batch deleted, for
	// the version cache (versions.go).
	deletedRecords []string
}

// Judge is told of every merge of a tracked batch, before it is written:
// the key's version before (nil: none stored), the write, and the outcome
// last-writer-wins decided (Applied: prev is discarded; Stale: the write
// is). It returns whether the conflict log holds records of the key after
// this merge (the record's Conflicted flag). It must not keep prev: its
// value is only valid during the call.
type Judge func(prev *Record, w *Write, out entry.Outcome) (conflicted bool, err error)

// Track makes every later merge of the batch read what its key holds (no
// blind write), give a local write its causal context (Write.Local), and
// tell j of what it discards (j may be nil: contexts only).
func (b *Batch) Track(j Judge) {
	b.judge = j
	b.tracking = true
}

type pendingRecord struct {
	stamp entry.Stamp
	flags byte
	// digest is the record's leaf digest (zero for a tombstone).
	digest hashtree.Sum
	// rec is the whole record while the batch tracks versions (Track).
	rec *Record
	// held: the tree may have held the key before the batch wrote rec.
	held bool
}

// NewBatch starts a batch and takes the apply lock.
func (s *Store) NewBatch() *Batch {
	s.applyMu.Lock()
	return &Batch{s: s, pb: s.db.NewBatch(), max: s.maxStamp}
}

// Close releases the batch and the apply lock; committed or not.
func (b *Batch) Close() {
	if b.closed {
		return
	}
	b.closed = true
	if b.it != nil {
		b.it.Close()
	}
	b.pb.Close()
	b.s.applyMu.Unlock()
}

// Len is the number of Pebble operations in the batch.
func (b *Batch) Len() int { return int(b.pb.Count()) }

// currentLocked returns the stamp and flags stored for key, looking at the
// batch's own pending writes first.
func (b *Batch) currentLocked(key string, dk []byte) (entry.Stamp, byte, bool, error) {
	if p, ok := b.pending[key]; ok {
		return p.stamp, p.flags, true, nil
	}
	v, closer, err := b.s.db.Get(dk)
	if errors.Is(err, pebble.ErrNotFound) {
		return entry.Stamp{}, 0, false, nil
	}
	if err != nil {
		return entry.Stamp{}, 0, false, fmt.Errorf("store: get %q: %w", key, err)
	}
	st, flags, err := decodeStampOnly(v)
	closer.Close()
	if err != nil {
		return entry.Stamp{}, 0, false, fmt.Errorf("store: key %q: %w", key, err)
	}
	return st, flags, true, nil
}

// Stored returns the stamp stored for key as this batch would see it, and
// whether the key holds a tombstone. ok is false when nothing is stored.
func (b *Batch) Stored(key string) (st entry.Stamp, tombstone, ok bool, err error) {
	st, flags, ok, err := b.currentLocked(key, dataKey(key))
	return st, flags&flagTombstone != 0, ok, err
}

// recordLocked returns the whole record stored for key, the batch's own
// pending writes first. done releases the value (call it once done with
// the record).
func (b *Batch) recordLocked(key string, dk []byte) (r *Record, done func(), err error) {
	if p, ok := b.pending[key]; ok {
		if p.rec == nil {
			return nil, nil, fmt.Errorf("store: key %q was merged by this batch before it tracked versions", key)
		}
		return p.rec, func() {}, nil
	}
	// One iterator for the batch's reads: a Get builds its iterators
	// anew each time, and a seek of a key no table holds is answered by
	// the tables' bloom filters. The batch holds the apply lock, so no
	// data key changes under it; the value is valid until the next seek.
	if b.it == nil {
		it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
		if err != nil {
			return nil, nil, fmt.Errorf("store: get %q: %w", key, err)
		}
		b.it = it
	}
	if !b.it.SeekPrefixGE(dk) || !bytes.Equal(b.it.Key(), dk) {
		if err := b.it.Error(); err != nil {
			return nil, nil, fmt.Errorf("store: get %q: %w", key, err)
		}
		return nil, func() {}, nil
	}
	rec, err := DecodeRecord(b.it.Value())
	if err != nil {
		return nil, nil, fmt.Errorf("store: key %q: %w", key, err)
	}
	return &rec, func() {}, nil
}

// Merge applies w last-writer-wins and reports what it did. A tombstone is
// written even for a key that was never stored: it keeps an older write that
// arrives later from resurrecting the key.
func (b *Batch) Merge(w Write) (entry.Outcome, error) {
	if w.Stamp.Origin == "" || len(w.Stamp.Origin) > maxOriginLen {
		return 0, fmt.Errorf("store: merge %q: origin %q out of range", w.Key, w.Stamp.Origin)
	}
	if b.tracking {
		return b.mergeTracked(&w)
	}
	dk := dataKey(w.Key)
	var (
		cur      entry.Stamp
		curFlags byte
		ok       bool
		err      error
		blind    bool
	)
	if !b.aboveLocked(&w) {
		// Something stored may be newer: compare with what the key holds.
		// (Above b.max the write beats everything, unread. A tombstone
		// overwritten that way leaves its index entry behind, which
		// collection recognises as stale.)
		cur, curFlags, ok, err = b.currentLocked(w.Key, dk)
		if err != nil {
			return 0, err
		}
	} else {
		b.max = w.Stamp
		b.maxOwn = true
		blind = true
	}
	if ok {
		switch c := w.Stamp.Compare(cur); {
		case c == 0:
			return entry.Duplicate, nil
		case c < 0:
			return entry.Stale, nil
		}
	}
	if !blind && b.coveredLocked(w.Key, w.Stamp) {
		// A range delete newer than this write covers its key.
		return entry.Stale, nil
	}
	if ok {
		if curFlags&flagTombstone != 0 {
			// The old tombstone's index entry is dropped with it.
			if err := b.pb.Delete(tombstoneKey(cur.HLC, w.Key), nil); err != nil {
				return 0, err
			}
		}
	}
	r := Record{Stamp: w.Stamp, Tombstone: w.Tombstone, Kind: w.Kind, Value: w.Value, Expires: w.Expires}
	if w.Tombstone && w.Kind == KindPlain {
		r.Value = nil
	}
	prev, err := b.prevDigestLocked(w.Key, dk)
	if err != nil {
		return 0, err
	}
	digest, err := b.setRecordLocked(dk, &r, prev)
	if err != nil {
		return 0, err
	}
	var flags byte
	if w.Tombstone {
		flags |= flagTombstone
		if err := b.pb.Set(tombstoneKey(w.Stamp.HLC, w.Key), nil, nil); err != nil {
			return 0, err
		}
	} else if r.Expires != 0 {
		if err := b.pb.Set(expiryKey(r.Expires, w.Key), nil, nil); err != nil {
			return 0, err
		}
	}
	if b.pending == nil {
		b.pending = make(map[string]pendingRecord, b.expect)
	}
	b.pending[w.Key] = pendingRecord{stamp: w.Stamp, flags: flags, digest: digest}
	return entry.Applied, nil
}

// Reserve tells the batch it is about to write about n keys, so that it
// sizes its bookkeeping once (a group of thousands of keys grew it a
// little at a time).
func (b *Batch) Reserve(n int) {
	if b.pending == nil {
		b.expect = n
	}
}

// Commit writes the batch atomically. sync asks Pebble to fsync its own WAL;
// the node's local write path passes false because the outbound WAL, already
// fsynced, is the redo log; the acceptor passes true because nothing else
// holds what it applies.
func (b *Batch) Commit(sync bool) error {
	if b.pb.Empty() {
		return nil
	}
	raised := b.s.maxStamp.Compare(b.max) < 0
	if raised {
		v := b.max.HLC.AppendTo(make([]byte, 0, hlc.EncodedLen+len(b.max.Origin)))
		if err := b.pb.Set(keyMaxStamp, append(v, b.max.Origin...), nil); err != nil {
			return err
		}
	}
	wo := pebble.NoSync
	if sync {
		wo = pebble.Sync
	}
	if err := b.pb.Commit(wo); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	if raised {
		b.s.maxStamp = b.max
	}
	b.cacheCommittedLocked()
	if b.collected != nil {
		b.s.collected.Store(b.collected)
	}
	b.leavesCommittedLocked()
	if b.s.hlcHigh.Less(b.hlc) {
		b.s.hlcHigh = b.hlc
	}
	if b.replaceRanges != nil {
		b.s.ranges = *b.replaceRanges
	}
	if len(b.pendingCtr) > 0 {
		b.s.hasCounters.Store(true)
	}
	for _, c := range b.marks {
		b.s.setMarkLocked(c)
	}
	b.s.ranges = append(b.s.ranges, b.pendingRanges...)
	if b.rangesGrown {
		b.s.ranges = longestPerStart(b.s.ranges)
	}
	return nil
}

// longestPerStart keeps, of the range tombstones of one stamp and start
// (one record in the tree), the one reaching furthest, in order.
func longestPerStart(rs []RangeTombstone) []RangeTombstone {
	type id struct {
		st    entry.Stamp
		start string
	}
	best := map[id]int{}
	out := rs[:0:0]
	for _, r := range rs {
		k := id{r.Stamp, r.Start}
		i, ok := best[k]
		switch {
		case !ok:
			best[k] = len(out)
			out = append(out, r)
		case out[i].End != "" && (r.End == "" || r.End > out[i].End):
			out[i].End = r.End
		}
	}
	return out
}
