package wal

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	// with the stamp it holds, whoever wrote it. For a counter entry it is
	// also the cluster whose totals Ctr carries.
	StampOrigin string    // so
	End         string    // end: exclusive end of a delete_range ("" = the end of the key space)
	Ctr         *store.PN // ctr: [P, N], the resulting totals of the component CtrComp (op counter)
	// CtrComp names the totals Ctr carries (cc): store.Component(origin,
	// stream) for a local increment, any component in a re-seed snapshot.
	// Empty in entries written before totals were kept per stream: those
	// carry the totals of CounterCluster.
	CtrComp string
	Ops     []Op // ops: the writes of an atomic batch (op multi)
	// Oversize marks a stub (ovs): the entry was too large for the peer it
	// was shipped to, so only its identity, op and key travel, with its
	// encoded size; the receiver sets it aside as a dead letter and the
	// link moves on.
	Oversize uint64
}

// Op is one write of an atomic batch; it takes the batch entry's stamp.
type Op struct {
	Op    store.Op // set or delete
	Key   string
	Value []byte
}

// CounterCluster is the cluster whose totals a legacy counter entry (one
// without CtrComp) carries.
func (e *Entry) CounterCluster() string {
	if e.StampOrigin != "" {
		return e.StampOrigin
	}
	return e.Origin
}

// CounterComponent is the component whose totals a counter entry carries.
func (e *Entry) CounterComponent() string {
	if e.CtrComp != "" {
		return e.CtrComp
	}
	return e.CounterCluster()
}

// Stub returns the entry as an oversize stub of the given encoded size:
// identity, op, key and stamps, without the payload.
func (e *Entry) Stub(size int) Entry {
	st := Entry{Index: e.Index, Origin: e.Origin, Stream: e.Stream, Commit: e.Commit, Stamp: e.Stamp,
		Op: e.Op, Oversize: uint64(size)}
	if len(e.Key) <= 4096 {
		st.Key = e.Key
	}
	return st
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
	withEnd := e.End != ""
	withCtr := e.Ctr != nil
	withOps := len(e.Ops) > 0
	withCC := e.CtrComp != ""
	withOvs := e.Oversize > 0
	for _, b := range []bool{withOrigin, withStream, withStamp, withValue, withIdem, withSO, withEnd, withCtr, withOps, withCC, withOvs} {
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
	if withOps {
		_ = enc.EncodeString("ops")
		_ = enc.EncodeArrayLen(len(e.Ops))
		for _, op := range e.Ops {
			n := 2
			if len(op.Value) > 0 {
				n = 3
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

// checkComponent validates a counter component name: a cluster ID,
// optionally followed by "/" and a stream ID in hex.
func checkComponent(c string) error {
	cluster, stream, withStream := strings.Cut(c, "/")
	if cluster == "" || len(cluster) > 63 || len(c) > store.MaxComponentLen {
		return fmt.Errorf("counter component %q", c)
	}
	for i := 0; i < len(cluster); i++ {
		ch := cluster[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-') {
			return fmt.Errorf("counter component %q", c)
		}
	}
	if withStream {
		id, epoch, withEpoch := strings.Cut(stream, ".")
		if _, err := ParseStreamID(id); err != nil {
			return fmt.Errorf("counter component %q: %v", c, err)
		}
		if withEpoch {
			if n, err := strconv.ParseUint(epoch, 10, 32); err != nil || n == 0 || strconv.FormatUint(n, 10) != epoch {
				return fmt.Errorf("counter component %q: epoch %q", c, epoch)
			}
		}
	}
	return nil
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

func decodeCtr(dec *msgpack.Decoder) (*store.PN, error) {
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
	return &store.PN{P: p, N: q}, nil
}

func decodeOps(dec *msgpack.Decoder) ([]Op, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > MaxBatchOps {
		return nil, fmt.Errorf("ops array of %d elements", n)
	}
	ops := make([]Op, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		m, err := dec.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		if m < 2 || m > 3 {
			return nil, fmt.Errorf("op %d: map of %d fields", i, m)
		}
		var op Op
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
				op.Op = store.Op(o)
				seen |= 1
			case "k":
				op.Key, err = dec.DecodeString()
				seen |= 2
			case "val":
				op.Value, err = DecodeBytes(dec)
				seen |= 4
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
		if (op.Op != store.OpSet && op.Op != store.OpDelete) || op.Key == "" || (op.Op == store.OpDelete && len(op.Value) > 0) {
			return nil, fmt.Errorf("op %d: %s on %q", i, op.Op, op.Key)
		}
		ops = append(ops, op)
	}
	return ops, nil
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
	if n < 0 || n > 18 {
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
			e.Op = store.Op(op)
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
				err = checkComponent(e.CtrComp)
			}
		case "ovs":
			bit = 16384
			e.Oversize, err = dec.DecodeUint64()
			if err == nil && e.Oversize == 0 {
				err = errors.New("oversize stub of 0 bytes")
			}
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
	bad := func(why string) error { return fmt.Errorf("%w: entry %d: %s: %s", ErrMalformed, e.Index, e.Op, why) }
	if e.CtrComp != "" && e.Op != store.OpCounter {
		return bad("a counter component")
	}
	if e.Oversize > 0 {
		// A stub carries no payload; it is never applied, only set aside.
		if e.Op < store.OpSet || e.Op > store.OpMulti {
			return fmt.Errorf("%w: entry %d: unknown op %d", ErrMalformed, e.Index, e.Op)
		}
		if len(e.Value) > 0 || e.End != "" || e.Ctr != nil || len(e.Ops) > 0 || e.Idem != nil {
			return bad("a stub with a payload")
		}
		return nil
	}
	switch e.Op {
	case store.OpSet, store.OpDelete:
		if e.Key == "" {
			return bad("empty key")
		}
		if e.Op == store.OpDelete && len(e.Value) > 0 {
			return bad("a value")
		}
		if e.End != "" || e.Ctr != nil || len(e.Ops) > 0 {
			return bad("fields of another op")
		}
	case store.OpDeleteRange:
		if e.End != "" && e.End <= e.Key {
			return bad(fmt.Sprintf("empty range [%q, %q)", e.Key, e.End))
		}
		if len(e.Value) > 0 || e.Ctr != nil || len(e.Ops) > 0 {
			return bad("fields of another op")
		}
	case store.OpCounter:
		if e.Key == "" || e.Ctr == nil {
			return bad("needs a key and totals")
		}
		if len(e.Value) > 0 || e.End != "" || len(e.Ops) > 0 {
			return bad("fields of another op")
		}
	case store.OpMulti:
		if len(e.Ops) == 0 {
			return bad("no ops")
		}
		if e.Key != "" || len(e.Value) > 0 || e.End != "" || e.Ctr != nil {
			return bad("fields of another op")
		}
	default:
		return fmt.Errorf("%w: entry %d: unknown op %d", ErrMalformed, e.Index, e.Op)
	}
	return nil
}
