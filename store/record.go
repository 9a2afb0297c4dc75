package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/replicator/replicator/hlc"
)

// ErrCorrupt is the class of errors for stored bytes that do not decode. It is
// never retryable: the same bytes will fail the same way.
var ErrCorrupt = errors.New("store: corrupt")

// ErrNotFound is returned for a key that holds no live value.
var ErrNotFound = errors.New("store: not found")

// Op is what a mutation does. Values travel on the wire and sit in the WAL:
// the list is append-only, never renumber.
type Op uint8

const (
	OpSet         Op = 1
	OpDelete      Op = 2
	OpDeleteRange Op = 3
	OpCounter     Op = 4
	OpMulti       Op = 5
)

func (o Op) String() string {
	switch o {
	case OpSet:
		return "set"
	case OpDelete:
		return "delete"
	case OpDeleteRange:
		return "delete_range"
	case OpCounter:
		return "counter"
	case OpMulti:
		return "multi"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Stamp is the total order last-writer-wins resolves by: the HLC, then the
// origin cluster as the tie-break. Equal stamps mean the same write.
type Stamp struct {
	HLC    hlc.Timestamp
	Origin string
}

// Compare returns -1, 0, +1 as s sorts before, equal to or after t.
func (s Stamp) Compare(t Stamp) int {
	if c := s.HLC.Compare(t.HLC); c != 0 {
		return c
	}
	return strings.Compare(s.Origin, t.Origin)
}

// String is a write's version: "<wall>.<logical>@<origin>". The same write
// shows the same version on every cluster.
func (s Stamp) String() string { return s.HLC.String() + "@" + s.Origin }

// ParseStamp reads the output of Stamp.String.
func ParseStamp(v string) (Stamp, error) {
	h, o, ok := strings.Cut(v, "@")
	if !ok || o == "" {
		return Stamp{}, fmt.Errorf("store: version %q: want <wall>.<logical>@<origin>", v)
	}
	ts, err := hlc.Parse(h)
	if err != nil {
		return Stamp{}, fmt.Errorf("store: version %q: %w", v, err)
	}
	return Stamp{HLC: ts, Origin: o}, nil
}

// Kind tells plain values from counters; a key keeps its kind until its
// tombstone is collected.
type Kind uint8

const (
	KindPlain   Kind = 0
	KindCounter Kind = 1
)

// Record is what one key holds.
type Record struct {
	Stamp     Stamp
	Tombstone bool
	Kind      Kind
	Value     []byte
}

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
	r.Stamp = Stamp{HLC: ts, Origin: string(b[recordHeader : recordHeader+n])}
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
func decodeStampOnly(b []byte) (Stamp, byte, error) {
	if len(b) < recordHeader || b[0] != recordVersion {
		_, err := DecodeRecord(b)
		return Stamp{}, 0, err
	}
	n := int(b[recordHeader-1])
	if n == 0 || n > maxOriginLen || len(b) < recordHeader+n {
		return Stamp{}, 0, fmt.Errorf("%w: record origin length %d", ErrCorrupt, n)
	}
	ts, err := hlc.Decode(b[2 : 2+hlc.EncodedLen])
	if err != nil {
		return Stamp{}, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return Stamp{HLC: ts, Origin: string(b[recordHeader : recordHeader+n])}, b[1], nil
}
