package store

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
)

// A snapshot's versions are staged (from command format 13): each entry of
// an open re-seed or backfill is kept aside, as the sender encoded it, and
// the tree takes them all at once with the trailer (the machine applies
// them in the trailer's batch). A snapshot arrives in batches of keys in
// key order: merged as they came, a transaction whose keys straddle two
// batches would show in part until the next one (issue 48). Staged
// entries are not data: reads, digests and collection do not see them;
// they go with their snapshot when it ends or is abandoned
// (CloseSnapshot).

// stagedKey is the staged entry index of sender's snapshot stream (index
// 0: where the stream's entries begin).
func stagedKey(sender string, stream entry.StreamID, index uint64) []byte {
	k := make([]byte, 0, 2+len(sender)+16+8)
	k = append(k, prefixStaged)
	k = append(k, sender...)
	k = append(k, 0)
	k = append(k, stream[:]...)
	return binary.BigEndian.AppendUint64(k, index)
}

// stagedSpan bounds the staged entries of sender's snapshot stream.
func stagedSpan(sender string, stream entry.StreamID) (lo, hi []byte) {
	lo = stagedKey(sender, stream, 0)
	hi = slices.Clip(lo[:len(lo)-8])
	for i := len(hi) - 1; i >= 0; i-- {
		// The stream ID's successor: the next key after every index.
		if hi[i] != 0xff {
			hi = append(hi[:i:i], hi[i]+1)
			return lo, hi
		}
	}
	return lo, []byte{prefixStaged + 1}
}

// Stage keeps entry raw (index of sender's snapshot stream) aside in the
// batch until the snapshot's trailer.
func (b *Batch) Stage(sender string, stream entry.StreamID, index uint64, raw []byte) error {
	return b.pb.Set(stagedKey(sender, stream, index), raw, nil)
}

// Staged calls fn with each committed staged entry of sender's snapshot
// stream, in index order; raw is valid only during the call.
func (b *Batch) Staged(sender string, stream entry.StreamID, fn func(index uint64, raw []byte) error) error {
	lo, hi := stagedSpan(sender, stream)
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) != len(lo) {
			return fmt.Errorf("%w: staged entry key %q", ErrCorrupt, k)
		}
		if err := fn(binary.BigEndian.Uint64(k[len(k)-8:]), it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}

// dropStaged forgets, in the batch, the staged entries of sender's
// snapshot stream.
func (b *Batch) dropStaged(sender string, stream entry.StreamID) error {
	lo, hi := stagedSpan(sender, stream)
	return b.pb.DeleteRange(lo, hi, nil)
}
