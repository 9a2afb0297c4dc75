package wal

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

// StreamID names one outbound WAL. It is random, minted when the WAL is
// created, so a WAL that is lost and recreated never reuses identities.
type StreamID [16]byte

// NewStreamID mints a random stream ID.
func NewStreamID() StreamID {
	var s StreamID
	if _, err := rand.Read(s[:]); err != nil {
		panic("wal: no randomness for a stream id: " + err.Error())
	}
	return s
}

func (s StreamID) String() string { return hex.EncodeToString(s[:]) }

// IsZero reports whether s is the zero ID (no stream).
func (s StreamID) IsZero() bool { return s == StreamID{} }

// ParseStreamID reads the output of String.
func ParseStreamID(v string) (StreamID, error) {
	var s StreamID
	b, err := hex.DecodeString(v)
	if err != nil || len(b) != len(s) {
		return s, fmt.Errorf("wal: stream id %q: want 32 hex digits", v)
	}
	copy(s[:], b)
	return s, nil
}

// Entry is one replicated mutation. Its WAL identity (Origin, Stream, Index)
// never changes, whichever cluster forwards it; receivers dedup on it.
type Entry struct {
	Index  uint64        // i: position in the origin stream, from 1
	Origin string        // o: authoring cluster, resolved by infrastructure
	Stream StreamID      // s: the origin's stream
	Commit hlc.Timestamp // c: commit HLC, assigned at append; grows with Index
	Stamp  hlc.Timestamp // t: LWW stamp; equals Commit unless a caller pinned one
	Op     store.Op      // op
	Key    string        // k
	Value  []byte        // val
	Idem   *Idem         // idem: the idempotency record this write creates
	// StampOrigin is the origin of the LWW stamp when it differs from the
	// entry's origin: only in a re-seed snapshot, which relays every key
	// with the stamp it holds, whoever wrote it.
	StampOrigin string // so
}

// Idem is the idempotency record of a keyed request: what the request was
// (its fingerprint) and what it was answered. It rides in the entry so every
// cluster stores it with the write, and a retry sent to any of them replays
// the answer instead of writing again.
type Idem struct {
	Key         string // k: the client's Idempotency-Key
	Fingerprint []byte // fp: SHA-256 of the request
	Status      int    // st: the HTTP status answered
	Body        []byte // b: the answer's body
	Expires     int64  // x: wall ns after which the record may be collected
}

// MaxIdemKey bounds an idempotency key.
const MaxIdemKey = 256

// LWW returns the entry's last-writer-wins stamp.
func (e *Entry) LWW() store.Stamp {
	ts := e.Stamp
	if ts.IsZero() {
		ts = e.Commit
	}
	o := e.Origin
	if e.StampOrigin != "" {
		o = e.StampOrigin
	}
	return store.Stamp{HLC: ts, Origin: o}
}

// ErrMalformed is the class of errors for entry bytes that do not decode to a
// valid entry. Input from a peer that fails this way is refused with a 4xx;
// bytes from the local WAL that fail this way are corruption.
var ErrMalformed = errors.New("wal: malformed entry")

// Defaults are the origin and stream an encoded entry leaves out: the local
// stream in the WAL, the batch's stream on the wire. Leaving them out saves
// two dozen bytes per entry and lets the shipper send WAL bytes unchanged.
type Defaults struct {
	Origin string
	Stream StreamID
}

// Codec encodes and decodes entries. It keeps buffers between calls, so it is
// not safe for concurrent use; give each goroutine its own.
type Codec struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	rd  bytes.Reader
	dec *msgpack.Decoder
}

// NewCodec returns a codec with empty buffers.
func NewCodec() *Codec {
	c := &Codec{}
	c.enc = msgpack.NewEncoder(&c.buf)
	c.dec = msgpack.NewDecoder(&c.rd)
	return c
}

// AppendEntry appends the msgpack encoding of e to dst.
func (c *Codec) AppendEntry(dst []byte, e *Entry, d Defaults) []byte {
	c.buf.Reset()
	c.encodeEntry(c.enc, e, d)
	return append(dst, c.buf.Bytes()...)
}

// EncodeEntryTo writes the msgpack encoding of e with enc.
func (c *Codec) encodeEntry(enc *msgpack.Encoder, e *Entry, d Defaults) {
	n := 4 // i, c, op, k
	withOrigin := e.Origin != d.Origin
	withStream := e.Stream != d.Stream
	withStamp := !e.Stamp.IsZero() && e.Stamp != e.Commit
	withValue := len(e.Value) > 0
	withIdem := e.Idem != nil
	withSO := e.StampOrigin != ""
	for _, b := range []bool{withOrigin, withStream, withStamp, withValue, withIdem, withSO} {
		if b {
			n++
		}
	}
	// Errors cannot happen: the encoder writes to a bytes.Buffer.
	_ = enc.EncodeMapLen(n)
	_ = enc.EncodeString("i")
	_ = enc.EncodeUint(e.Index)
	if withOrigin {
		_ = enc.EncodeString("o")
		_ = enc.EncodeString(e.Origin)
	}
	if withStream {
		_ = enc.EncodeString("s")
		_ = enc.EncodeBytes(e.Stream[:])
	}
	_ = enc.EncodeString("c")
	encodeHLC(enc, e.Commit)
	if withStamp {
		_ = enc.EncodeString("t")
		encodeHLC(enc, e.Stamp)
	}
	_ = enc.EncodeString("op")
	_ = enc.EncodeUint(uint64(e.Op))
	_ = enc.EncodeString("k")
	_ = enc.EncodeString(e.Key)
	if withValue {
		_ = enc.EncodeString("val")
		_ = enc.EncodeBytes(e.Value)
	}
	if withSO {
		_ = enc.EncodeString("so")
		_ = enc.EncodeString(e.StampOrigin)
	}
	if withIdem {
		_ = enc.EncodeString("idem")
		_ = enc.EncodeMapLen(5)
		_ = enc.EncodeString("k")
		_ = enc.EncodeString(e.Idem.Key)
		_ = enc.EncodeString("fp")
		_ = enc.EncodeBytes(e.Idem.Fingerprint)
		_ = enc.EncodeString("st")
		_ = enc.EncodeUint(uint64(e.Idem.Status))
		_ = enc.EncodeString("b")
		_ = enc.EncodeBytes(e.Idem.Body)
		_ = enc.EncodeString("x")
		_ = enc.EncodeInt(e.Idem.Expires)
	}
}

func decodeIdem(dec *msgpack.Decoder) (*Idem, error) {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > 8 {
		return nil, fmt.Errorf("idem map of %d fields", n)
	}
	var id Idem
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		name, err := dec.DecodeString()
		if err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, fmt.Errorf("idem field %q twice", name)
		}
		seen[name] = true
		switch name {
		case "k":
			id.Key, err = dec.DecodeString()
		case "fp":
			id.Fingerprint, err = dec.DecodeBytes()
		case "st":
			var st uint16
			st, err = dec.DecodeUint16()
			id.Status = int(st)
		case "b":
			id.Body, err = dec.DecodeBytes()
		case "x":
			id.Expires, err = dec.DecodeInt64()
		default:
			return nil, fmt.Errorf("unknown idem field %q", name)
		}
		if err != nil {
			return nil, fmt.Errorf("idem field %q: %v", name, err)
		}
	}
	if id.Key == "" || len(id.Key) > MaxIdemKey || len(id.Fingerprint) > 64 || id.Status < 100 || id.Status > 599 {
		return nil, fmt.Errorf("idem record out of range (key of %d bytes, status %d)", len(id.Key), id.Status)
	}
	return &id, nil
}

// encodeHLC writes a timestamp as [wall, logical]: integers on the wire,
// never time.Time.
func encodeHLC(enc *msgpack.Encoder, ts hlc.Timestamp) {
	_ = enc.EncodeArrayLen(2)
	_ = enc.EncodeInt(ts.Wall)
	_ = enc.EncodeUint(uint64(ts.Logical))
}

func decodeHLC(dec *msgpack.Decoder) (hlc.Timestamp, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return hlc.Timestamp{}, err
	}
	if n != 2 {
		return hlc.Timestamp{}, fmt.Errorf("hlc array of %d elements, want 2", n)
	}
	w, err := dec.DecodeInt64()
	if err != nil {
		return hlc.Timestamp{}, err
	}
	if w < 0 {
		return hlc.Timestamp{}, fmt.Errorf("negative hlc wall %d", w)
	}
	l, err := dec.DecodeUint32()
	if err != nil {
		return hlc.Timestamp{}, err
	}
	return hlc.Timestamp{Wall: w, Logical: l}, nil
}

// DecodeEntry decodes one entry that fills all of b.
func (c *Codec) DecodeEntry(b []byte, d Defaults) (Entry, error) {
	c.rd.Reset(b)
	c.dec.Reset(&c.rd)
	e, err := DecodeEntryFrom(c.dec, d)
	if err != nil {
		return e, err
	}
	if c.rd.Len() != 0 {
		return e, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, c.rd.Len())
	}
	return e, nil
}

// DecodeEntryFrom reads one entry from dec. Unknown fields are refused, not
// skipped: an entry this node cannot fully understand must not be applied.
func DecodeEntryFrom(dec *msgpack.Decoder, d Defaults) (Entry, error) {
	e := Entry{Origin: d.Origin, Stream: d.Stream}
	n, err := dec.DecodeMapLen()
	if err != nil {
		return e, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if n < 0 || n > 16 {
		return e, fmt.Errorf("%w: entry map of %d fields", ErrMalformed, n)
	}
	var have uint32
	for f := 0; f < n; f++ {
		name, err := dec.DecodeString()
		if err != nil {
			return e, fmt.Errorf("%w: field name: %v", ErrMalformed, err)
		}
		var bit uint32
		switch name {
		case "i":
			bit = 1
			e.Index, err = dec.DecodeUint64()
		case "o":
			bit = 2
			e.Origin, err = dec.DecodeString()
		case "s":
			bit = 4
			var b []byte
			b, err = dec.DecodeBytes()
			if err == nil && len(b) != len(e.Stream) {
				err = fmt.Errorf("stream of %d bytes", len(b))
			}
			copy(e.Stream[:], b)
		case "c":
			bit = 8
			e.Commit, err = decodeHLC(dec)
		case "t":
			bit = 16
			e.Stamp, err = decodeHLC(dec)
		case "op":
			bit = 32
			var op uint8
			op, err = dec.DecodeUint8()
			e.Op = store.Op(op)
		case "k":
			bit = 64
			e.Key, err = dec.DecodeString()
		case "val":
			bit = 128
			e.Value, err = dec.DecodeBytes()
		case "idem":
			bit = 256
			e.Idem, err = decodeIdem(dec)
		case "so":
			bit = 512
			e.StampOrigin, err = dec.DecodeString()
			if err == nil && (e.StampOrigin == "" || len(e.StampOrigin) > 63) {
				err = fmt.Errorf("stamp origin %q", e.StampOrigin)
			}
		default:
			return e, fmt.Errorf("%w: unknown field %q", ErrMalformed, name)
		}
		if err != nil {
			return e, fmt.Errorf("%w: field %q: %v", ErrMalformed, name, err)
		}
		if have&bit != 0 {
			return e, fmt.Errorf("%w: field %q twice", ErrMalformed, name)
		}
		have |= bit
	}
	if e.Stamp.IsZero() {
		e.Stamp = e.Commit
	}
	return e, e.check()
}

// check validates what every entry must satisfy, wherever it came from.
func (e *Entry) check() error {
	switch {
	case e.Index == 0:
		return fmt.Errorf("%w: index 0", ErrMalformed)
	case e.Origin == "" || len(e.Origin) > 63:
		return fmt.Errorf("%w: origin %q", ErrMalformed, e.Origin)
	case e.Stream.IsZero():
		return fmt.Errorf("%w: zero stream", ErrMalformed)
	case e.Commit.IsZero():
		return fmt.Errorf("%w: entry %d has no commit hlc", ErrMalformed, e.Index)
	}
	switch e.Op {
	case store.OpSet, store.OpDelete:
		if e.Key == "" {
			return fmt.Errorf("%w: entry %d: %s with an empty key", ErrMalformed, e.Index, e.Op)
		}
		if e.Op == store.OpDelete && len(e.Value) > 0 {
			return fmt.Errorf("%w: entry %d: delete with a value", ErrMalformed, e.Index)
		}
	default:
		return fmt.Errorf("%w: entry %d: unknown op %d", ErrMalformed, e.Index, e.Op)
	}
	return nil
}
