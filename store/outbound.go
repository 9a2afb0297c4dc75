package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Outbound entries (key space o, keys.go): a cluster's own stream kept in the
// tree, beside the data its entries wrote, so that every node of a cluster
// holds the same outbound log and a new leader ships from where the old one
// stopped (docs/CLUSTER.md). The state machine writes them, with their dense
// stream index, in the batch that applies them; shippers read them back; a
// replicated truncation drops what every peer acknowledged. Values are
// entries as the WAL codec encodes them (origin and stream left out), so a
// shipper sends them unchanged.

// PutOutbound writes entry index of stream, encoded.
func (b *Batch) PutOutbound(stream [16]byte, index uint64, raw []byte) error {
	return b.pb.Set(outboundKey(stream, index), raw, nil)
}

// CutOutbound drops the entries of stream before first.
func (b *Batch) CutOutbound(stream [16]byte, first uint64) error {
	return b.pb.DeleteRange(outboundKey(stream, 0), outboundKey(stream, first), nil)
}

// DropOutbound drops every entry of stream (a sealed stream whose entries
// were all shipped, or one a re-seed replaced).
func (b *Batch) DropOutbound(stream [16]byte) error {
	return b.pb.DeleteRange(outboundKey(stream, 0), outboundKey(stream, ^uint64(0)), nil)
}

// Outbound returns a copy of entry index of stream; ErrNotFound when it is
// not kept.
func (s *Store) Outbound(stream [16]byte, index uint64) ([]byte, error) {
	v, closer, err := s.db.Get(outboundKey(stream, index))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: outbound entry %d", ErrNotFound, index)
	}
	if err != nil {
		return nil, fmt.Errorf("store: outbound entry %d: %w", index, err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// EachOutbound calls f with the index and encoded size of every entry of
// stream kept, in index order. Indexes are dense between the first and the
// last; a gap is corruption.
func (s *Store) EachOutbound(stream [16]byte, f func(index uint64, size int) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: outboundKey(stream, 0),
		UpperBound: outboundKey(stream, ^uint64(0)),
	})
	if err != nil {
		return fmt.Errorf("store: outbound entries: %w", err)
	}
	var prev uint64
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != 1+16+8 {
			it.Close()
			return fmt.Errorf("%w: outbound key of %d bytes", ErrCorrupt, len(k))
		}
		i := binary.BigEndian.Uint64(k[17:])
		if prev != 0 && i != prev+1 {
			it.Close()
			return fmt.Errorf("%w: outbound entries %d then %d", ErrCorrupt, prev, i)
		}
		prev = i
		if err := f(i, len(it.Value())); err != nil {
			it.Close()
			return err
		}
	}
	return it.Close()
}
