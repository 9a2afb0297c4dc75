package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

func (s *Store) loadHLC() error {
	ts, err := s.HLCHighWater()
	s.hlcHigh = ts
	return err
}

func (s *Store) loadMaxStamp() error {
	v, closer, err := s.db.Get(keyMaxStamp)
	if errors.Is(err, pebble.ErrNotFound) {
		return s.deriveMaxStamp()
	}
	if err != nil {
		return fmt.Errorf("store: read max stamp: %w", err)
	}
	defer closer.Close()
	if len(v) < hlc.EncodedLen {
		return fmt.Errorf("%w: max stamp of %d bytes", ErrCorrupt, len(v))
	}
	ts, err := hlc.Decode(v[:hlc.EncodedLen])
	if err != nil {
		return fmt.Errorf("%w: max stamp: %v", ErrCorrupt, err)
	}
	s.maxStamp = entry.Stamp{HLC: ts, Origin: string(v[hlc.EncodedLen:])}
	return nil
}

// deriveMaxStamp scans the data once when no max stamp is recorded (an
// empty tree, or one whose record was lost with Pebble's unsynced tail).
func (s *Store) deriveMaxStamp() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		st, _, err := decodeStampOnly(it.Value())
		if err != nil {
			return fmt.Errorf("store: key %q: %w", it.Key()[1:], err)
		}
		if s.maxStamp.Compare(st) < 0 {
			s.maxStamp = st
		}
	}
	return it.Error()
}

// SetLocalApplied records that the local WAL stream has been applied up to
// index (committed at commit). It commits with the data, so recovery knows
// exactly where to resume, and a re-seed snapshot knows which entry its
// state corresponds to.
func (b *Batch) SetLocalApplied(a AppliedIndex) error {
	v := make([]byte, 0, 24+hlc.EncodedLen)
	v = append(v, a.Stream[:]...)
	v = binary.BigEndian.AppendUint64(v, a.Index)
	v = a.Commit.AppendTo(v)
	return b.pb.Set(keyLocalApplied, v, nil)
}

func decodeApplied(v []byte) (AppliedIndex, error) {
	var a AppliedIndex
	if len(v) != 24 && len(v) != 24+hlc.EncodedLen {
		return a, fmt.Errorf("%w: applied index of %d bytes", ErrCorrupt, len(v))
	}
	copy(a.Stream[:], v[:16])
	a.Index = binary.BigEndian.Uint64(v[16:24])
	if len(v) > 24 {
		ts, err := hlc.Decode(v[24:])
		if err != nil {
			return a, fmt.Errorf("%w: applied index: %v", ErrCorrupt, err)
		}
		a.Commit = ts
	}
	return a, nil
}

// RaiseHLC raises the persisted clock high-water mark to ts, never lowers
// it: a restarted node stamps above the highest value any committed batch
// recorded, whichever batch committed last.
func (b *Batch) RaiseHLC(ts hlc.Timestamp) error {
	if !b.s.hlcHigh.Less(ts) || !b.hlc.Less(ts) {
		return nil
	}
	b.hlc = ts
	enc := ts.Encode()
	return b.pb.Set(keyHLC, enc[:], nil)
}

// LocalApplied returns how far the local stream is applied. A zero stream
// means nothing was ever applied.
func (s *Store) LocalApplied() (AppliedIndex, error) {
	v, closer, err := s.db.Get(keyLocalApplied)
	if errors.Is(err, pebble.ErrNotFound) {
		return AppliedIndex{}, nil
	}
	if err != nil {
		return AppliedIndex{}, fmt.Errorf("store: read applied index: %w", err)
	}
	defer closer.Close()
	return decodeApplied(v)
}

// HLCHighWater returns the persisted clock high-water mark (zero if none).
func (s *Store) HLCHighWater() (hlc.Timestamp, error) {
	v, closer, err := s.db.Get(keyHLC)
	if errors.Is(err, pebble.ErrNotFound) {
		return hlc.Timestamp{}, nil
	}
	if err != nil {
		return hlc.Timestamp{}, fmt.Errorf("store: read hlc high-water: %w", err)
	}
	defer closer.Close()
	ts, err := hlc.Decode(v)
	if err != nil {
		return hlc.Timestamp{}, fmt.Errorf("%w: hlc high-water: %v", ErrCorrupt, err)
	}
	return ts, nil
}
