package store

import (
	"errors"
	"fmt"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// ErrCorrupt is the class of errors for stored bytes that do not decode. It is
// never retryable: the same bytes will fail the same way.
var ErrCorrupt = errors.New("store: corrupt")

// ErrNotFound is returned for a key that holds no live value.
var ErrNotFound = errors.New("store: not found")

const (
	recordVersion = 1

	flagTombstone = 1 << 0
	flagCounter   = 1 << 1
	knownFlags    = flagTombstone | flagCounter

	maxOriginLen = 63
	recordHeader = 2 + hlc.EncodedLen + 1 // version, flags, hlc, origin length
)

// AppendRecord appends the stored encoding of r to dst:
//
//	version(1) | flags(1) | hlc(12) | len(origin)(1) | origin | value
func AppendRecord(dst []byte, r *Record) []byte {
	var flags byte
	if r.Tombstone {
		flags |= flagTombstone
	}
	if r.Kind == KindCounter {
		flags |= flagCounter
	}
	dst = append(dst, recordVersion, flags)
	dst = r.Stamp.HLC.AppendTo(dst)
	dst = append(dst, byte(len(r.Stamp.Origin)))
	dst = append(dst, r.Stamp.Origin...)
	return append(dst, r.Value...)
}

// DecodeRecord parses a stored record. The returned Value aliases b.
func DecodeRecord(b []byte) (Record, error) {
	var r Record
	if len(b) < recordHeader {
		return r, fmt.Errorf("%w: record of %d bytes is shorter than its header", ErrCorrupt, len(b))
	}
	if b[0] != recordVersion {
		return r, fmt.Errorf("%w: record version %d, want %d", ErrCorrupt, b[0], recordVersion)
	}
	flags := b[1]
	if flags&^knownFlags != 0 {
		return r, fmt.Errorf("%w: record flags %#x", ErrCorrupt, flags)
	}
	ts, err := hlc.Decode(b[2 : 2+hlc.EncodedLen])
	if err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	n := int(b[recordHeader-1])
	if n == 0 || n > maxOriginLen || len(b) < recordHeader+n {
		return r, fmt.Errorf("%w: record origin length %d", ErrCorrupt, n)
	}
	r.Stamp = entry.Stamp{HLC: ts, Origin: string(b[recordHeader : recordHeader+n])}
	r.Tombstone = flags&flagTombstone != 0
	if flags&flagCounter != 0 {
		r.Kind = KindCounter
	}
	r.Value = b[recordHeader+n:]
	if r.Tombstone && len(r.Value) > 0 && r.Kind == KindPlain {
		return r, fmt.Errorf("%w: tombstone with a %d-byte value", ErrCorrupt, len(r.Value))
	}
	return r, nil
}

// decodeStampOnly reads only the stamp and flags of a stored record, without
// copying the value; the merge path compares stamps far more often than it
// needs values.
func decodeStampOnly(b []byte) (entry.Stamp, byte, error) {
	if len(b) < recordHeader || b[0] != recordVersion {
		_, err := DecodeRecord(b)
		return entry.Stamp{}, 0, err
	}
	n := int(b[recordHeader-1])
	if n == 0 || n > maxOriginLen || len(b) < recordHeader+n {
		return entry.Stamp{}, 0, fmt.Errorf("%w: record origin length %d", ErrCorrupt, n)
	}
	ts, err := hlc.Decode(b[2 : 2+hlc.EncodedLen])
	if err != nil {
		return entry.Stamp{}, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return entry.Stamp{HLC: ts, Origin: string(b[recordHeader : recordHeader+n])}, b[1], nil
}
