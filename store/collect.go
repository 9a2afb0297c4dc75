package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
)

// CollectTombstones removes tombstones whose stamp is below cutoff and reports
// how many it removed. The caller picks cutoff so that no write older than a
// collected tombstone can still arrive (see DESIGN.md "Replication"). At most
// max tombstones go per call, so a large backlog does not hold the apply lock
// for long; max <= 0 means 10,000.
func (s *Store) CollectTombstones(cutoff hlc.Timestamp, max int) (int, error) {
	b := s.NewBatch()
	defer b.Close()
	n, err := b.CollectTombstones(cutoff, max)
	if err != nil {
		return n, err
	}
	return n, b.Commit(true)
}

// CollectTombstones is Store.CollectTombstones in the batch (a command of
// the cluster's log: every node collects the same).
func (b *Batch) CollectTombstones(cutoff hlc.Timestamp, max int) (int, error) {
	return b.CollectTombstonesKeeping(cutoff, max, nil)
}

// Keeper says which tombstones a collection leaves: Keep reports a key's
// tombstone (isRange false) or a range delete [start, end) to keep (end
// "": the end of the key space), and Kept is told each one left, with the
// bytes it holds (its record and its index entry, or its range record).
// origin is the cluster that wrote the delete.
type Keeper interface {
	Keep(start, end, origin string, isRange bool) bool
	Kept(start, end, origin string, isRange bool, bytes int)
}

// CollectTombstonesKeeping is CollectTombstones leaving the tombstones and
// range tombstones below cutoff that keep names (nil: none). What it
// leaves does not count against max, and is met again at every collection:
// a link narrowed for long keeps them until a widening carried them, or the
// operator released them.
func (b *Batch) CollectTombstonesKeeping(cutoff hlc.Timestamp, max int, keep Keeper) (int, error) {
	if max <= 0 {
		max = 10000
	}
	upper := tombstoneKey(cutoff, "")
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTombstone}, UpperBound: upper})
	if err != nil {
		return 0, fmt.Errorf("store: collect tombstones: %w", err)
	}
	n := 0
	for valid := it.First(); valid && n < max; valid = it.Next() {
		ik := it.Key()
		ts, err := hlc.Decode(ik[1 : 1+hlc.EncodedLen])
		if err != nil {
			it.Close()
			return n, fmt.Errorf("store: tombstone index: %w: %v", ErrCorrupt, err)
		}
		key := string(ik[1+hlc.EncodedLen:])
		st, flags, ok, err := b.currentLocked(key, dataKey(key))
		if err != nil {
			it.Close()
			return n, err
		}
		// Only the very tombstone this index entry names goes; a key that
		// was written again since keeps its newer state (and the stale
		// index entry goes, kept range or not).
		live := ok && flags&flagTombstone != 0 && st.HLC == ts
		if live && keep != nil && keep.Keep(key, "", st.Origin, false) {
			// Its record and index entry, about: a tombstone's record is
			// its key, its stamp and a context of a few origins.
			keep.Kept(key, "", st.Origin, false, 2*len(ik)+64)
			continue
		}
		if err := b.pb.Delete(bytes.Clone(ik), nil); err != nil {
			it.Close()
			return n, err
		}
		if live {
			if err := b.deleteRecordLocked(key, dataKey(key)); err != nil {
				it.Close()
				return n, err
			}
			if err := b.collectCounterLocked(key, cutoff); err != nil {
				it.Close()
				return n, err
			}
			n++
		}
	}
	if err := it.Close(); err != nil {
		return n, fmt.Errorf("store: collect tombstones: %w", err)
	}
	rn, err := b.collectRanges(cutoff, keep)
	if err != nil {
		return n + rn, err
	}
	xn, err := b.collectExpired(cutoff, max, keep)
	return n + rn + xn, err
}

// collectCounterLocked drops key's counter with its collected tombstone
// when it counts nothing beyond its floors (a deleted counter) and is
// stamped below cutoff. A relay carries a component's floors with its
// totals, so a total relayed later cannot count again what a delete
// removed.
func (b *Batch) collectCounterLocked(key string, cutoff hlc.Timestamp) error {
	if !b.s.hasCounters.Load() {
		return nil
	}
	c, ok, err := b.Counter(key)
	if err != nil || !ok || c.Counts() || !c.Stamp.HLC.Less(cutoff) {
		return err
	}
	if err := b.pb.Delete(counterKey(key), nil); err != nil {
		return err
	}
	if b.pendingCtr == nil {
		b.pendingCtr = map[string]*Counter{}
	}
	b.pendingCtr[key] = &Counter{Totals: map[string]entry.PN{}} // none, as the batch reads it
	return nil
}

// collectExpired drops the versions that expired at or before cutoff's
// wall time and are stamped below cutoff: as for a tombstone, no write
// older than them can still arrive, and every peer holds them (or a
// re-seed's snapshot was taken before). keep leaves those a narrowed link
// must still carry, as it leaves tombstones. An index entry of a version
// since replaced goes alone.
func (b *Batch) collectExpired(cutoff hlc.Timestamp, max int, keep Keeper) (int, error) {
	if cutoff.Wall <= 0 {
		return 0, nil
	}
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixExpiry}, UpperBound: expiryKey(cutoff.Wall+1, "")})
	if err != nil {
		return 0, fmt.Errorf("store: collect expired versions: %w", err)
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid && n < max; valid = it.Next() {
		ik := it.Key()
		if len(ik) < 9 {
			return n, fmt.Errorf("store: expiry index entry of %d bytes: %w", len(ik), ErrCorrupt)
		}
		expires, key := int64(binary.BigEndian.Uint64(ik[1:9])), string(ik[9:])
		if _, mine := b.pending[key]; mine {
			continue // written by this batch: its own index entry stands
		}
		dk := dataKey(key)
		rec, err := b.s.Get(key)
		found := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return n, err
		}
		current := found && !rec.Tombstone && rec.Expires == expires
		if current && !rec.Stamp.HLC.Less(cutoff) {
			continue // a write older than it may still arrive: it must win
		}
		if current && keep != nil && keep.Keep(key, "", rec.Stamp.Origin, false) {
			keep.Kept(key, "", rec.Stamp.Origin, false, len(dk)+len(rec.Value)+64)
			continue
		}
		if err := b.pb.Delete(bytes.Clone(ik), nil); err != nil {
			return n, err
		}
		if current {
			if err := b.deleteRecordLocked(key, dk); err != nil {
				return n, err
			}
			prev := versionDigest(&b.digester, key, &rec)
			b.moveLeafLocked(key, prev, hashtree.Sum{})
			if err := b.movePlainLiveLocked(key, prev, hashtree.Sum{}); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, it.Error()
}
