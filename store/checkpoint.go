package store

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// Checkpoint writes a consistent copy of the whole tree into dir (which
// must not exist): Pebble's checkpoint, hard links to the tables and a copy
// of the WAL, synced. It holds every batch committed before the call.
func (s *Store) Checkpoint(dir string) error {
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("store: checkpoint %s: %w", dir, err)
	}
	return nil
}

// replaceChunk bounds one batch of ReplaceFrom.
const replaceChunk = 4 << 20

// ReplaceFrom makes the tree hold exactly what the tree in dir (a
// checkpoint, another node's) holds: every key goes, dir's keys are
// written, and what the store keeps in memory is read again. It is not
// atomic: a crash halfway leaves a mix, so the caller records that a
// replacement is under way and does it again at start. No batch may run
// meanwhile (it holds the apply lock); reads see the mix.
func (s *Store) ReplaceFrom(dir string) error {
	src, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, FormatMajorVersion: pebble.FormatNewest,
		Logger: pebbleLogger{s.opts.Logger}})
	if err != nil {
		return fmt.Errorf("store: open the tree to copy %s: %w", dir, err)
	}
	defer src.Close()
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	// Until the copy is whole and scanned, every key may be held: a copy
	// that fails halfway leaves keys the old filter never saw.
	s.seen = nil
	s.ctrMu.Lock()
	s.ctrKeys = nil
	s.ctrMu.Unlock()
	s.leavesValid = false // until the copy is whole and summed
	s.versions.clear()
	// Every prefix is an ASCII letter: this range is the whole tree.
	if err := s.db.DeleteRange([]byte{0}, []byte{0xff, 0xff, 0xff, 0xff}, pebble.Sync); err != nil {
		return fmt.Errorf("store: clear the tree: %w", err)
	}
	it, err := src.NewIter(nil)
	if err != nil {
		return fmt.Errorf("store: read %s: %w", dir, err)
	}
	b := s.db.NewBatch()
	// The keys filter and the leaves of the new tree, built as it is copied.
	var (
		seen   seenScan
		ctrs   = seenScan{counters: true}
		leaves = leafScan{plainLive: plainLiveIn(src)}
	)
	for valid := it.First(); valid; valid = it.Next() {
		seen.see(it.Key())
		ctrs.see(it.Key())
		leaves.see(it.Key(), it.Value())
		if err := b.Set(it.Key(), it.Value(), nil); err != nil {
			it.Close()
			b.Close()
			return err
		}
		if b.Len() >= replaceChunk {
			if err := b.Commit(pebble.NoSync); err != nil {
				it.Close()
				return fmt.Errorf("store: copy the tree: %w", err)
			}
			b = s.db.NewBatch()
		}
	}
	leaves.see(nil, nil)
	if err := errors.Join(it.Error(), it.Close(), leaves.err); err != nil {
		b.Close()
		return fmt.Errorf("store: read %s: %w", dir, err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("store: copy the tree: %w", err)
	}
	s.maxStamp, s.ranges, s.hlcHigh, s.marks = entry.Stamp{}, nil, hlc.Timestamp{}, nil
	s.hasCounters.Store(false)
	if err := errors.Join(s.loadMaxStamp(), s.loadRanges(), s.checkCounters(), s.loadHLC(), s.loadMarks(), s.loadCollected()); err != nil {
		return err
	}
	s.seen, s.leaves, s.leavesValid = seen.filter(), leaves.leaves, true
	s.ctrMu.Lock()
	s.ctrKeys = ctrs.filter()
	s.ctrMu.Unlock()
	s.live.Store(leaves.live)
	s.leavesGen++
	return nil
}
