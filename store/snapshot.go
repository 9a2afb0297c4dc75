package store

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
)

// Snapshot is a consistent view of every key (tombstones included) with the
// local applied index at that view: what a re-seed streams to a peer.
type Snapshot struct {
	snap    *pebble.Snapshot
	it      *pebble.Iterator
	applied AppliedIndex
	started bool
	// seek, when seeking, is where the next Next starts (SeekGE).
	seek    string
	seeking bool
}

// Counters lists the snapshot's counters.
func (sn *Snapshot) Counters() (map[string]Counter, error) {
	it, err := sn.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixCounter}, UpperBound: []byte{prefixCounter + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[string]Counter{}
	for valid := it.First(); valid; valid = it.Next() {
		c, err := DecodeCounter(it.Value())
		if err != nil {
			return nil, err
		}
		out[string(it.Key()[1:])] = c
	}
	return out, it.Error()
}

// Marks lists the snapshot's high-water marks of real streams (a re-seed's
// own snapshot streams, which record no commit, are left out).
func (sn *Snapshot) Marks() ([]entry.HWM, error) {
	all, err := hwmsIn(sn.snap, nil, []byte{prefixHWM}, []byte{prefixHWM + 1}, 0)
	out := all[:0]
	for _, h := range all {
		if !h.Commit.IsZero() {
			out = append(out, h)
		}
	}
	return out, err
}

// Ranges lists the snapshot's range tombstones.
func (sn *Snapshot) Ranges() ([]RangeTombstone, error) {
	it, err := sn.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRange}, UpperBound: []byte{prefixRange + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []RangeTombstone
	for valid := it.First(); valid; valid = it.Next() {
		r, err := decodeRange(it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, it.Error()
}

// NewSnapshot opens a snapshot. Close it.
func (s *Store) NewSnapshot() (*Snapshot, error) {
	snap := s.db.NewSnapshot()
	sn := &Snapshot{snap: snap}
	v, closer, err := snap.Get(keyLocalApplied)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		snap.Close()
		return nil, fmt.Errorf("store: snapshot: %w", err)
	default:
		a, derr := decodeApplied(v)
		closer.Close()
		if derr != nil {
			snap.Close()
			return nil, derr
		}
		sn.applied = a
	}
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		snap.Close()
		return nil, fmt.Errorf("store: snapshot: %w", err)
	}
	sn.it = it
	return sn, nil
}

// LocalApplied is how far the local stream is applied in the snapshot.
func (sn *Snapshot) LocalApplied() AppliedIndex { return sn.applied }

// SeekGE makes the next Next return the first key at or above key.
func (sn *Snapshot) SeekGE(key string) { sn.seek, sn.seeking = key, true }

// Next returns the next key's record; ok is false at the end.
func (sn *Snapshot) Next() (key string, r Record, ok bool, err error) {
	var valid bool
	switch {
	case sn.seeking:
		valid, sn.started, sn.seeking = sn.it.SeekGE(dataKey(sn.seek)), true, false
	case !sn.started:
		valid, sn.started = sn.it.First(), true
	default:
		valid = sn.it.Next()
	}
	if !valid {
		return "", Record{}, false, sn.it.Error()
	}
	r, err = DecodeRecord(sn.it.Value())
	if err != nil {
		return "", Record{}, false, fmt.Errorf("store: snapshot key %q: %w", sn.it.Key()[1:], err)
	}
	r.Value = bytes.Clone(r.Value)
	return string(sn.it.Key()[1:]), r, true, nil
}

// Count counts the snapshot's keys (tombstones included) without moving Next.
func (sn *Snapshot) Count() (int, error) {
	it, err := sn.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		n++
	}
	return n, it.Error()
}

// Close releases the snapshot.
func (sn *Snapshot) Close() {
	sn.it.Close()
	sn.snap.Close()
}
