package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/hlc"
)

// Key spaces of replication bookkeeping:
//
//	h<origin>\x00<stream:16>   acceptor high-water mark: index(8) | commit hlc(12) | merged(8)
//	c<peer>                    shipper cursor: stream(16) | acked index(8)
const (
	prefixHWM    = 'h'
	prefixCursor = 'c'
)

// HWM is what this node applied of one origin stream: every index at or
// below Index is applied, and Commit is the commit HLC of that entry (the
// stream's applied commit frontier). Merged counts the entries that went
// through a merge; it commits with them, so it survives crashes exactly and
// exceeds the number of distinct indexes only if an entry was applied twice.
type HWM struct {
	Origin string
	Stream [16]byte
	Index  uint64
	Commit hlc.Timestamp
	Merged uint64
	// DeadLettered counts the entries set aside instead (Merged +
	// DeadLettered = Index for a stream that began at 1).
	DeadLettered uint64
}

const hwmValueLen = 8 + hlc.EncodedLen + 8 + 8

func hwmKey(origin string, stream [16]byte) []byte {
	k := make([]byte, 0, 2+len(origin)+16)
	k = append(k, prefixHWM)
	k = append(k, origin...)
	k = append(k, 0)
	return append(k, stream[:]...)
}

func decodeHWM(key, v []byte) (HWM, error) {
	var h HWM
	if len(key) < 1+1+1+16 || key[len(key)-17] != 0 || len(v) != hwmValueLen {
		return h, fmt.Errorf("%w: high-water mark record", ErrCorrupt)
	}
	h.Origin = string(key[1 : len(key)-17])
	copy(h.Stream[:], key[len(key)-16:])
	h.Index = binary.BigEndian.Uint64(v[:8])
	ts, err := hlc.Decode(v[8 : 8+hlc.EncodedLen])
	if err != nil {
		return h, fmt.Errorf("%w: high-water mark: %v", ErrCorrupt, err)
	}
	h.Commit = ts
	h.Merged = binary.BigEndian.Uint64(v[8+hlc.EncodedLen:])
	h.DeadLettered = binary.BigEndian.Uint64(v[16+hlc.EncodedLen:])
	return h, nil
}

// HWM reads the high-water mark of one origin stream inside the batch (so it
// is consistent with the merges the batch is about to make).
func (b *Batch) HWM(origin string, stream [16]byte) (HWM, error) {
	k := hwmKey(origin, stream)
	v, closer, err := b.s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return HWM{Origin: origin, Stream: stream}, nil
	}
	if err != nil {
		return HWM{}, fmt.Errorf("store: read hwm: %w", err)
	}
	defer closer.Close()
	return decodeHWM(k, v)
}

// SetHWM raises an origin stream's high-water mark in the batch.
func (b *Batch) SetHWM(h HWM) error {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, hwmValueLen), h.Index)
	v = h.Commit.AppendTo(v)
	v = binary.BigEndian.AppendUint64(v, h.Merged)
	v = binary.BigEndian.AppendUint64(v, h.DeadLettered)
	return b.pb.Set(hwmKey(h.Origin, h.Stream), v, nil)
}

// HWMs lists every origin stream this node has applied entries of.
func (s *Store) HWMs() ([]HWM, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixHWM}, UpperBound: []byte{prefixHWM + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []HWM
	for valid := it.First(); valid; valid = it.Next() {
		h, err := decodeHWM(it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, it.Error()
}

func cursorKey(peer string) []byte { return append([]byte{prefixCursor}, peer...) }

// Cursor is a shipper's position for one peer: the peer acknowledged every
// entry of Stream up to Index.
type Cursor struct {
	Stream [16]byte
	Index  uint64
}

// Cursor reads the cursor of a peer; ok is false when none was ever stored.
func (s *Store) Cursor(peer string) (c Cursor, ok bool, err error) {
	v, closer, err := s.db.Get(cursorKey(peer))
	if errors.Is(err, pebble.ErrNotFound) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("store: read cursor of %s: %w", peer, err)
	}
	defer closer.Close()
	if len(v) != 24 {
		return c, false, fmt.Errorf("%w: cursor of %s", ErrCorrupt, peer)
	}
	copy(c.Stream[:], v[:16])
	c.Index = binary.BigEndian.Uint64(v[16:])
	return c, true, nil
}

// SetCursor stores a peer's cursor. It is not synced: a cursor that a crash
// takes back only makes the shipper resend what the peer drops as duplicates.
func (s *Store) SetCursor(peer string, c Cursor) error {
	v := append(append(make([]byte, 0, 24), c.Stream[:]...), binary.BigEndian.AppendUint64(nil, c.Index)...)
	if err := s.db.Set(cursorKey(peer), v, pebble.NoSync); err != nil {
		return fmt.Errorf("store: write cursor of %s: %w", peer, err)
	}
	return nil
}
