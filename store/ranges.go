package store

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// Range tombstones (key space r, keys.go): a range delete writes a point
// tombstone, under its own stamp, on every key of the range holding an older
// stamp, and keeps a range tombstone so that an older write arriving later
// for a key of the range stays deleted. Newer writes survive. They are
// collected like point tombstones.

func decodeRange(k, v []byte) (RangeTombstone, error) {
	if len(k) < 1+hlc.EncodedLen+2 {
		return RangeTombstone{}, fmt.Errorf("%w: range tombstone key", ErrCorrupt)
	}
	ts, err := hlc.Decode(k[1 : 1+hlc.EncodedLen])
	if err != nil {
		return RangeTombstone{}, fmt.Errorf("%w: range tombstone: %v", ErrCorrupt, err)
	}
	rest := k[1+hlc.EncodedLen:]
	i := bytes.IndexByte(rest, 0)
	if i <= 0 {
		return RangeTombstone{}, fmt.Errorf("%w: range tombstone origin", ErrCorrupt)
	}
	return RangeTombstone{Start: string(rest[i+1:]), End: string(v), Stamp: entry.Stamp{HLC: ts, Origin: string(rest[:i])}}, nil
}

func (s *Store) loadRanges() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRange}, UpperBound: []byte{prefixRange + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		r, err := decodeRange(it.Key(), it.Value())
		if err != nil {
			return err
		}
		s.ranges = append(s.ranges, r)
		// The max stamp covers the ranges too (a tree whose recorded max
		// was lost is derived from its data keys only): a write stamped
		// above it skips the ranges' check.
		if s.maxStamp.Compare(r.Stamp) < 0 {
			s.maxStamp = r.Stamp
		}
	}
	return it.Error()
}

// RangeTombstones lists the range tombstones kept.
func (s *Store) RangeTombstones() []RangeTombstone {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	return append([]RangeTombstone(nil), s.ranges...)
}

// coveredLocked reports whether a range tombstone newer than st covers key.
func (b *Batch) coveredLocked(key string, st entry.Stamp) bool {
	for _, list := range [][]RangeTombstone{b.s.ranges, b.pendingRanges} {
		for i := range list {
			if list[i].Stamp.Compare(st) > 0 && list[i].Covers(key) {
				return true
			}
		}
	}
	return false
}

// MergeRange applies a range delete: every key of the range holding an older
// stamp gets a tombstone under the range's stamp, and the range tombstone is
// kept. It reports how many keys it deleted; Duplicate when the very range
// delete was applied before.
func (b *Batch) MergeRange(r RangeTombstone) (entry.Outcome, int, error) {
	if r.End != "" && r.End <= r.Start {
		return 0, 0, fmt.Errorf("store: range [%q, %q) is empty", r.Start, r.End)
	}
	for _, list := range [][]RangeTombstone{b.s.ranges, b.pendingRanges} {
		for _, x := range list {
			if b.LegacyRangePieces && x.Stamp == r.Stamp && x.Start == r.Start && x.End == r.End {
				return entry.Duplicate, 0, nil
			}
			if b.LegacyRangePieces || x.Stamp != r.Stamp || x.Start != r.Start {
				continue
			}
			// One record per stamp and start (rangeKey): the same range
			// delete kept whole, or in a piece that begins where r does (a
			// filtered link carries the part it lets cross, a backfill
			// another). A piece r covers adds nothing; a longer r grows the
			// record to its end, never shrinks it (a shorter piece written
			// over the whole would let an older write back into the rest).
			if x.End == "" || (r.End != "" && r.End <= x.End) {
				return entry.Duplicate, 0, nil
			}
			b.rangesGrown = true
		}
	}
	// Keys of the range: stored ones, and this batch's own.
	var keys []string
	lower := dataKey(r.Start)
	upper := []byte{prefixData + 1}
	if r.End != "" {
		upper = dataKey(r.End)
	}
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return 0, 0, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		keys = append(keys, string(it.Key()[1:]))
	}
	if err := it.Close(); err != nil {
		return 0, 0, err
	}
	seen := map[string]bool{}
	for _, k := range keys {
		seen[k] = true
	}
	for k := range b.pending {
		if r.Covers(k) && !seen[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	deleted := 0
	for _, k := range keys {
		st, tomb, ok, err := b.Stored(k)
		if err != nil {
			return 0, 0, err
		}
		if !ok || tomb || st.Compare(r.Stamp) >= 0 {
			continue
		}
		if _, err := b.Merge(Write{Key: k, Tombstone: true, Stamp: r.Stamp, Range: true}); err != nil {
			return 0, 0, err
		}
		deleted++
	}
	if err := b.pb.Set(rangeKey(&r), []byte(r.End), nil); err != nil {
		return 0, 0, err
	}
	b.RangeDeleted += deleted
	b.pendingRanges = append(b.pendingRanges, r)
	if b.max.Compare(r.Stamp) < 0 {
		b.max, b.maxOwn = r.Stamp, false
	}
	return entry.Applied, deleted, nil
}

// collectRanges drops range tombstones older than cutoff (the store's list
// changes when the batch commits).
func (b *Batch) collectRanges(cutoff hlc.Timestamp, keeper Keeper) (int, error) {
	keep := make([]RangeTombstone, 0, len(b.s.ranges))
	n := 0
	for _, r := range b.s.ranges {
		if r.Stamp.HLC.Less(cutoff) && keeper != nil && keeper.Keep(r.Start, r.End, r.Stamp.Origin, true) {
			keeper.Kept(r.Start, r.End, r.Stamp.Origin, true, len(rangeKey(&r))+64)
		} else if r.Stamp.HLC.Less(cutoff) {
			if err := b.pb.Delete(rangeKey(&r), nil); err != nil {
				return n, err
			}
			n++
			continue
		}
		keep = append(keep, r)
	}
	if n > 0 {
		b.replaceRanges = &keep
	}
	return n, nil
}
