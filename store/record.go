package store

import (
	"encoding/binary"
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

	flagTombstone  = 1 << 0
	flagCounter    = 1 << 1
	flagContext    = 1 << 2
	flagConflicted = 1 << 3
	flagExpires    = 1 << 4
	knownFlags     = flagTombstone | flagCounter | flagContext | flagConflicted | flagExpires

	maxOriginLen = 63
	recordHeader = 2 + hlc.EncodedLen + 1 // version, flags, hlc, origin length
)

// AppendRecord appends the stored encoding of r to dst:
//
//	version(1) | flags(1) | hlc(12) | len(origin)(1) | origin | [expires] | [context] | value
//
// with the expiry (flag 16) as 8 bytes, big-endian wall ns, and the context
// (flag 4) as count(1) | (len(origin)(1) | origin | hlc(12))*. Flag 8 says
// the conflict log holds records of versions the key discarded. A build
// before expiry refuses flag 16 as corrupt: expiry is written only from
// command format 11, once every node reads it.
func AppendRecord(dst []byte, r *Record) []byte {
	var flags byte
	if r.Tombstone {
		flags |= flagTombstone
	}
	if r.Kind == KindCounter {
		flags |= flagCounter
	}
	if len(r.Ctx) > 0 {
		flags |= flagContext
	}
	if r.Conflicted {
		flags |= flagConflicted
	}
	if r.Expires != 0 {
		flags |= flagExpires
	}
	dst = append(dst, recordVersion, flags)
	dst = r.Stamp.HLC.AppendTo(dst)
	dst = append(dst, byte(len(r.Stamp.Origin)))
	dst = append(dst, r.Stamp.Origin...)
	if r.Expires != 0 {
		dst = binary.BigEndian.AppendUint64(dst, uint64(r.Expires))
	}
	if len(r.Ctx) > 0 {
		dst = append(dst, byte(len(r.Ctx)))
		for _, it := range r.Ctx {
			dst = append(dst, byte(len(it.Origin)))
			dst = append(dst, it.Origin...)
			dst = it.HLC.AppendTo(dst)
		}
	}
	return append(dst, r.Value...)
}

// decodeContext reads a stored context from b, returning what follows it.
func decodeContext(b []byte) (entry.Context, []byte, error) {
	if len(b) < 1 || b[0] == 0 || int(b[0]) > entry.MaxContext {
		return nil, nil, fmt.Errorf("%w: record context header", ErrCorrupt)
	}
	c := make(entry.Context, b[0])
	b = b[1:]
	for i := range c {
		if len(b) < 1 {
			return nil, nil, fmt.Errorf("%w: record context item %d", ErrCorrupt, i)
		}
		n := int(b[0])
		if n == 0 || n > maxOriginLen || len(b) < 1+n+hlc.EncodedLen {
			return nil, nil, fmt.Errorf("%w: record context item %d", ErrCorrupt, i)
		}
		ts, err := hlc.Decode(b[1+n : 1+n+hlc.EncodedLen])
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		c[i] = entry.ContextItem{Origin: string(b[1 : 1+n]), HLC: ts}
		b = b[1+n+hlc.EncodedLen:]
	}
	return c, b, nil
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
	r.Conflicted = flags&flagConflicted != 0
	if flags&flagCounter != 0 {
		r.Kind = KindCounter
	}
	r.Value = b[recordHeader+n:]
	if flags&flagExpires != 0 {
		if len(r.Value) < 8 {
			return r, fmt.Errorf("%w: record expiry", ErrCorrupt)
		}
		r.Expires = int64(binary.BigEndian.Uint64(r.Value))
		if r.Expires <= 0 {
			return r, fmt.Errorf("%w: record expiry %d", ErrCorrupt, r.Expires)
		}
		r.Value = r.Value[8:]
	}
	if flags&flagContext != 0 {
		if r.Ctx, r.Value, err = decodeContext(r.Value); err != nil {
			return r, err
		}
	}
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
