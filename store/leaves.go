package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/hashtree"
)

// Kept leaf hashes (issue 30, work in progress: no command turns them on
// yet). A batch that hashes (Batch.Hash) keeps, for each leaf of the
// hashtree, the sum of the digests of its live versions: every merge it
// applies subtracts the version it replaces and adds the one it writes.
// Tombstones stay out, as they stay out of the digest (clusters collect
// them at different times).
//
// The leaves live in memory: the batch updates them at its commit. Writing
// the changed leaves in each batch cost +80 % a write (a leaf key per
// write: twice the memtable inserts); kept in memory, hashed writes cost the
// same as tracked ones (go test ./store -run X -bench BenchmarkHashedWrites
// -benchtime 400000x -count 3: 2.74-2.79 against 2.74-2.80 µs, batches of
// 100 fresh keys). So: the first hashing batch after the leaves were saved
// writes a dirty mark with its data; SaveLeaves (at Close, and whenever its
// caller likes) writes every leaf and clears the mark in one batch. A tree
// opened with the mark set (a crash), or with no leaves saved, keeps none
// until RebuildLeaves scans the data (the issue's "a crash that may have
// lost the hashes"). A batch that changes data without hashing while leaves
// are kept drops them: they would be wrong.
//
//	H<leaf:2>    a leaf's sum, when not zero (hashtree.Sum.AppendTo)
//	m\x00leaves  empty: saved leaves exist; value 1: the data changed since
const prefixLeaf = 'H'

var keyLeaves = []byte("m\x00leaves")

func leafKey(leaf int) []byte {
	return binary.BigEndian.AppendUint16([]byte{prefixLeaf}, uint16(leaf))
}

// loadLeaves reads the saved leaves, when they are still the data's (nil
// otherwise: none saved, or the data changed after they were).
func (s *Store) loadLeaves() error {
	s.leaves, s.leavesMarked = nil, false
	mark, ok, err := s.getMeta(keyLeaves)
	if err != nil || !ok || len(mark) != 0 {
		return err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLeaf}, UpperBound: []byte{prefixLeaf + 1}})
	if err != nil {
		return err
	}
	leaves := make([]hashtree.Sum, hashtree.Leaves)
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
	s.leaves = leaves
	return s.saveLeavesLocked()
}

// SaveLeaves writes the kept leaves, synced, so that the next open finds
// them without a scan.
func (s *Store) SaveLeaves() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	return s.saveLeavesLocked()
}

func (s *Store) saveLeavesLocked() error {
	if s.leaves == nil {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange([]byte{prefixLeaf}, []byte{prefixLeaf + 1}, nil); err != nil {
		return err
	}
	for i, sum := range s.leaves {
		if !sum.IsZero() {
			if err := b.Set(leafKey(i), sum.AppendTo(nil), nil); err != nil {
				return err
			}
		}
	}
	if err := b.Set(keyLeaves, nil, nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("store: save leaves: %w", err)
	}
	s.leavesMarked = false
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

// markLeavesLocked writes, before the batch's commit, that the data moved
// from the saved leaves (once per save), or drops the kept leaves when the
// batch changed data without keeping them.
func (b *Batch) markLeavesLocked() error {
	if b.s.leaves == nil || (!b.dataChanged && len(b.pendingLeaves) == 0) || b.s.leavesMarked {
		return nil
	}
	return b.pb.Set(keyLeaves, []byte{1}, nil)
}

// leavesCommittedLocked updates the kept leaves once the batch committed.
func (b *Batch) leavesCommittedLocked() {
	if b.s.leaves == nil || (!b.dataChanged && len(b.pendingLeaves) == 0) {
		return
	}
	b.s.leavesMarked = true
	if b.dataChanged && !b.hashing {
		b.s.leaves = nil // wrong now: rebuilt by a scan
		return
	}
	for l, sum := range b.pendingLeaves {
		b.s.leaves[l] = sum
	}
}
