package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Dead letters (key space q, keys.go): entries a peer sent that this node
// would not apply (they broke one of its own limits), kept for an operator
// instead of wedging the link.

// DeadLetter is one entry set aside.
type DeadLetter struct {
	Origin string
	Stream [16]byte
	Index  uint64
	At     int64  // wall ns when set aside
	Reason string // why it was not applied
	Entry  []byte // the msgpack entry, origin and stream included
}

// ID names a dead letter in the admin API.
func (d *DeadLetter) ID() string { return fmt.Sprintf("%s-%x-%d", d.Origin, d.Stream, d.Index) }

// PutDeadLetter sets an entry aside in the batch.
func (b *Batch) PutDeadLetter(d DeadLetter) error {
	v := binary.BigEndian.AppendUint64(nil, uint64(d.At))
	reason := d.Reason
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	v = binary.BigEndian.AppendUint16(v, uint16(len(reason)))
	v = append(v, reason...)
	v = append(v, d.Entry...)
	return b.pb.Set(deadKey(d.Origin, d.Stream, d.Index), v, nil)
}

// DeleteDeadLetter removes one in the batch.
func (b *Batch) DeleteDeadLetter(d DeadLetter) error {
	return b.pb.Delete(deadKey(d.Origin, d.Stream, d.Index), nil)
}

func decodeDead(k, v []byte) (DeadLetter, error) {
	var d DeadLetter
	if len(k) < 1+1+1+16+8 || k[len(k)-25] != 0 || len(v) < 10 {
		return d, fmt.Errorf("%w: dead letter", ErrCorrupt)
	}
	d.Origin = string(k[1 : len(k)-25])
	copy(d.Stream[:], k[len(k)-24:len(k)-8])
	d.Index = binary.BigEndian.Uint64(k[len(k)-8:])
	d.At = int64(binary.BigEndian.Uint64(v))
	n := int(binary.BigEndian.Uint16(v[8:]))
	if len(v) < 10+n {
		return d, fmt.Errorf("%w: dead letter reason", ErrCorrupt)
	}
	d.Reason = string(v[10 : 10+n])
	d.Entry = append([]byte(nil), v[10+n:]...)
	return d, nil
}

// DeadLetters lists the entries set aside.
func (s *Store) DeadLetters() ([]DeadLetter, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixDead}, UpperBound: []byte{prefixDead + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []DeadLetter
	for valid := it.First(); valid; valid = it.Next() {
		d, err := decodeDead(it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, it.Error()
}

// DeadLetter reads one dead letter as the batch sees it.
func (b *Batch) DeadLetter(origin string, stream [16]byte, index uint64) (DeadLetter, bool, error) {
	k := deadKey(origin, stream, index)
	v, closer, err := b.s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return DeadLetter{}, false, nil
	}
	if err != nil {
		return DeadLetter{}, false, err
	}
	defer closer.Close()
	d, err := decodeDead(k, v)
	return d, err == nil, err
}

// DeadIndexes lists the indexes in [from, to] of origin's stream that are
// set aside here as dead letters (at most max of them): a sender's WAIT
// must not count this node as holding them.
func (s *Store) DeadIndexes(origin string, stream [16]byte, from, to uint64, max int) ([]uint64, error) {
	if to < from {
		return nil, nil
	}
	upper := deadKey(origin, stream, to)
	upper = append(upper, 0) // just past index to
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: deadKey(origin, stream, from), UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []uint64
	for valid := it.First(); valid && len(out) < max; valid = it.Next() {
		k := it.Key()
		if len(k) < 8 {
			return nil, fmt.Errorf("%w: dead letter key", ErrCorrupt)
		}
		out = append(out, binary.BigEndian.Uint64(k[len(k)-8:]))
	}
	return out, it.Error()
}
