package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
)

// An open snapshot is a re-seed or a backfill a sender began here and has
// not ended (its trailer has not come). While one is open no tombstone is
// collected here: its entries relay versions as the sender's tree held
// them when it took the snapshot, which may be older than a delete this
// node made since and the sender received since, and a tombstone collected
// in between would let such a version come back. A re-seed that began
// (its first batch raised the sender's mark, so live entries flow beside
// it) is also told to the sender in heartbeat answers, so a sender that
// lost track of it (it restarted, or another node leads it now) sends the
// re-seed again: the mark is already past what the snapshot carries.

// Kinds of open snapshots.
const (
	SnapshotReseed   = 1
	SnapshotBackfill = 2
)

// OpenSnapshot is the record of one open snapshot stream.
type OpenSnapshot struct {
	Sender string
	Stream entry.StreamID // the snapshot's own stream
	Kind   byte
	// Begun says the re-seed's first batch raised the sender's real
	// stream (Real) to Index; a re-seed without it raises the mark only
	// with its trailer.
	Begun bool
	Real  entry.StreamID
	Index uint64
}

const openSnapValueLen = 1 + 1 + 16 + 8

func openSnapKey(sender string, stream entry.StreamID) []byte {
	k := make([]byte, 0, 2+len(sender)+16)
	k = append(k, prefixOpenSnap)
	k = append(k, sender...)
	k = append(k, 0)
	return append(k, stream[:]...)
}

// OpenSnapshot records o as open in the batch, and forgets every other
// open snapshot of the same sender and kind with its snapshot stream's
// mark: a sender runs one re-seed and one backfill to a peer at a time,
// so an older one was abandoned (the sender restarted, or lost its lead)
// and will never end.
func (b *Batch) OpenSnapshot(o OpenSnapshot) error {
	open, err := openSnapshots(b.s.db, o.Sender)
	if err != nil {
		return err
	}
	for _, old := range open {
		if old.Kind != o.Kind || old.Stream == o.Stream {
			continue
		}
		if err := b.CloseSnapshot(old.Sender, old.Stream); err != nil {
			return err
		}
		if err := b.DeleteHWM(old.Sender, old.Stream); err != nil {
			return err
		}
	}
	v := make([]byte, 0, openSnapValueLen)
	begun := byte(0)
	if o.Begun {
		begun = 1
	}
	v = append(v, o.Kind, begun)
	v = append(v, o.Real[:]...)
	v = binary.BigEndian.AppendUint64(v, o.Index)
	return b.pb.Set(openSnapKey(o.Sender, o.Stream), v, nil)
}

// CloseSnapshot forgets an open snapshot in the batch (its trailer came,
// or it was abandoned), the authors its relays were not taken of, and the
// entries it staged (the trailer applied them first: Staged).
func (b *Batch) CloseSnapshot(sender string, stream entry.StreamID) error {
	lo := unheardKey(sender, stream, "")
	hi := append(slices.Clip(lo[:len(lo)-1]), 1)
	return errors.Join(b.pb.Delete(openSnapKey(sender, stream), nil), b.pb.DeleteRange(lo, hi, nil), b.dropStaged(sender, stream))
}

// unheardKey is the record of an author whose writes the open snapshot
// stream of sender relayed and this node did not take (author "": the
// stream's records begin there).
func unheardKey(sender string, stream entry.StreamID, author string) []byte {
	k := make([]byte, 0, 3+len(sender)+16+len(author))
	k = append(k, prefixUnheard)
	k = append(k, sender...)
	k = append(k, 0)
	k = append(k, stream[:]...)
	k = append(k, 0)
	return append(k, author...)
}

// SetSnapshotUnheard records, in the batch, that the open snapshot stream
// of sender relayed writes of author this node did not take (it had not
// heard the author's filter toward it): the snapshot's trailer claims none
// of that author's streams.
func (b *Batch) SetSnapshotUnheard(sender string, stream entry.StreamID, author string) error {
	return b.pb.Set(unheardKey(sender, stream, author), nil, nil)
}

// SnapshotUnheard lists the authors recorded (committed) for sender's
// snapshot stream by SetSnapshotUnheard.
func (b *Batch) SnapshotUnheard(sender string, stream entry.StreamID) ([]string, error) {
	lo := unheardKey(sender, stream, "")
	hi := append(slices.Clip(lo[:len(lo)-1]), 1)
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []string
	for valid := it.First(); valid; valid = it.Next() {
		out = append(out, string(it.Key()[len(lo):]))
	}
	return out, it.Error()
}

// OpenSnapshots lists every open snapshot here (committed).
func (s *Store) OpenSnapshots() ([]OpenSnapshot, error) { return openSnapshots(s.db, "") }

// OpenSnapshotsOf lists sender's open snapshots (committed).
func (s *Store) OpenSnapshotsOf(sender string) ([]OpenSnapshot, error) {
	return openSnapshots(s.db, sender)
}

// openSnapshots reads the open snapshots of sender ("": of every sender).
func openSnapshots(db *pebble.DB, sender string) ([]OpenSnapshot, error) {
	lo, hi := []byte{prefixOpenSnap}, []byte{prefixOpenSnap + 1}
	if sender != "" {
		lo = append(append([]byte{prefixOpenSnap}, sender...), 0)
		hi = append(append([]byte{prefixOpenSnap}, sender...), 1)
	}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []OpenSnapshot
	for valid := it.First(); valid; valid = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) < 1+1+1+16 || k[len(k)-17] != 0 || len(v) != openSnapValueLen {
			return nil, fmt.Errorf("%w: open snapshot record %q", ErrCorrupt, k)
		}
		o := OpenSnapshot{Sender: string(k[1 : len(k)-17]), Kind: v[0], Begun: v[1] == 1,
			Index: binary.BigEndian.Uint64(v[18:])}
		copy(o.Stream[:], k[len(k)-16:])
		copy(o.Real[:], v[2:18])
		out = append(out, o)
	}
	return out, it.Error()
}

// BegunReseed returns the snapshot stream of sender's re-seed that began
// here and has not ended (committed), if there is one.
func (s *Store) BegunReseed(sender string) (entry.StreamID, bool, error) {
	open, err := openSnapshots(s.db, sender)
	for _, o := range open {
		if o.Kind == SnapshotReseed && o.Begun {
			return o.Stream, true, err
		}
	}
	return entry.StreamID{}, false, err
}
