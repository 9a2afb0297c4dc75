package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/hlc"
)

// The state machine's own records (package machine), kept in the tree so
// that they commit with the writes of the command that changes them: the
// last log index applied, the command encoding the log carries, the cutoff
// below which tombstones were collected, and the nodes removed from the
// cluster.

// getMeta reads a key of the m space; ok is false when it is absent.
func (s *Store) getMeta(key []byte) (v []byte, ok bool, err error) {
	raw, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: read %q: %w", key, err)
	}
	defer closer.Close()
	return append([]byte(nil), raw...), true, nil
}

// MachineApplied is the last log index the machine applied; logged is
// false when the tree was never written through a log (a new tree, or one
// a build before the log wrote).
func (s *Store) MachineApplied() (index uint64, logged bool, err error) {
	v, ok, err := s.getMeta(keyMachineApplied)
	if err != nil || !ok {
		return 0, false, err
	}
	if len(v) != 8 {
		return 0, false, fmt.Errorf("%w: applied index of %d bytes", ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

// SetMachineApplied records the log index a batch applies.
func (b *Batch) SetMachineApplied(index uint64) error {
	return b.pb.Set(keyMachineApplied, binary.BigEndian.AppendUint64(nil, index), nil)
}

// ForgetMachineLog records, synced, that the log the applied index counted
// in is gone: the next log's commands, from index 1, must apply.
func (s *Store) ForgetMachineLog() error {
	if err := s.db.Set(keyMachineApplied, binary.BigEndian.AppendUint64(nil, 0), pebble.Sync); err != nil {
		return fmt.Errorf("store: forget the log: %w", err)
	}
	return nil
}

// CommandFormat is the command encoding the log carries (0: none recorded,
// which is encoding 1).
func (s *Store) CommandFormat() (uint8, error) {
	v, ok, err := s.getMeta(keyCommandFormat)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("%w: command format of %d bytes", ErrCorrupt, len(v))
	}
	return v[0], nil
}

// SetCommandFormat records the command encoding the log carries from now.
func (b *Batch) SetCommandFormat(v uint8) error { return b.pb.Set(keyCommandFormat, []byte{v}, nil) }

// SlotMap is the cluster's slot map as group 0's log recorded it, encoded
// (package slot; nil: a cluster of one group).
func (s *Store) SlotMap() ([]byte, error) {
	v, ok, err := s.getMeta(keySlotMap)
	if err != nil || !ok {
		return nil, err
	}
	return v, nil
}

// SetSlotMap records the cluster's slot map, encoded, in the batch.
func (b *Batch) SetSlotMap(v []byte) error { return b.pb.Set(keySlotMap, v, nil) }

// CollectedBelow is the newest cutoff below which tombstones were collected
// (zero: none ever was).
func (s *Store) CollectedBelow() (hlc.Timestamp, error) {
	if p := s.collected.Load(); p != nil {
		return *p, nil
	}
	return s.readCollectedBelow()
}

func (s *Store) readCollectedBelow() (hlc.Timestamp, error) {
	v, ok, err := s.getMeta(keyCollectedBelow)
	if err != nil || !ok {
		return hlc.Timestamp{}, err
	}
	return hlc.Decode(v)
}

// loadCollected keeps the collection cutoff in memory (every not-found read
// says it): read at open and after a snapshot's copy, moved by the batches
// that set it once they commit.
func (s *Store) loadCollected() error {
	ts, err := s.readCollectedBelow()
	if err != nil {
		return err
	}
	s.collected.Store(&ts)
	return nil
}

// SetCollectedBelow records the newest collection cutoff.
func (b *Batch) SetCollectedBelow(ts hlc.Timestamp) error {
	cut := ts.Encode()
	b.collected = &ts
	return b.pb.Set(keyCollectedBelow, cut[:], nil)
}

// NodeRemoved reports whether id (a node ID, or "node.inc" for one
// incarnation) was recorded as removed, and why (0: an old record that did
// not say, read as an operator's removal by the machine).
func (s *Store) NodeRemoved(id string) (why byte, removed bool, err error) {
	v, ok, err := s.getMeta(removedNodeKey(id))
	if err != nil || !ok {
		return 0, false, err
	}
	if len(v) == 1 {
		why = v[0]
	}
	return why, true, nil
}

// ErrClosed: the store was closed.
var ErrClosed = errors.New("store: closed")

// RemovedNodes lists every removal record: each node ID (or "node.inc")
// with why it was removed, as NodeRemoved reads it.
func (s *Store) RemovedNodes() (map[string]byte, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	lo := removedNodeKey("")
	hi := append(append([]byte(nil), lo[:len(lo)-1]...), lo[len(lo)-1]+1)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[string]byte{}
	for valid := it.First(); valid; valid = it.Next() {
		var why byte
		if v := it.Value(); len(v) == 1 {
			why = v[0]
		}
		out[string(it.Key()[len(lo):])] = why
	}
	return out, it.Error()
}

// SetNodeRemoved records id removed from the cluster, and why.
func (b *Batch) SetNodeRemoved(id string, why byte) error {
	return b.pb.Set(removedNodeKey(id), []byte{why}, nil)
}
