package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/hashtree"
)

// Kept leaf hashes (issue 30, work in progress: no command turns them on
// yet). Measured (go test ./store -run X -bench BenchmarkHashedWrites
// -benchtime 400000x -count 3): batches of 100 fresh keys cost 2.1-2.3 µs a
// write tracked, 3.9-4.3 µs hashed with the changed leaves written in each
// batch (a leaf key per write: twice the memtable inserts), 2.8-3.0 µs
// hashed with the leaves kept in memory only. So the leaves should not be
// written per batch: keep them in memory, write them at a clean stop (and
// now and then) with the log index they stand for, and rebuild them by a
// scan at a start whose index does not match (the issue's "a crash that may
// have lost the hashes"). A batch that hashes (Batch.Hash) keeps, for each leaf of the
// hashtree, the sum of the digests of its live versions: every merge it
// applies subtracts the version it replaces and adds the one it writes, and
// the changed leaves commit with the data, in the same Pebble batch, so the
// leaves can never disagree with the tree after a crash. Tombstones stay
// out, as they stay out of the digest (clusters collect them at different
// times).
//
//	H<leaf:2>    a leaf's sum, when not zero (hashtree.Sum.AppendTo)
const prefixLeaf = 'H'

func leafKey(leaf int) []byte {
	return binary.BigEndian.AppendUint16([]byte{prefixLeaf}, uint16(leaf))
}

// loadLeaves reads the kept leaves (nil when none is kept).
func (s *Store) loadLeaves() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLeaf}, UpperBound: []byte{prefixLeaf + 1}})
	if err != nil {
		return err
	}
	var leaves []hashtree.Sum
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) != 3 {
			it.Close()
			return fmt.Errorf("%w: a leaf key of %d bytes", ErrCorrupt, len(k))
		}
		sum, err := hashtree.DecodeSum(it.Value())
		if err != nil {
			it.Close()
			return fmt.Errorf("%w: leaf %d: %v", ErrCorrupt, binary.BigEndian.Uint16(k[1:]), err)
		}
		if leaves == nil {
			leaves = make([]hashtree.Sum, hashtree.Leaves)
		}
		leaves[binary.BigEndian.Uint16(k[1:])] = sum
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	s.leaves = leaves
	return nil
}

// Leaves returns a copy of the kept leaf sums (nil: none kept yet).
func (s *Store) Leaves() []hashtree.Sum {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if s.leaves == nil {
		return nil
	}
	return append([]hashtree.Sum(nil), s.leaves...)
}

// ScanLeaves computes the leaf sums from the data itself, on one consistent
// view: what the kept leaves must equal (a rebuild, and the check that the
// tree did not change beneath them).
func (s *Store) ScanLeaves() ([]hashtree.Sum, error) {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return nil, fmt.Errorf("store: scan leaves: %w", err)
	}
	defer it.Close()
	leaves := make([]hashtree.Sum, hashtree.Leaves)
	var d hashtree.Digester
	for valid := it.First(); valid; valid = it.Next() {
		key := string(it.Key()[1:])
		r, err := DecodeRecord(it.Value())
		if err != nil {
			return nil, fmt.Errorf("store: scan leaves: key %q: %w", key, err)
		}
		if r.Tombstone {
			continue
		}
		l := hashtree.Leaf(key)
		leaves[l] = leaves[l].Add(versionDigest(&d, key, &r))
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("store: scan leaves: %w", err)
	}
	return leaves, nil
}

// RebuildLeaves replaces the kept leaves by a scan of the data (when they
// are first kept, or after a check found them wrong). No batch runs
// meanwhile.
func (s *Store) RebuildLeaves() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	leaves, err := s.ScanLeaves()
	if err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange([]byte{prefixLeaf}, []byte{prefixLeaf + 1}, nil); err != nil {
		return err
	}
	for i, sum := range leaves {
		if !sum.IsZero() {
			if err := b.Set(leafKey(i), sum.AppendTo(nil), nil); err != nil {
				return err
			}
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("store: rebuild leaves: %w", err)
	}
	s.leaves = leaves
	return nil
}

func versionDigest(d *hashtree.Digester, key string, r *Record) hashtree.Sum {
	return d.Digest(key, r.Stamp, byte(r.Kind), hashtree.ValueHash(r.Value))
}

// Hash makes the batch keep the leaf sums (it tracks versions too: a leaf
// is kept from the version a merge replaces). The store's leaves must have
// been built (RebuildLeaves) before the first such batch.
func (b *Batch) Hash() {
	b.Track(b.judge)
	b.hashing = true
}

// hashMergeLocked moves key's leaf from version prev (nil or a tombstone:
// none) to next (nil or a tombstone: none).
func (b *Batch) hashMergeLocked(key string, prev, next *Record) error {
	if !b.hashing {
		return nil
	}
	if b.s.leaves == nil {
		return fmt.Errorf("store: a hashing batch before the leaves were built")
	}
	l := hashtree.Leaf(key)
	sum, ok := b.pendingLeaves[l]
	if !ok {
		sum = b.s.leaves[l]
	}
	if prev != nil && !prev.Tombstone {
		sum = sum.Sub(versionDigest(&b.digester, key, prev))
	}
	if next != nil && !next.Tombstone {
		sum = sum.Add(versionDigest(&b.digester, key, next))
	}
	if b.pendingLeaves == nil {
		b.pendingLeaves = map[int]hashtree.Sum{}
	}
	b.pendingLeaves[l] = sum
	return nil
}

// commitLeavesLocked writes the leaves the batch changed, before its commit.
func (b *Batch) commitLeavesLocked() error {
	for l, sum := range b.pendingLeaves {
		var err error
		if sum.IsZero() {
			err = b.pb.Delete(leafKey(l), nil)
		} else {
			err = b.pb.Set(leafKey(l), sum.AppendTo(nil), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
