package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
)

// Kept leaf hashes (docs/ANTIENTROPY.md). The store keeps, for each leaf of
// the hashtree, the sum of the digests of its live versions: plain values
// and counters. Every batch that writes or removes a record subtracts the
// digest of what the key held and adds the digest of what it holds now, in
// the batch's bookkeeping; the store's leaves take the batch's sums when it
// commits. Tombstones stay out, as they stay out of the digest (clusters
// collect them at different times); range tombstones are compared as a list
// of their own (few, and kept in memory).
//
// The leaves live in memory only (16 MiB): they are built by the scan of the
// data the store already does at Open for the keys filter (seen.go), and by
// ReplaceFrom as it copies a tree. So no crash can leave them behind the
// data, and nothing is written per batch for them: writing the changed
// leaves in each batch cost +80 % a write at the store (go test ./store -run
// X -bench BenchmarkHashedWrites), in memory they cost the digest of the
// version written and of the one replaced.
//
// Every node of a cluster applies the same log to the same tree, so every
// node holds the same leaves without a command of their own: they are a
// function of the data.

// counterDigestKind tells a counter's digest from a plain version's (the
// two key spaces may hold the same key).
const counterDigestKind = 0xc0

// versionDigest is the digest of a live plain version (zero for none or a
// tombstone).
func versionDigest(d *hashtree.Digester, key string, r *Record) hashtree.Sum {
	if r == nil || r.Tombstone {
		return hashtree.Sum{}
	}
	return d.Digest(key, r.Stamp, byte(r.Kind), plainValueHash(r))
}

// plainValueHash is the hash a plain version's digest covers: its value's,
// with its expiry folded in. A version without one hashes as before (no
// hashtree version raise): a peer that cannot keep expiry never holds one.
func plainValueHash(r *Record) uint64 {
	vh := hashtree.ValueHash(r.Value)
	if r.Expires != 0 {
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], vh)
		binary.BigEndian.PutUint64(b[8:], uint64(r.Expires))
		vh = hashtree.ValueHash(b[:])
	}
	return vh
}

// counterDigest is the digest of a counter: its totals, not its stamp (two
// converged clusters agree on totals exactly; a re-seed relays totals, not
// the stamps of every delta, as in the digest).
//
// A counter that counts nothing beyond its floors (deleted) has none, as a
// tombstone: each cluster collects it at its own pace.
func counterDigest(d *hashtree.Digester, key string, c *Counter) hashtree.Sum {
	if c == nil || !c.Counts() {
		return hashtree.Sum{}
	}
	return d.Digest(key, entry.Stamp{}, counterDigestKind, hashtree.ValueHash(appendCounterTotals(nil, c)))
}

// leafScan sums the leaves of a tree as a pass over its keys sees them.
type leafScan struct {
	leaves []hashtree.Sum
	// live counts the keys that hold a value: a live plain version, or a
	// counter that counts (beyond its floors) on a key with none.
	live int64
	d    hashtree.Digester
	err  error
	// plainLive reads whether a key holds a live plain version (for a
	// counter's count); nil counts every counter that counts.
	plainLive func(dk []byte) (bool, error)
}

// see adds the record at k (any key of the tree: others are skipped).
func (ls *leafScan) see(k, v []byte) {
	if ls.leaves == nil {
		ls.leaves = make([]hashtree.Sum, hashtree.Leaves)
	}
	if len(k) == 0 || ls.err != nil {
		return
	}
	var (
		key = string(k[1:])
		sum hashtree.Sum
	)
	switch k[0] {
	case prefixData:
		r, err := DecodeRecord(v)
		if err != nil {
			ls.err = fmt.Errorf("store: key %q: %w", key, err)
			return
		}
		sum = versionDigest(&ls.d, key, &r)
	case prefixCounter:
		c, err := DecodeCounter(v)
		if err != nil {
			ls.err = fmt.Errorf("store: counter %q: %w", key, err)
			return
		}
		sum = counterDigest(&ls.d, key, &c)
		if c.Counts() {
			plain := false
			if ls.plainLive != nil {
				if plain, err = ls.plainLive(dataKey(key)); err != nil {
					ls.err = fmt.Errorf("store: key %q: %w", key, err)
					return
				}
			}
			if !plain {
				ls.live++
			}
		}
	default:
		return
	}
	if !sum.IsZero() {
		l := hashtree.Leaf(key)
		ls.leaves[l] = ls.leaves[l].Add(sum)
		if k[0] == prefixData {
			ls.live++
		}
	}
}

// plainLiveIn reads from db whether the data key dk holds a live plain
// version.
func plainLiveIn(db pebble.Reader) func(dk []byte) (bool, error) {
	return func(dk []byte) (bool, error) {
		v, closer, err := db.Get(dk)
		if errors.Is(err, pebble.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		defer closer.Close()
		r, err := DecodeRecord(v)
		return err == nil && !r.Tombstone, err
	}
}

// scanTree is the pass over a tree's data and counters that builds its keys
// filter and its leaves.
func scanTree(db pebble.Reader) (*seenKeys, *seenKeys, []hashtree.Sum, int64, error) {
	var (
		sc seenScan
		cs = seenScan{counters: true}
		ls = leafScan{plainLive: plainLiveIn(db)}
	)
	for _, p := range []byte{prefixData, prefixCounter} {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
		if err != nil {
			return nil, nil, nil, 0, fmt.Errorf("store: scan keys: %w", err)
		}
		for valid := it.First(); valid; valid = it.Next() {
			sc.see(it.Key())
			cs.see(it.Key())
			ls.see(it.Key(), it.Value())
		}
		if err := errors.Join(it.Error(), it.Close(), ls.err); err != nil {
			return nil, nil, nil, 0, fmt.Errorf("store: scan keys: %w", err)
		}
	}
	ls.see(nil, nil) // an empty tree has its (zero) leaves too
	return sc.filter(), cs.filter(), ls.leaves, ls.live, nil
}

// Leaves returns a copy of the kept leaf sums: those of every batch
// committed so far (nil while a snapshot's tree is copied in, or after that
// copy failed, until RebuildLeaves).
func (s *Store) Leaves() []hashtree.Sum {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if !s.leavesValid {
		return nil
	}
	return append([]hashtree.Sum(nil), s.leaves...)
}

// ScanLeaves computes the leaf sums from the data itself, on one consistent
// view: what the kept leaves must equal (the check that the tree did not
// change beneath them, and the rebuild).
func (s *Store) ScanLeaves() ([]hashtree.Sum, error) {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	_, _, leaves, _, err := scanTree(snap)
	return leaves, err
}

// RebuildLeaves replaces the kept leaves by a scan of the data (after a
// check found them wrong) and reports how many leaves it changed. No batch
// runs meanwhile.
func (s *Store) RebuildLeaves() (int, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	_, _, leaves, live, err := scanTree(snap)
	if err != nil {
		return 0, err
	}
	// The live-key count moves with the leaves: wrong leaves may mean it
	// drifted too.
	s.live.Store(live)
	changed := 0
	for i := range leaves {
		if leaves[i] != s.leaves[i] {
			changed++
		}
	}
	s.leaves, s.leavesValid = leaves, true
	s.leavesGen++
	return changed, nil
}

// leafMove is what one merge adds to a leaf: the new version's digest
// less the old one's. Sums are additive, so a batch only collects its
// moves and the store's leaves take them at the commit, in any order.
type leafMove struct {
	leaf  int
	delta hashtree.Sum
}

// moveLeafLocked moves key's leaf from digest prev to next in the batch.
func (b *Batch) moveLeafLocked(key string, prev, next hashtree.Sum) {
	if prev == next {
		return
	}
	b.leafMoves = append(b.leafMoves, leafMove{hashtree.Leaf(key), next.Sub(prev)})
}

// movePlainLiveLocked counts a plain version of key appearing or going
// (prev and next its digests: only a live version has one), unless the
// key's counter counts: the key holds a value either way.
func (b *Batch) movePlainLiveLocked(key string, prev, next hashtree.Sum) error {
	if prev.IsZero() == next.IsZero() {
		return nil
	}
	if b.s.hasCounters.Load() || len(b.pendingCtr) > 0 {
		c, _, err := b.Counter(key)
		if err != nil {
			return err
		}
		if c.Counts() {
			return nil
		}
	}
	if prev.IsZero() {
		b.liveMoves++
	} else {
		b.liveMoves--
	}
	return nil
}

// moveCounterLiveLocked counts a counter of key starting or ceasing to
// count, unless the key holds a live plain version.
func (b *Batch) moveCounterLiveLocked(key string, was, is bool) error {
	if was == is {
		return nil
	}
	prev, err := b.prevDigestLocked(key, dataKey(key))
	if err != nil || !prev.IsZero() {
		return err
	}
	if is {
		b.liveMoves++
	} else {
		b.liveMoves--
	}
	return nil
}

// prevDigestLocked is the digest of what key holds as the batch sees it,
// for a merge that did not read the whole record.
func (b *Batch) prevDigestLocked(key string, dk []byte) (hashtree.Sum, error) {
	if p, ok := b.pending[key]; ok {
		return p.digest, nil
	}
	if !b.s.seen.mayHold(dk) {
		return hashtree.Sum{}, nil
	}
	r, done, err := b.recordLocked(key, dk)
	if err != nil {
		return hashtree.Sum{}, err
	}
	defer done()
	return versionDigest(&b.digester, key, r), nil
}

// leavesCommittedLocked gives the store the batch's leaves once it
// committed.
func (b *Batch) leavesCommittedLocked() {
	for _, m := range b.leafMoves {
		b.s.leaves[m.leaf] = b.s.leaves[m.leaf].Add(m.delta)
	}
	b.s.live.Add(b.liveMoves)
}

// Live returns the number of live plain keys and counters, kept as the
// leaves are (summed at open, moved by every batch): DBSIZE's answer
// without a scan. A name that holds both a value and a counter counts
// twice.
func (s *Store) Live() int64 { return s.live.Load() }

// VisitLeaves calls fn, on one consistent view of the tree, for every key
// in spans (nil: every key) whose leaf want says yes to: its plain record
// (live or a tombstone: c is nil) or its counter (r is nil). The values are
// valid during the call only. It reads the key space of spans (the leaves
// are spread by hash, not by key): one pass, whatever the number of leaves
// asked.
func (s *Store) VisitLeaves(spans []entry.Span, want func(leaf int) bool, fn func(key string, r *Record, c *Counter) error) error {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	if spans == nil {
		spans = []entry.Span{{}}
	}
	for _, p := range []byte{prefixData, prefixCounter} {
		for _, sp := range spans {
			lower, upper := append([]byte{p}, sp.Start...), []byte{p + 1}
			if sp.End != "" {
				upper = append([]byte{p}, sp.End...)
			}
			if err := visitSpan(snap, lower, upper, p == prefixData, want, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

func visitSpan(snap *pebble.Snapshot, lower, upper []byte, data bool, want func(leaf int) bool, fn func(key string, r *Record, c *Counter) error) error {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("store: visit leaves: %w", err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		key := string(it.Key()[1:])
		if !want(hashtree.Leaf(key)) {
			continue
		}
		if data {
			r, err := DecodeRecord(it.Value())
			if err == nil {
				err = fn(key, &r, nil)
			}
			if err != nil {
				it.Close()
				return fmt.Errorf("store: visit leaves: key %q: %w", key, err)
			}
			continue
		}
		c, err := DecodeCounter(it.Value())
		if err == nil {
			err = fn(key, nil, &c)
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("store: visit leaves: counter %q: %w", key, err)
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("store: visit leaves: %w", err)
	}
	return nil
}

// ScanLeavesIn sums the leaves of the keys in spans that match says yes
// to, from the data (a filtered link's comparison: its scope is not what
// the kept leaves cover).
func (s *Store) ScanLeavesIn(spans []entry.Span, match func(key string) bool) ([]hashtree.Sum, error) {
	leaves := make([]hashtree.Sum, hashtree.Leaves)
	var d hashtree.Digester
	err := s.VisitLeaves(spans, func(int) bool { return true }, func(key string, r *Record, c *Counter) error {
		if !match(key) {
			return nil
		}
		var sum hashtree.Sum
		if c != nil {
			sum = counterDigest(&d, key, c)
		} else {
			sum = versionDigest(&d, key, r)
		}
		if !sum.IsZero() {
			l := hashtree.Leaf(key)
			leaves[l] = leaves[l].Add(sum)
		}
		return nil
	})
	return leaves, err
}

// ValueDigestHash is the hash a version's leaf digest covers: its value's,
// or a counter's totals'.
func ValueDigestHash(r *Record, c *Counter) uint64 {
	if c != nil {
		return hashtree.ValueHash(appendCounterTotals(nil, c))
	}
	return plainValueHash(r)
}

// CheckLeaves compares the kept sums of the leaves sample says yes to with
// sums made afresh from the data, on one view of both (the leaves copied and
// a Pebble snapshot taken under the apply lock; the scan runs without it),
// and reports the leaves that differ: the tree changed beneath the batches
// (bit rot, a hand edit) or a batch kept a leaf wrong. With fix, it then
// corrects them by what they were off at the snapshot (sums are additive:
// the batches since moved them from there), so that they say what the tree
// holds and a comparison with a peer finds the keys. It reads the whole key
// space and hashes only the sample's versions; writes go on meanwhile.
func (s *Store) CheckLeaves(sample func(leaf int) bool, fix bool) ([]int, error) {
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	s.applyMu.Lock()
	if !s.leavesValid {
		s.applyMu.Unlock()
		return nil, nil
	}
	kept := append([]hashtree.Sum(nil), s.leaves...)
	gen := s.leavesGen
	snap := s.db.NewSnapshot()
	s.applyMu.Unlock()
	defer snap.Close()
	fresh := make([]hashtree.Sum, hashtree.Leaves)
	var d hashtree.Digester
	for _, p := range []byte{prefixData, prefixCounter} {
		err := visitSpan(snap, []byte{p}, []byte{p + 1}, p == prefixData, sample, func(key string, r *Record, c *Counter) error {
			sum := versionDigest(&d, key, r)
			if c != nil {
				sum = counterDigest(&d, key, c)
			}
			l := hashtree.Leaf(key)
			fresh[l] = fresh[l].Add(sum)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	var differ []int
	for l := range fresh {
		if sample(l) && fresh[l] != kept[l] {
			differ = append(differ, l)
		}
	}
	if fix && len(differ) > 0 {
		s.applyMu.Lock()
		if s.leavesValid && s.leavesGen == gen {
			for _, l := range differ {
				s.leaves[l] = s.leaves[l].Add(fresh[l].Sub(kept[l]))
			}
		}
		s.applyMu.Unlock()
	}
	return differ, nil
}

// WriteBeneath writes rec as key's record straight into Pebble, past the
// kept hashes, the keys filter and every other account a batch keeps: what
// bit rot or a hand edit does to a tree. Tests of the check and the rebuild
// use it; nothing else may.
func (s *Store) WriteBeneath(key string, rec *Record) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.versions.drop(key) // as a restart would find it
	s.versions.count()
	return s.db.Set(dataKey(key), AppendRecord(nil, rec), pebble.Sync)
}
