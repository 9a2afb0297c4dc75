package wire

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// Version is the only batch version this build speaks.
const Version = 1

// ContentType is the media type of a batch.
const ContentType = "application/msgpack"

// Headers of a replicate request.
const (
	HeaderOrigin = "X-Replicator-Origin"
	// HeaderSent is the sender's clock (Unix nanoseconds) as it sent the
	// batch: the receiver splits each entry's lag into the sender's part
	// (commit to send), the wire and its own apply. A header, not a batch
	// field, so a receiver that does not know it ignores it.
	HeaderSent = "X-Replicator-Sent"
)

// ErrMalformed is the class of errors for a batch that does not decode.
var ErrMalformed = errors.New("wire: malformed batch")

// ErrVersion is the class of errors for a batch of another wire version.
var ErrVersion = errors.New("wire: unsupported version")

// Batch is what a shipper POSTs to a peer's /v1/replicate:
//
//	{v: 1, sender: "<cluster>", stream: <16 bytes>, entries: [entry...]}
//
// Entries leave out origin and stream when they equal sender and stream, so a
// shipper copies its WAL's bytes onto the wire unchanged.
type Batch struct {
	Header
	Entries []entry.Entry
	// SentAt and ReceivedAt are not on the wire: the sender's HeaderSent
	// and the receiver's clock once the body was read (0: unknown). They
	// split the lag into stages; nothing is decided by them.
	SentAt, ReceivedAt int64
	// Raw is the body DecodeBatch decoded (not on the wire): the receiver
	// logs it as it arrived instead of encoding it again.
	Raw []byte
}

// Header is a batch's fields besides its entries.
type Header struct {
	Sender string
	Stream entry.StreamID
	// Snapshot marks a re-seed batch (snap): its stream is a one-off
	// snapshot stream, and its entries relay keys with the stamps they
	// hold.
	Snapshot bool
	// End, in the last batch of a re-seed (end), is the position in the
	// sender's real stream that the snapshot's state corresponds to: the
	// receiver raises that stream's high-water mark to it in the same
	// commit as the batch's entries, so shipping resumes right after it.
	End *SnapshotEnd
	// Begin, in the first batch of a re-seed that lets live entries flow
	// meanwhile (bg), is the same position as End: the receiver raises
	// the real stream's mark to it at once, counting what it skips as
	// seeded, and records the re-seed as open until its trailer comes (it
	// says so in its heartbeat answers, so a sender that lost track of it
	// sends it again). Only to a receiver that takes it (Limits.Markers).
	Begin *SnapshotEnd
	// Marks, with End, are the sender's high-water marks of other
	// clusters' streams as of the snapshot (mk): the snapshot's state holds
	// the effects of those entries, so the receiver raises its own marks to
	// them, and it then knows how far each stream went even where it got
	// the stream's effects only relayed (a node restored from a backup is
	// caught by any peer, not only by those it shipped to).
	Marks []Mark
	// Requested marks a re-seed the receiver asked for (req). Only such a
	// re-seed may bring back writes of the receiver's own origin, and the
	// receiver also checks that it did ask.
	Requested bool
	// Rejoin marks the re-seed a node sends each peer once it has caught up
	// after losing data (rj): its trailer ends the receiver's wait.
	Rejoin bool
	// Rejoining, in a heartbeat (rq), is the sender's rejoin phase with the
	// receiver: RejoinRequesting asks for a re-seed (the sender lost data,
	// wiped or restored from a backup, and will re-seed the receiver in
	// turn once it has caught up), RejoinSeeding says the sender got it and
	// will re-seed the receiver, 0 says it is not rejoining. Every heartbeat
	// says it, so a receiver whose own record of it was rolled back (it was
	// itself restored from a backup) is set right by the next one.
	Rejoining uint8
	// Backfill marks a snapshot batch of a backfill (bf): the link's filter
	// widened, and the snapshot carries the newly included ranges. Its
	// trailer is BackfillEnd, not End: a backfill does not move the
	// sender's stream here (live entries flow meanwhile).
	Backfill bool
	// BackfillEnd, in the last batch of a backfill (bfe), names the
	// ranges it carried and the sender's horizon: the receiver drops the
	// keys of those ranges it did not carry, that another cluster wrote
	// below the horizon (the sender collected their deletes).
	BackfillEnd *BackfillEnd
	// OwnFilter, in a heartbeat (of), is the sender's filter toward the
	// receiver now: what of the sender's own writes may reach it. The
	// receiver records it in its log and keeps the sender's writes it
	// would not send out of what other clusters relay in snapshots
	// (issue 45). Only to a receiver that takes it (Limits.OriginFilters).
	OwnFilter *entry.Filter
	// Keeps, with OwnFilter (keeps), are the ranges whose deletes the
	// sender keeps for each of its other links (entry.LinkSettings.
	// KeepSpans: what a filter held back, not yet carried by a widening's
	// backfill). The receiver keeps the sender's own deletes in them too,
	// so that one the sender loses (a wiped or restored data directory)
	// comes back to it by its rejoin, and reaches the link's peer after.
	Keeps []TargetSpans
	// Idle, in a heartbeat (idle), says the receiver acknowledged every
	// entry of the stream up to Index, the last there is, and that any
	// entry appended later is committed above Bound: nothing older than
	// Bound (less the pin window) can still come from this stream. A
	// receiver whose mark is at Index counts Bound as the sender's
	// frontier, so that a peer that writes nothing does not hold its
	// tombstone collection back for ever. Only to a receiver that takes
	// it (Limits.IdleFrontiers).
	Idle *IdleFrontier
	// Open, in a heartbeat (open), are the sender cluster's open streams:
	// every stream that may still carry entries, Stream among them, in
	// byte order (one at a cluster of one raft group; one per group at a
	// cluster of several; a stream a restore or a lost majority replaced
	// is not in it). The receiver records them in its log, and its
	// tombstone collection waits for the least advanced of them (issue
	// 51: a lagging stream may still bring old writes while the others
	// run ahead). Only to a receiver that takes it (Limits.OpenStreams).
	Open []entry.StreamID
}

// MaxOpenStreams bounds Header.Open: 64 groups, and as many again while a
// change of their number replaces streams.
const MaxOpenStreams = 128

// TargetSpans are ranges of a link to Target.
type TargetSpans = entry.TargetSpans

// MaxKeeps bounds Header.Keeps (links), and MaxKeepSpans the ranges of
// one.
const (
	MaxKeeps     = 256
	MaxKeepSpans = 1024
)

// IdleFrontier is a heartbeat's Idle.
type IdleFrontier struct {
	Index uint64
	Bound hlc.Timestamp
}

// BackfillEnd is a backfill's trailer.
type BackfillEnd struct {
	Horizon hlc.Timestamp
	Spans   []entry.Span
}

// MaxBackfillSpans bounds the ranges of one backfill.
const MaxBackfillSpans = 4 * entry.MaxFilterPrefixes

// Rejoin phases a heartbeat carries (Header.Rejoining); the values are
// store.RejoinRequesting and store.RejoinSeeding.
const (
	RejoinRequesting = 1
	RejoinSeeding    = 2
)

// Mark is a high-water mark of one cluster's stream.
type Mark struct {
	Origin string
	Stream entry.StreamID
	Index  uint64
	Commit hlc.Timestamp
}

// MaxMarks bounds the marks of one trailer.
const MaxMarks = 1 << 16

// SnapshotEnd is a position in a stream: an index and its commit HLC.
type SnapshotEnd struct {
	Stream entry.StreamID
	Index  uint64
	Commit hlc.Timestamp
}

// AppendBatchHeader appends a plain batch's map header and fields up to the
// entries array header; the caller then appends n encoded entries.
func AppendBatchHeader(dst []byte, sender string, stream entry.StreamID, n int) []byte {
	return AppendHeader(dst, &Header{Sender: sender, Stream: stream}, n)
}

// AppendHeader appends h's map header and fields up to the entries array
// header; the caller then appends n encoded entries.
func AppendHeader(dst []byte, h *Header, n int) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	fields := 4
	for _, on := range []bool{h.Snapshot, h.End != nil, h.Begin != nil, h.Requested, h.Rejoin, h.Rejoining != 0, len(h.Marks) > 0, h.Backfill, h.BackfillEnd != nil, h.OwnFilter != nil, h.Idle != nil, len(h.Keeps) > 0, len(h.Open) > 0} {
		if on {
			fields++
		}
	}
	_ = enc.EncodeMapLen(fields)
	_ = enc.EncodeString("v")
	_ = enc.EncodeUint(Version)
	_ = enc.EncodeString("sender")
	_ = enc.EncodeString(h.Sender)
	_ = enc.EncodeString("stream")
	_ = enc.EncodeBytes(h.Stream[:])
	if h.Snapshot {
		_ = enc.EncodeString("snap")
		_ = enc.EncodeBool(true)
	}
	for _, f := range []struct {
		name string
		at   *SnapshotEnd
	}{{"end", h.End}, {"bg", h.Begin}} {
		if f.at != nil {
			_ = enc.EncodeString(f.name)
			_ = enc.EncodeArrayLen(4)
			_ = enc.EncodeBytes(f.at.Stream[:])
			_ = enc.EncodeUint(f.at.Index)
			_ = enc.EncodeInt(f.at.Commit.Wall)
			_ = enc.EncodeUint(uint64(f.at.Commit.Logical))
		}
	}
	for _, f := range []struct {
		name string
		on   bool
	}{{"req", h.Requested}, {"rj", h.Rejoin}} {
		if f.on {
			_ = enc.EncodeString(f.name)
			_ = enc.EncodeBool(true)
		}
	}
	if h.Rejoining != 0 {
		_ = enc.EncodeString("rq")
		_ = enc.EncodeUint(uint64(h.Rejoining))
	}
	if len(h.Marks) > 0 {
		_ = enc.EncodeString("mk")
		_ = enc.EncodeArrayLen(len(h.Marks))
		for _, m := range h.Marks {
			_ = enc.EncodeArrayLen(5)
			_ = enc.EncodeString(m.Origin)
			_ = enc.EncodeBytes(m.Stream[:])
			_ = enc.EncodeUint(m.Index)
			_ = enc.EncodeInt(m.Commit.Wall)
			_ = enc.EncodeUint(uint64(m.Commit.Logical))
		}
	}
	if h.Backfill {
		_ = enc.EncodeString("bf")
		_ = enc.EncodeBool(true)
	}
	if be := h.BackfillEnd; be != nil {
		_ = enc.EncodeString("bfe")
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeInt(be.Horizon.Wall)
		_ = enc.EncodeUint(uint64(be.Horizon.Logical))
		_ = enc.EncodeArrayLen(len(be.Spans))
		for _, sp := range be.Spans {
			_ = enc.EncodeArrayLen(2)
			_ = enc.EncodeString(sp.Start)
			_ = enc.EncodeString(sp.End)
		}
	}
	if f := h.OwnFilter; f != nil {
		_ = enc.EncodeString("of")
		_ = enc.EncodeArrayLen(2)
		for _, list := range [][]string{f.Include, f.Exclude} {
			_ = enc.EncodeArrayLen(len(list))
			for _, p := range list {
				_ = enc.EncodeString(p)
			}
		}
	}
	if len(h.Keeps) > 0 {
		_ = enc.EncodeString("keeps")
		_ = enc.EncodeArrayLen(len(h.Keeps))
		for _, k := range h.Keeps {
			_ = enc.EncodeArrayLen(2)
			_ = enc.EncodeString(k.Target)
			_ = enc.EncodeArrayLen(2 * len(k.Spans))
			for _, sp := range k.Spans {
				_ = enc.EncodeString(sp.Start)
				_ = enc.EncodeString(sp.End)
			}
		}
	}
	if i := h.Idle; i != nil {
		_ = enc.EncodeString("idle")
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeUint(i.Index)
		_ = enc.EncodeInt(i.Bound.Wall)
		_ = enc.EncodeUint(uint64(i.Bound.Logical))
	}
	if len(h.Open) > 0 {
		_ = enc.EncodeString("open")
		_ = enc.EncodeArrayLen(len(h.Open))
		for _, st := range h.Open {
			_ = enc.EncodeBytes(st[:])
		}
	}
	_ = enc.EncodeString("entries")
	_ = enc.EncodeArrayLen(n)
	return append(dst, buf.Bytes()...)
}

// DecodeTargetSpans reads Keeps: valid, sorted and distinct targets, each
// with sorted, disjoint, non-empty ranges.
func DecodeTargetSpans(dec *msgpack.Decoder) ([]TargetSpans, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("ranges of %d links", n)
	}
	return DecodeTargetSpansAfter(dec, n)
}

// DecodeTargetSpansAfter is DecodeTargetSpans once the array's length n
// was read.
func DecodeTargetSpansAfter(dec *msgpack.Decoder, n int) ([]TargetSpans, error) {
	if n < 0 || n > MaxKeeps {
		return nil, fmt.Errorf("ranges of %d links", n)
	}
	var err error
	out := make([]TargetSpans, 0, n)
	for i := 0; i < n; i++ {
		if m, err := dec.DecodeArrayLen(); err != nil || m != 2 {
			return nil, fmt.Errorf("link ranges %d: want an array of 2 (%v)", i, err)
		}
		var k TargetSpans
		if k.Target, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if checkCluster(k.Target) != nil || (i > 0 && k.Target <= out[i-1].Target) {
			return nil, fmt.Errorf("ranges of link %q (after %d links)", k.Target, i)
		}
		if k.Spans, err = DecodeSpanList(dec, MaxKeepSpans); err != nil {
			return nil, fmt.Errorf("ranges of %s: %w", k.Target, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// DecodeSpanList reads a list of ranges encoded flat (start, end, start,
// end, ...): at least one, at most max, each non-empty, in order and
// disjoint. The keep ranges of heartbeats and of collect commands share it.
func DecodeSpanList(dec *msgpack.Decoder, max int) ([]entry.Span, error) {
	m, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if m < 2 || m%2 != 0 || m > 2*max {
		return nil, fmt.Errorf("%d bounds", m)
	}
	spans := make([]entry.Span, 0, m/2)
	for j := 0; j < m/2; j++ {
		var sp entry.Span
		if sp.Start, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if sp.End, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if sp.End != "" && sp.End <= sp.Start {
			return nil, fmt.Errorf("range [%q, %q) is empty", sp.Start, sp.End)
		}
		if l := len(spans); l > 0 && (spans[l-1].End == "" || sp.Start < spans[l-1].End) {
			return nil, fmt.Errorf("ranges out of order")
		}
		spans = append(spans, sp)
	}
	return spans, nil
}

func decodeIdle(dec *msgpack.Decoder) (*IdleFrontier, error) {
	if n, err := dec.DecodeArrayLen(); err != nil || n != 3 {
		return nil, fmt.Errorf("idle: want an array of 3 (%v)", err)
	}
	var i IdleFrontier
	var err error
	if i.Index, err = dec.DecodeUint64(); err != nil {
		return nil, err
	}
	if i.Bound.Wall, err = dec.DecodeInt64(); err != nil {
		return nil, err
	}
	if i.Bound.Logical, err = dec.DecodeUint32(); err != nil {
		return nil, err
	}
	if i.Bound.Wall <= 0 {
		return nil, fmt.Errorf("idle bound %d", i.Bound.Wall)
	}
	return &i, nil
}

// DecodeOpen reads a list of open streams (Header.Open, and the link
// command that records it): 1 to MaxOpenStreams streams, none zero, in
// strictly increasing byte order.
func DecodeOpen(dec *msgpack.Decoder) ([]entry.StreamID, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > MaxOpenStreams {
		return nil, fmt.Errorf("%d open streams", n)
	}
	out := make([]entry.StreamID, n)
	for i := range out {
		b, err := DecodeBytes(dec)
		if err != nil {
			return nil, err
		}
		if len(b) != len(out[i]) {
			return nil, fmt.Errorf("open stream %d of %d bytes", i, len(b))
		}
		copy(out[i][:], b)
		if out[i].IsZero() || (i > 0 && out[i-1].Compare(out[i]) >= 0) {
			return nil, fmt.Errorf("open stream %d zero or out of order", i)
		}
	}
	return out, nil
}

func decodeOwnFilter(dec *msgpack.Decoder) (*entry.Filter, error) {
	if n, err := dec.DecodeArrayLen(); err != nil || n != 2 {
		return nil, fmt.Errorf("own filter: want an array of 2 (%v)", err)
	}
	var f entry.Filter
	for _, list := range []*[]string{&f.Include, &f.Exclude} {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		if n < 0 || n > entry.MaxFilterPrefixes {
			return nil, fmt.Errorf("a filter of %d prefixes", n)
		}
		for i := 0; i < n; i++ {
			p, err := dec.DecodeString()
			if err != nil {
				return nil, err
			}
			*list = append(*list, p)
		}
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

func decodeBackfillEnd(dec *msgpack.Decoder) (*BackfillEnd, error) {
	if n, err := dec.DecodeArrayLen(); err != nil || n != 3 {
		return nil, fmt.Errorf("backfill end: want an array of 3 (%v)", err)
	}
	var be BackfillEnd
	var err error
	if be.Horizon.Wall, err = dec.DecodeInt64(); err != nil {
		return nil, err
	}
	if be.Horizon.Logical, err = dec.DecodeUint32(); err != nil {
		return nil, err
	}
	if be.Horizon.Wall < 0 {
		return nil, fmt.Errorf("negative horizon %d", be.Horizon.Wall)
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > MaxBackfillSpans {
		return nil, fmt.Errorf("backfill of %d ranges", n)
	}
	for i := 0; i < n; i++ {
		if l, err := dec.DecodeArrayLen(); err != nil || l != 2 {
			return nil, fmt.Errorf("range %d: want an array of 2 (%v)", i, err)
		}
		var sp entry.Span
		if sp.Start, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if sp.End, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if sp.End != "" && sp.End <= sp.Start {
			return nil, fmt.Errorf("range %d: [%q, %q) is empty", i, sp.Start, sp.End)
		}
		be.Spans = append(be.Spans, sp)
	}
	return &be, nil
}

func decodeMarks(dec *msgpack.Decoder) ([]Mark, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > MaxMarks {
		return nil, fmt.Errorf("marks array of %d", n)
	}
	out := make([]Mark, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		if l, err := dec.DecodeArrayLen(); err != nil || l != 5 {
			return nil, fmt.Errorf("mark %d: want an array of 5 (%v)", i, err)
		}
		var m Mark
		if m.Origin, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if err := checkCluster(m.Origin); err != nil {
			return nil, fmt.Errorf("mark %d: %v", i, err)
		}
		s, err := DecodeBytes(dec)
		if err != nil {
			return nil, err
		}
		if len(s) != len(m.Stream) {
			return nil, fmt.Errorf("mark %d: stream of %d bytes", i, len(s))
		}
		copy(m.Stream[:], s)
		if m.Index, err = dec.DecodeUint64(); err != nil {
			return nil, err
		}
		if m.Commit.Wall, err = dec.DecodeInt64(); err != nil {
			return nil, err
		}
		if m.Commit.Logical, err = dec.DecodeUint32(); err != nil {
			return nil, err
		}
		if m.Stream.IsZero() || m.Index == 0 || m.Commit.Wall <= 0 {
			return nil, fmt.Errorf("mark %d out of range", i)
		}
		out = append(out, m)
	}
	return out, nil
}

func decodeEnd(dec *msgpack.Decoder) (*SnapshotEnd, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n != 4 {
		return nil, fmt.Errorf("end of %d elements, want 4", n)
	}
	var e SnapshotEnd
	s, err := DecodeBytes(dec)
	if err != nil {
		return nil, err
	}
	if len(s) != len(e.Stream) {
		return nil, fmt.Errorf("end stream of %d bytes", len(s))
	}
	copy(e.Stream[:], s)
	if e.Stream.IsZero() {
		return nil, errors.New("end names no stream")
	}
	if e.Index, err = dec.DecodeUint64(); err != nil {
		return nil, err
	}
	if e.Commit.Wall, err = dec.DecodeInt64(); err != nil {
		return nil, err
	}
	if e.Commit.Wall < 0 {
		return nil, fmt.Errorf("negative end commit %d", e.Commit.Wall)
	}
	if e.Commit.Logical, err = dec.DecodeUint32(); err != nil {
		return nil, err
	}
	return &e, nil
}

// EncodeBatch encodes b (tests and tools; the shipper copies WAL bytes).
func EncodeBatch(b *Batch) []byte {
	out := AppendHeader(nil, &b.Header, len(b.Entries))
	c := NewCodec()
	d := Defaults{Origin: b.Sender, Stream: b.Stream}
	for i := range b.Entries {
		out = c.AppendEntry(out, &b.Entries[i], d)
	}
	return out
}

// MaxBatchEntries bounds the entries of one batch on decode.
const MaxBatchEntries = 1 << 20

// DecodeBatch decodes and validates a batch: version first, then sender,
// stream and every entry. Nothing about it is trusted yet: the acceptor
// checks the sender against the authenticated peer.
func DecodeBatch(body []byte) (*Batch, error) {
	rd := bytes.NewReader(body)
	dec := msgpack.NewDecoder(rd)
	n, err := dec.DecodeMapLen()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if n < 0 || n > 17 {
		return nil, fmt.Errorf("%w: batch map of %d fields", ErrMalformed, n)
	}
	var (
		b       Batch
		version uint64
		decoded bool
		have    = map[string]bool{}
	)
	for i := 0; i < n; i++ {
		name, err := dec.DecodeString()
		if err != nil {
			return nil, fmt.Errorf("%w: field name: %v", ErrMalformed, err)
		}
		if have[name] {
			return nil, fmt.Errorf("%w: field %q twice", ErrMalformed, name)
		}
		have[name] = true
		switch name {
		case "v":
			version, err = dec.DecodeUint64()
			if err == nil && version != Version {
				return nil, fmt.Errorf("%w %d: this node speaks version %d", ErrVersion, version, Version)
			}
		case "sender":
			b.Sender, err = dec.DecodeString()
		case "stream":
			var s []byte
			s, err = DecodeBytes(dec)
			if err == nil && len(s) != len(b.Stream) {
				err = fmt.Errorf("stream of %d bytes", len(s))
			}
			copy(b.Stream[:], s)
		case "snap":
			b.Snapshot, err = dec.DecodeBool()
		case "end":
			b.End, err = decodeEnd(dec)
		case "bg":
			b.Begin, err = decodeEnd(dec)
		case "mk":
			b.Marks, err = decodeMarks(dec)
		case "req":
			b.Requested, err = dec.DecodeBool()
		case "rj":
			b.Rejoin, err = dec.DecodeBool()
		case "rq":
			b.Rejoining, err = dec.DecodeUint8()
			if err == nil && (b.Rejoining < RejoinRequesting || b.Rejoining > RejoinSeeding) {
				err = fmt.Errorf("rejoin phase %d", b.Rejoining)
			}
		case "bf":
			b.Backfill, err = dec.DecodeBool()
		case "bfe":
			b.BackfillEnd, err = decodeBackfillEnd(dec)
		case "of":
			b.OwnFilter, err = decodeOwnFilter(dec)
		case "idle":
			b.Idle, err = decodeIdle(dec)
		case "keeps":
			b.Keeps, err = DecodeTargetSpans(dec)
		case "open":
			b.Open, err = DecodeOpen(dec)
		case "entries":
			if !have["sender"] || !have["stream"] {
				// Skipping an unread value means walking it, and a
				// nested one recursively: entries come after the fields
				// they default to, as every encoder writes them.
				return nil, fmt.Errorf("%w: entries before sender and stream", ErrMalformed)
			}
			b.Entries, err = decodeEntries(dec, &b)
			decoded = true
		default:
			return nil, fmt.Errorf("%w: unknown field %q", ErrMalformed, name)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: field %q: %v", ErrMalformed, name, err)
		}
	}
	if !have["v"] {
		return nil, fmt.Errorf("%w: no version field: this node speaks version %d", ErrVersion, Version)
	}
	if rd.Len() != 0 {
		return nil, fmt.Errorf("%w: trailing bytes after the batch", ErrMalformed)
	}
	if err := checkCluster(b.Sender); err != nil {
		return nil, fmt.Errorf("%w: sender: %v", ErrMalformed, err)
	}
	if b.Stream.IsZero() {
		return nil, fmt.Errorf("%w: no stream", ErrMalformed)
	}
	if b.Rejoining != 0 && b.Snapshot {
		return nil, fmt.Errorf("%w: a rejoin phase on a snapshot batch", ErrMalformed)
	}
	if (b.OwnFilter != nil || b.Idle != nil || len(b.Keeps) > 0) && b.Snapshot {
		return nil, fmt.Errorf("%w: an own filter or an idle frontier on a snapshot batch", ErrMalformed)
	}
	if len(b.Open) > 0 && (b.Snapshot || len(b.Entries) > 0 || !slices.Contains(b.Open, b.Stream)) {
		return nil, fmt.Errorf("%w: open streams outside a heartbeat, or without the heartbeat's own stream", ErrMalformed)
	}
	if len(b.Marks) > 0 && b.End == nil {
		return nil, fmt.Errorf("%w: marks outside a re-seed's trailer", ErrMalformed)
	}
	if (b.End != nil || b.Begin != nil || b.Requested || b.Rejoin) && !b.Snapshot {
		return nil, fmt.Errorf("%w: re-seed fields on a batch that is not a snapshot", ErrMalformed)
	}
	if (b.Backfill || b.BackfillEnd != nil) && (!b.Snapshot || !b.Backfill || b.End != nil || b.Begin != nil || b.Requested || b.Rejoin) {
		return nil, fmt.Errorf("%w: backfill fields on a batch that is not a backfill's snapshot", ErrMalformed)
	}
	if b.End != nil && b.End.Stream == b.Stream {
		return nil, fmt.Errorf("%w: a snapshot cannot end in its own stream", ErrMalformed)
	}
	if b.Begin != nil && b.Begin.Stream == b.Stream {
		return nil, fmt.Errorf("%w: a re-seed cannot begin in its own stream", ErrMalformed)
	}
	if b.Begin != nil && b.End != nil && *b.Begin != *b.End {
		return nil, fmt.Errorf("%w: a re-seed's begin and end differ", ErrMalformed)
	}
	if !decoded {
		return nil, fmt.Errorf("%w: no entries field", ErrMalformed)
	}
	// Entries were decoded against a sender and stream not yet validated;
	// they are now, and entries carry them by default.
	b.Raw = body
	return &b, nil
}

func decodeEntries(dec *msgpack.Decoder, b *Batch) ([]entry.Entry, error) {
	count, err := dec.DecodeArrayLen()
	if err != nil || count < 0 || count > MaxBatchEntries {
		return nil, fmt.Errorf("%w: entries: want an array of at most %d", ErrMalformed, MaxBatchEntries)
	}
	d := Defaults{Origin: b.Sender, Stream: b.Stream}
	ents := make([]entry.Entry, 0, min(count, 4096))
	for i := 0; i < count; i++ {
		e, err := DecodeEntryFrom(dec, d)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d: %v", ErrMalformed, i, err)
		}
		ents = append(ents, e)
	}
	return ents, nil
}

func checkCluster(id string) error {
	if !entry.ValidClusterID(id) {
		return fmt.Errorf("invalid cluster id %q: want %s", id, entry.ClusterIDPattern)
	}
	return nil
}
