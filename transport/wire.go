package transport

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/wal"
)

// WireVersion is the only batch version this build speaks.
const WireVersion = 1

// ContentType is the media type of a batch.
const ContentType = "application/msgpack"

// Headers of a replicate request.
const (
	HeaderOrigin = "X-Replicator-Origin"
)

// ErrMalformed is the class of errors for a batch that does not decode.
var ErrMalformed = errors.New("transport: malformed batch")

// ErrVersion is the class of errors for a batch of another wire version.
var ErrVersion = errors.New("transport: unsupported wire version")

// Batch is what a shipper POSTs to a peer's /v1/replicate:
//
//	{v: 1, sender: "<cluster>", stream: <16 bytes>, entries: [entry...]}
//
// Entries leave out origin and stream when they equal sender and stream, so a
// shipper copies its WAL's bytes onto the wire unchanged.
type Batch struct {
	Sender  string
	Stream  wal.StreamID
	Entries []wal.Entry
	// Snapshot marks a re-seed batch: its stream is a one-off snapshot
	// stream, and its entries relay keys with the stamps they hold.
	Snapshot bool
}

// AppendBatchHeader appends the batch's map header and fields up to the
// entries array header; the caller then appends n encoded entries.
func AppendBatchHeader(dst []byte, sender string, stream wal.StreamID, n int) []byte {
	return appendHeader(dst, sender, stream, n, false)
}

func appendHeader(dst []byte, sender string, stream wal.StreamID, n int, snapshot bool) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	fields := 4
	if snapshot {
		fields = 5
	}
	_ = enc.EncodeMapLen(fields)
	_ = enc.EncodeString("v")
	_ = enc.EncodeUint(WireVersion)
	_ = enc.EncodeString("sender")
	_ = enc.EncodeString(sender)
	_ = enc.EncodeString("stream")
	_ = enc.EncodeBytes(stream[:])
	if snapshot {
		_ = enc.EncodeString("snap")
		_ = enc.EncodeBool(true)
	}
	_ = enc.EncodeString("entries")
	_ = enc.EncodeArrayLen(n)
	return append(dst, buf.Bytes()...)
}

// EncodeBatch encodes b (tests and tools; the shipper copies WAL bytes).
func EncodeBatch(b *Batch) []byte {
	out := appendHeader(nil, b.Sender, b.Stream, len(b.Entries), b.Snapshot)
	c := wal.NewCodec()
	d := wal.Defaults{Origin: b.Sender, Stream: b.Stream}
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
	if n < 0 || n > 8 {
		return nil, fmt.Errorf("%w: batch map of %d fields", ErrMalformed, n)
	}
	var (
		b       Batch
		version uint64
		raw     []byte
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
			if err == nil && version != WireVersion {
				return nil, fmt.Errorf("%w %d: this node speaks version %d", ErrVersion, version, WireVersion)
			}
		case "sender":
			b.Sender, err = dec.DecodeString()
		case "stream":
			var s []byte
			s, err = dec.DecodeBytes()
			if err == nil && len(s) != len(b.Stream) {
				err = fmt.Errorf("stream of %d bytes", len(s))
			}
			copy(b.Stream[:], s)
		case "snap":
			b.Snapshot, err = dec.DecodeBool()
		case "entries":
			if have["sender"] && have["stream"] {
				// The usual order: decode in place, no second pass.
				b.Entries, err = decodeEntries(dec, &b)
				decoded = true
			} else {
				raw, err = dec.DecodeRaw()
			}
		default:
			return nil, fmt.Errorf("%w: unknown field %q", ErrMalformed, name)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: field %q: %v", ErrMalformed, name, err)
		}
	}
	if !have["v"] {
		return nil, fmt.Errorf("%w: no version field: this node speaks version %d", ErrVersion, WireVersion)
	}
	if rd.Len() != 0 {
		return nil, fmt.Errorf("%w: trailing bytes after the batch", ErrMalformed)
	}
	if err := origin.Validate(b.Sender); err != nil {
		return nil, fmt.Errorf("%w: sender: %v", ErrMalformed, err)
	}
	if b.Stream.IsZero() {
		return nil, fmt.Errorf("%w: no stream", ErrMalformed)
	}
	if decoded {
		// Entries were decoded against a sender and stream not yet
		// validated; they are now, and entries carry them by default.
		return &b, nil
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: no entries field", ErrMalformed)
	}
	erd := bytes.NewReader(raw)
	b.Entries, err = decodeEntries(msgpack.NewDecoder(erd), &b)
	if err != nil {
		return nil, err
	}
	if erd.Len() != 0 {
		return nil, fmt.Errorf("%w: trailing bytes after the entries", ErrMalformed)
	}
	return &b, nil
}

func decodeEntries(dec *msgpack.Decoder, b *Batch) ([]wal.Entry, error) {
	count, err := dec.DecodeArrayLen()
	if err != nil || count < 0 || count > MaxBatchEntries {
		return nil, fmt.Errorf("%w: entries: want an array of at most %d", ErrMalformed, MaxBatchEntries)
	}
	d := wal.Defaults{Origin: b.Sender, Stream: b.Stream}
	ents := make([]wal.Entry, 0, min(count, 4096))
	for i := 0; i < count; i++ {
		e, err := wal.DecodeEntryFrom(dec, d)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d: %v", ErrMalformed, i, err)
		}
		ents = append(ents, e)
	}
	return ents, nil
}

// Ack is the acceptor's JSON answer to a batch it took (HTTP 200), and the
// "hwm" it reports with a gap refusal (HTTP 409) so the sender rewinds.
type Ack struct {
	// Accepted is the number of entries in the batch.
	Accepted int `json:"accepted"`
	// Applied entries changed state or lost LWW to a newer stamp already
	// here (stale); either way they are now accounted for.
	Applied int `json:"applied"`
	// Duplicates were here already: at or below the high-water mark, or
	// the same stamp as what the key holds.
	Duplicates int `json:"duplicates"`
	// HWM is the receiver's high-water mark for the sender's stream after
	// this batch: the sender's cursor.
	HWM uint64 `json:"hwm"`
	// SuggestedBatch is the largest batch the receiver wants next (0: no
	// preference).
	SuggestedBatch int `json:"suggested_batch"`
	// PauseMS asks the sender to wait this long before the next batch.
	PauseMS int `json:"pause_ms"`
	// Now is the receiver's physical clock (ns) when it answered; senders
	// estimate the clock skew between the clusters from it.
	Now int64 `json:"now,omitempty"`
}
