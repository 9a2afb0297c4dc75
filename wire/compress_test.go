package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// zeros reads n zero bytes.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := int64(len(p))
	if k > z.n {
		k = z.n
	}
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// TestDecompressRoundTrip: a compressed body decodes to what was sent; a
// plain one passes as is; an encoding this build does not decode is
// refused as such.
func TestDecompressRoundTrip(t *testing.T) {
	d := NewDecompressor(1 << 20)
	defer d.Close()
	src := bytes.Repeat([]byte(`{"tenant":"t1","kind":"order","state":"paid"}`), 200)
	z, err := Compress(nil, src)
	if err != nil {
		t.Fatal(err)
	}
	if len(z) >= len(src)/10 {
		t.Fatalf("%d bytes compressed to %d", len(src), len(z))
	}
	for _, enc := range []string{EncodingZstd, ""} {
		body := z
		if enc == "" {
			body = src
		}
		out, err := d.Decode(enc, body)
		if err != nil || !bytes.Equal(out, src) {
			t.Fatalf("decode %q: %v (%d bytes)", enc, err, len(out))
		}
	}
	if _, err := d.Decode("gzip", z); !errors.Is(err, ErrEncoding) {
		t.Fatalf("gzip: %v", err)
	}
	if _, err := d.Decode(EncodingZstd, []byte("not zstd at all")); !errors.Is(err, ErrMalformed) {
		t.Fatalf("garbage: %v", err)
	}
}

// TestDecompressBomb: 256 MiB of zeros, compressed to a few KiB, against a
// 1 MiB bound: refused as too large, and decoding it allocates about the
// bound, not the 256 MiB it claims (with the frame's size declared, and
// without).
func TestDecompressBomb(t *testing.T) {
	const limit = 1 << 20
	d := NewDecompressor(limit)
	defer d.Close()
	for _, declared := range []bool{false, true} {
		var buf bytes.Buffer
		opts := []zstd.EOption{zstd.WithEncoderConcurrency(1)}
		w, err := zstd.NewWriter(&buf, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if declared {
			w.ResetContentSize(&buf, 256<<20)
		}
		if _, err := io.Copy(w, &zeros{n: 256 << 20}); err != nil {
			t.Fatal(err)
		}
		w.Close()
		bomb := buf.Bytes()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err = d.Decode(EncodingZstd, bomb)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrDecodedTooLarge) {
			t.Fatalf("a %d-byte bomb of 256 MiB (size declared %v): %v", len(bomb), declared, err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16*limit {
			t.Fatalf("refusing a bomb (size declared %v) allocated %d bytes, bound %d", declared, alloc, limit)
		}
	}
}

// FuzzDecompress: any body decodes within the bound or is refused; never a
// panic, never more than the bound.
func FuzzDecompress(f *testing.F) {
	z, _ := Compress(nil, bytes.Repeat([]byte("abc"), 1000))
	f.Add(z)
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0})
	f.Add([]byte("plain"))
	d := NewDecompressor(64 << 10)
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := d.Decode(EncodingZstd, body)
		if err == nil && len(out) > 64<<10 {
			t.Fatalf("decoded %d bytes past a bound of %d", len(out), 64<<10)
		}
		if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrDecodedTooLarge) {
			t.Fatalf("an error of no class: %v", err)
		}
	})
}

// TestDecompressRatio (issue 46, 8): a small body that would decode far
// past MaxRatio times its size is refused after decoding about that much,
// within the decoded limit; a body as compressible as real batches decodes.
func TestDecompressRatio(t *testing.T) {
	d := NewDecompressor(16 << 20)
	defer d.Close()
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, &zeros{n: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	bomb := buf.Bytes()
	// Within the decoded limit, the old bound: refused by the ratio (the
	// decoder reads no further than MaxRatio times the body).
	if _, err = d.Decode(EncodingZstd, bomb); !errors.Is(err, ErrDecodedTooLarge) || !strings.Contains(err.Error(), ":1") {
		t.Fatalf("a %d-byte body of 8 MiB (%d:1) under a 16 MiB limit: %v", len(bomb), (8<<20)/len(bomb), err)
	}
	// A batch of similar entries: records alike but for a counter.
	var real []byte
	for i := 0; i < 1<<14; i++ {
		real = fmt.Appendf(real, "{\"key\":\"orders/2026/12/%08d\",\"value\":\"status=shipped;carrier=ups;n=%d\"}", i*7919%100000, i)
	}
	body, err := Compress(nil, real)
	if err != nil {
		t.Fatal(err)
	}
	out, err := d.Decode(EncodingZstd, body)
	if err != nil || !bytes.Equal(out, real) {
		t.Fatalf("a body of %d:1: %v", len(real)/len(body), err)
	}
}
