package wire

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// Defaults are the origin and stream an encoded entry leaves out: the local
// stream in the WAL, the batch's stream on the wire. Leaving them out saves
// two dozen bytes per entry and lets the shipper send WAL bytes unchanged.
type Defaults struct {
	Origin string
	Stream entry.StreamID
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
func (c *Codec) AppendEntry(dst []byte, e *entry.Entry, d Defaults) []byte {
	c.buf.Reset()
	c.encodeEntry(c.enc, e, d)
	return append(dst, c.buf.Bytes()...)
}

// EncodeEntryTo writes the msgpack encoding of e with enc.
func (c *Codec) encodeEntry(enc *msgpack.Encoder, e *entry.Entry, d Defaults) {
	n := 4 // i, c, op, k
	withOrigin := e.Origin != d.Origin
	withStream := e.Stream != d.Stream
	withStamp := !e.Stamp.IsZero() && e.Stamp != e.Commit
	withValue := len(e.Value) > 0
	withIdem := e.Idem != nil
	withSO := e.StampOrigin != ""
	withEnd := e.End != ""
	withCtr := e.Ctr != nil
	withOps := len(e.Ops) > 0
	withCC := e.CtrComp != ""
	withOvs := e.Oversize > 0
	withFlt := e.FilteredTo > 0
	withCx := len(e.Ctx) > 0
	withRs := e.Restores != nil
	withEx := e.Expires != 0
	withFl, withCl := len(e.Floors) > 0, e.Clears
	for _, b := range []bool{withOrigin, withStream, withStamp, withValue, withIdem, withSO, withEnd, withCtr, withOps, withCC, withOvs, withFlt, withCx, withRs, withEx, withFl, withCl} {
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
	if withEnd {
		_ = enc.EncodeString("end")
		_ = enc.EncodeString(e.End)
	}
	if withCtr {
		_ = enc.EncodeString("ctr")
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeUint(e.Ctr.P)
		_ = enc.EncodeUint(e.Ctr.N)
	}
	if withCC {
		_ = enc.EncodeString("cc")
		_ = enc.EncodeString(e.CtrComp)
	}
	if withOvs {
		_ = enc.EncodeString("ovs")
		_ = enc.EncodeUint(e.Oversize)
	}
	if withFlt {
		_ = enc.EncodeString("flt")
		_ = enc.EncodeUint(e.FilteredTo)
	}
	if withCx {
		_ = enc.EncodeString("cx")
		encodeContext(enc, e.Ctx)
	}
	if withEx {
		// Only to a peer that keeps expiry (Limits.Expiry): an older
		// build refuses the field.
		_ = enc.EncodeString("ex")
		_ = enc.EncodeInt(e.Expires)
	}
	if withFl {
		// Only to a peer that keeps floors (Limits.Floors), as expiry.
		_ = enc.EncodeString("fl")
		encodeFloors(enc, e.Floors)
	}
	if withCl {
		_ = enc.EncodeString("cl")
		_ = enc.EncodeBool(true)
	}
	if withRs {
		_ = enc.EncodeString("rs")
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeString(e.Restores.Loser.String())
		_ = enc.EncodeString(e.Restores.Winner.String())
	}
	if withOps {
		_ = enc.EncodeString("ops")
		_ = enc.EncodeArrayLen(len(e.Ops))
		for _, op := range e.Ops {
			n := 2
			if len(op.Value) > 0 {
				n++
			}
			if op.End != "" {
				n++
			}
			if len(op.Ctx) > 0 {
				n++
			}
			if op.Expires != 0 {
				n++
			}
			if len(op.Floors) > 0 {
				n++
			}
			_ = enc.EncodeMapLen(n)
			_ = enc.EncodeString("op")
			_ = enc.EncodeUint(uint64(op.Op))
			_ = enc.EncodeString("k")
			_ = enc.EncodeString(op.Key)
			if len(op.Value) > 0 {
				_ = enc.EncodeString("val")
				_ = enc.EncodeBytes(op.Value)
			}
			if op.End != "" {
				_ = enc.EncodeString("end")
				_ = enc.EncodeString(op.End)
			}
			if len(op.Ctx) > 0 {
				_ = enc.EncodeString("cx")
				encodeContext(enc, op.Ctx)
			}
			if op.Expires != 0 {
				_ = enc.EncodeString("ex")
				_ = enc.EncodeInt(op.Expires)
			}
			if len(op.Floors) > 0 {
				_ = enc.EncodeString("fl")
				encodeFloors(enc, op.Floors)
			}
		}
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

// DecodeBytes decodes a msgpack bin (or str) as bytes, refusing a length
// beyond what remains of the input before allocating it: msgpack's own
// DecodeBytes allocates whatever length the input declares, so 30 bytes that
// claim 2 GiB would allocate 2 GiB. Every decoder here reads from a
// bytes.Reader, whose remaining length bounds any field.
func DecodeBytes(dec *msgpack.Decoder) ([]byte, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	rest := maxFieldBytes
	if l, ok := dec.Buffered().(interface{ Len() int }); ok {
		rest = l.Len()
	}
	if n > rest {
		return nil, fmt.Errorf("bytes of %d declared, %d remain", n, rest)
	}
	b := make([]byte, n)
	return b, dec.ReadFull(b)
}

// maxFieldBytes bounds a field when the input's length is not known.
const maxFieldBytes = 64 << 20

// MaxBatchOps bounds the writes of one atomic batch entry.
const MaxBatchOps = 100000

func decodeCtr(dec *msgpack.Decoder) (*entry.PN, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n != 2 {
		return nil, fmt.Errorf("ctr array of %d elements, want 2", n)
	}
	p, err := dec.DecodeUint64()
	if err != nil {
		return nil, err
	}
	q, err := dec.DecodeUint64()
	if err != nil {
		return nil, err
	}
	return &entry.PN{P: p, N: q}, nil
}

// encodeFloors writes counter floors as a map of component to [P, N],
// sorted: equal floors encode the same.
func encodeFloors(enc *msgpack.Encoder, f map[string]entry.PN) {
	_ = enc.EncodeMapLen(len(f))
	for _, c := range slices.Sorted(maps.Keys(f)) {
		_ = enc.EncodeString(c)
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeUint(f[c].P)
		_ = enc.EncodeUint(f[c].N)
	}
}

func decodeFloors(dec *msgpack.Decoder) (map[string]entry.PN, error) {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > entry.MaxFloors {
		return nil, fmt.Errorf("floors of %d components", n)
	}
	f := make(map[string]entry.PN, min(n, 64))
	for i := 0; i < n; i++ {
		c, err := dec.DecodeString()
		if err != nil {
			return nil, err
		}
		if err := entry.CheckComponent(c); err != nil {
			return nil, err
		}
		if _, dup := f[c]; dup {
			return nil, fmt.Errorf("floor of %q twice", c)
		}
		t, err := decodeCtr(dec)
		if err != nil {
			return nil, err
		}
		f[c] = *t
	}
	return f, nil
}

func decodeOps(dec *msgpack.Decoder) ([]entry.BatchOp, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > MaxBatchOps {
		return nil, fmt.Errorf("ops array of %d elements", n)
	}
	ops := make([]entry.BatchOp, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		m, err := dec.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		if m < 2 || m > 7 {
			return nil, fmt.Errorf("op %d: map of %d fields", i, m)
		}
		var op entry.BatchOp
		seen := 0
		for f := 0; f < m; f++ {
			name, err := dec.DecodeString()
			if err != nil {
				return nil, err
			}
			switch name {
			case "op":
				var o uint8
				o, err = dec.DecodeUint8()
				op.Op = entry.Op(o)
				seen |= 1
			case "k":
				op.Key, err = dec.DecodeString()
				seen |= 2
			case "val":
				op.Value, err = DecodeBytes(dec)
				seen |= 4
			case "end":
				op.End, err = dec.DecodeString()
				seen |= 8
			case "cx":
				if seen&16 != 0 {
					return nil, fmt.Errorf("op %d: cx twice", i)
				}
				op.Ctx, err = decodeContext(dec)
				seen |= 16
			case "ex":
				if seen&32 != 0 {
					return nil, fmt.Errorf("op %d: ex twice", i)
				}
				op.Expires, err = dec.DecodeInt64()
				seen |= 32
			case "fl":
				if seen&64 != 0 {
					return nil, fmt.Errorf("op %d: fl twice", i)
				}
				op.Floors, err = decodeFloors(dec)
				seen |= 64
			default:
				return nil, fmt.Errorf("op %d: unknown field %q", i, name)
			}
			if err != nil {
				return nil, fmt.Errorf("op %d: %v", i, err)
			}
		}
		if seen&3 != 3 {
			return nil, fmt.Errorf("op %d: needs op and k", i)
		}
		switch {
		case op.Op == entry.OpDeleteRange:
			// Only a batch a link's filter clipped carries one: a range
			// delete cut into the parts the filter lets cross.
			if len(op.Value) > 0 || (op.End != "" && op.End <= op.Key) {
				return nil, fmt.Errorf("op %d: delete_range [%q, %q)", i, op.Key, op.End)
			}
		case (op.Op != entry.OpSet && op.Op != entry.OpDelete) || op.Key == "" || (op.Op == entry.OpDelete && len(op.Value) > 0) || op.End != "":
			return nil, fmt.Errorf("op %d: %s on %q", i, op.Op, op.Key)
		}
		ops = append(ops, op)
	}
	return ops, nil
}

func decodeIdem(dec *msgpack.Decoder) (*entry.Idem, error) {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > 8 {
		return nil, fmt.Errorf("idem map of %d fields", n)
	}
	var id entry.Idem
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
			id.Fingerprint, err = DecodeBytes(dec)
		case "st":
			var st uint16
			st, err = dec.DecodeUint16()
			id.Status = int(st)
		case "b":
			id.Body, err = DecodeBytes(dec)
		case "x":
			id.Expires, err = dec.DecodeInt64()
		default:
			return nil, fmt.Errorf("unknown idem field %q", name)
		}
		if err != nil {
			return nil, fmt.Errorf("idem field %q: %v", name, err)
		}
	}
	if id.Key == "" || len(id.Key) > entry.MaxIdemKey || len(id.Fingerprint) > 64 || id.Status < 100 || id.Status > 599 {
		return nil, fmt.Errorf("idem record out of range (key of %d bytes, status %d)", len(id.Key), id.Status)
	}
	return &id, nil
}

// decodeRestore reads a restore's two versions.
func decodeRestore(dec *msgpack.Decoder) (*entry.Restore, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n != 2 {
		return nil, fmt.Errorf("restore of %d versions, want 2", n)
	}
	var st [2]entry.Stamp
	for i := range st {
		s, err := dec.DecodeString()
		if err != nil {
			return nil, err
		}
		if len(s) > 128 {
			return nil, fmt.Errorf("restore version of %d bytes", len(s))
		}
		if st[i], err = entry.ParseStamp(s); err != nil {
			return nil, err
		}
	}
	return &entry.Restore{Loser: st[0], Winner: st[1]}, nil
}

// encodeContext writes a context as an array of [origin, wall, logical].
func encodeContext(enc *msgpack.Encoder, c entry.Context) {
	_ = enc.EncodeArrayLen(len(c))
	for _, it := range c {
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeString(it.Origin)
		_ = enc.EncodeInt(it.HLC.Wall)
		_ = enc.EncodeUint(uint64(it.HLC.Logical))
	}
}

// decodeContext reads a context, bounded before anything is allocated; the
// entry's Validate checks what it holds.
func decodeContext(dec *msgpack.Decoder) (entry.Context, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > entry.MaxContext {
		return nil, fmt.Errorf("context of %d items", n)
	}
	c := make(entry.Context, n)
	for i := range c {
		m, err := dec.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		if m != 3 {
			return nil, fmt.Errorf("context item of %d elements, want 3", m)
		}
		if c[i].Origin, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		w, err := dec.DecodeInt64()
		if err != nil {
			return nil, err
		}
		if w < 0 {
			return nil, fmt.Errorf("negative context wall %d", w)
		}
		l, err := dec.DecodeUint32()
		if err != nil {
			return nil, err
		}
		c[i].HLC = hlc.Timestamp{Wall: w, Logical: l}
	}
	return c, nil
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
func (c *Codec) DecodeEntry(b []byte, d Defaults) (entry.Entry, error) {
	c.rd.Reset(b)
	c.dec.Reset(&c.rd)
	e, err := DecodeEntryFrom(c.dec, d)
	if err != nil {
		return e, err
	}
	if c.rd.Len() != 0 {
		return e, fmt.Errorf("%w: %d trailing bytes", entry.ErrMalformed, c.rd.Len())
	}
	return e, nil
}

// DecodeEntryFrom reads one entry from dec. Unknown fields are refused, not
// skipped: an entry this node cannot fully understand must not be applied.
func DecodeEntryFrom(dec *msgpack.Decoder, d Defaults) (entry.Entry, error) {
	e := entry.Entry{Origin: d.Origin, Stream: d.Stream}
	n, err := dec.DecodeMapLen()
	if err != nil {
		return e, fmt.Errorf("%w: %v", entry.ErrMalformed, err)
	}
	if n < 0 || n > 24 {
		return e, fmt.Errorf("%w: entry map of %d fields", entry.ErrMalformed, n)
	}
	var have uint32
	for f := 0; f < n; f++ {
		name, err := dec.DecodeString()
		if err != nil {
			return e, fmt.Errorf("%w: field name: %v", entry.ErrMalformed, err)
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
			b, err = DecodeBytes(dec)
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
			e.Op = entry.Op(op)
		case "k":
			bit = 64
			e.Key, err = dec.DecodeString()
		case "val":
			bit = 128
			e.Value, err = DecodeBytes(dec)
		case "idem":
			bit = 256
			e.Idem, err = decodeIdem(dec)
		case "end":
			bit = 1024
			e.End, err = dec.DecodeString()
		case "ctr":
			bit = 2048
			e.Ctr, err = decodeCtr(dec)
		case "ops":
			bit = 4096
			e.Ops, err = decodeOps(dec)
		case "cc":
			bit = 8192
			e.CtrComp, err = dec.DecodeString()
			if err == nil {
				err = entry.CheckComponent(e.CtrComp)
			}
		case "ovs":
			bit = 16384
			e.Oversize, err = dec.DecodeUint64()
			if err == nil && e.Oversize == 0 {
				err = errors.New("oversize stub of 0 bytes")
			}
		case "flt":
			bit = 32768
			e.FilteredTo, err = dec.DecodeUint64()
			if err == nil && e.FilteredTo == 0 {
				err = errors.New("filtered marker to index 0")
			}
		case "cx":
			bit = 65536
			e.Ctx, err = decodeContext(dec)
		case "rs":
			bit = 131072
			e.Restores, err = decodeRestore(dec)
		case "ex":
			bit = 262144
			e.Expires, err = dec.DecodeInt64()
			if err == nil && e.Expires == 0 {
				err = errors.New("an expiry of 0 (never) is left out")
			}
		case "fl":
			bit = 524288
			e.Floors, err = decodeFloors(dec)
		case "cl":
			bit = 1048576
			e.Clears, err = dec.DecodeBool()
			if err == nil && !e.Clears {
				err = errors.New("a clear of false is left out")
			}
		case "so":
			bit = 512
			e.StampOrigin, err = dec.DecodeString()
			if err == nil && (e.StampOrigin == "" || len(e.StampOrigin) > 63) {
				err = fmt.Errorf("stamp origin %q", e.StampOrigin)
			}
		default:
			return e, fmt.Errorf("%w: unknown field %q", entry.ErrMalformed, name)
		}
		if err != nil {
			return e, fmt.Errorf("%w: field %q: %v", entry.ErrMalformed, name, err)
		}
		if have&bit != 0 {
			return e, fmt.Errorf("%w: field %q twice", entry.ErrMalformed, name)
		}
		have |= bit
	}
	if e.Stamp.IsZero() {
		e.Stamp = e.Commit
	}
	return e, e.Validate()
}
