package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// A replicate request's body may be compressed (Content-Encoding: zstd)
// when the receiver said it decodes that: every answer of /v1/replicate
// (acks and heartbeats alike) names the encodings it decodes in
// HeaderAcceptEncoding, and a sender compresses only toward a receiver
// that named zstd; one that names nothing (an older build) gets plain
// msgpack. A custom header, not HTTP's Accept-Encoding, which speaks of
// response bodies.
const (
	EncodingZstd         = "zstd"
	HeaderAcceptEncoding = "X-Replicator-Accept-Encoding"
)

// Encodings is what this build decodes, as HeaderAcceptEncoding says it.
const Encodings = EncodingZstd

var (
	// ErrEncoding is the class of errors for a body in an encoding the
	// receiver does not decode.
	ErrEncoding = errors.New("wire: unsupported body encoding")
	// ErrDecodedTooLarge is the class of errors for a compressed body that
	// decodes past the receiver's bound: refused before the excess is
	// allocated (a compressed bomb costs the receiver its bound, at most).
	ErrDecodedTooLarge = errors.New("wire: decoded body over the limit")
)

// Decompressor decodes request bodies within a bound on the decoded size,
// the same bound a plain body has: a receiver's --replicate-max-bytes
// bounds both the bytes on the wire and the batch they decode to, so a
// sender sizes its batches by their decoded size.
type Decompressor struct {
	limit int64
	pool  sync.Pool // *zstd.Decoder, each decoding one body at a time
}

// MaxRatio bounds how many times its own size a compressed body may decode
// to. Real batches compress about 113-200:1 at most (keys with shared
// prefixes, repeated values); a bomb reaches 32,000:1. Decoding stops at
// the bound, so a small body costs the receiver at most its size times
// this in CPU and memory, not the whole decoded limit.
const MaxRatio = 1000

// NewDecompressor bounds decoded bodies at limit bytes.
func NewDecompressor(limit int64) *Decompressor { return &Decompressor{limit: limit} }

// Decode returns body decoded from encoding ("" or "identity": as is),
// within the decoded limit and MaxRatio times the body's size.
func (d *Decompressor) Decode(encoding string, body []byte) ([]byte, error) {
	switch encoding {
	case "", "identity":
		return body, nil
	case EncodingZstd:
	default:
		return nil, fmt.Errorf("%w: %q (this node decodes %s)", ErrEncoding, encoding, Encodings)
	}
	dec, _ := d.pool.Get().(*zstd.Decoder)
	if dec == nil {
		// A stream decoder of concurrency 1 decodes in the caller's
		// goroutine (none of its own), and reads no further than asked:
		// decoding stops at the bound. The window is bounded too.
		var err error
		dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(d.limit)),
			zstd.WithDecoderMaxWindow(max(uint64(d.limit), zstd.MinWindowSize)))
		if err != nil {
			return nil, err
		}
	}
	defer d.pool.Put(dec)
	bound := min(d.limit, MaxRatio*int64(len(body)))
	if err := dec.Reset(bytes.NewReader(body)); err != nil {
		return nil, fmt.Errorf("%w: zstd: %v", ErrMalformed, err)
	}
	out, err := io.ReadAll(io.LimitReader(dec, bound+1))
	switch {
	case errors.Is(err, zstd.ErrDecoderSizeExceeded), errors.Is(err, zstd.ErrWindowSizeExceeded), errors.Is(err, zstd.ErrFrameSizeExceeded):
		return nil, fmt.Errorf("%w: more than %d bytes once decoded", ErrDecodedTooLarge, d.limit)
	case err != nil:
		return nil, fmt.Errorf("%w: zstd: %v", ErrMalformed, err)
	case int64(len(out)) > bound && bound < d.limit:
		return nil, fmt.Errorf("%w: %d bytes decode to more than %d (%d:1; real batches stay far below)", ErrDecodedTooLarge, len(body), bound, MaxRatio)
	case int64(len(out)) > bound:
		return nil, fmt.Errorf("%w: more than %d bytes once decoded", ErrDecodedTooLarge, d.limit)
	}
	return out, nil
}

// Close releases the decoders kept for reuse.
func (d *Decompressor) Close() {
	for {
		dec, _ := d.pool.Get().(*zstd.Decoder)
		if dec == nil {
			return
		}
		dec.Close()
	}
}

var encoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	// EncodeAll only; the default level: batches of similar entries (keys
	// with shared prefixes, values with repeated field names) compress well
	// at it, at a fraction of the better levels' CPU.
	return zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true))
})

// Compress appends the zstd encoding of src to dst (a body for
// Content-Encoding: zstd).
func Compress(dst, src []byte) ([]byte, error) {
	enc, err := encoder()
	if err != nil {
		return nil, err
	}
	return enc.EncodeAll(src, dst), nil
}
