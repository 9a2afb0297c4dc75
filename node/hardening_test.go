package node

// Hostile input (issue 13): each test is named for the finding it covers.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/replicator/replicator/store"
)

// endless yields a CSV record that never ends: `"k","xxxxx...`.
type endless struct{ sent int64 }

func (e *endless) Read(p []byte) (int, error) {
	if e.sent == 0 {
		n := copy(p, `"k","`)
		e.sent += int64(n)
		return n, nil
	}
	if e.sent > 1<<30 {
		return 0, io.EOF
	}
	for i := range p {
		p[i] = 'x'
	}
	e.sent += int64(len(p))
	return len(p), nil
}

// TestBulkCSVRecordBounded: one CSV record of unbounded length is refused
// once it passes the line bound, without buffering it (a 300 MB record cost
// 1.1 GB of RSS before the 400).
func TestBulkCSVRecordBounded(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	src := &endless{}
	br := NewBulkReader(src, true, 2<<20)
	_, err := br.Next()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errBadRequest) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("an endless record: %v", err)
	}
	if src.sent > 8<<20 {
		t.Fatalf("read %d bytes of one record before refusing it, bound 2 MiB", src.sent)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("allocated %d MiB for one refused record", grew>>20)
	}
}

// TestBulkInvalidUTF8Refused: NDJSON with a key that is not valid UTF-8 is
// refused like CSV, not rewritten to U+FFFD.
func TestBulkInvalidUTF8Refused(t *testing.T) {
	for _, line := range []string{
		"{\"key\":\"k\xff\",\"value\":\"v\"}",        // fast path
		"{\"value\":\"v\",\"key\":\"k\xff\"}",        // slow path (field order)
		"{\"key\":\"k\\u00e9\xff\",\"value\":\"v\"}", // slow path (escape)
	} {
		if rec, err := DecodeBulkLine([]byte(line)); !errors.Is(err, errBadRequest) {
			t.Errorf("%q: %+v %v", line, rec, err)
		}
	}
	if _, _, err := DecodeBatchRequest([]byte("{\"ops\":[{\"op\":\"set\",\"key\":\"k\xff\",\"value\":\"v\"}]}")); !errors.Is(err, errBadRequest) {
		t.Errorf("batch with an invalid UTF-8 key: %v", err)
	}
}

// TestCounterRange: local increments that would leave the int64 range (or
// wrap a cluster's totals) are refused with a clear error; two +MaxInt64 no
// longer give -2.
func TestCounterRange(t *testing.T) {
	n := openNode(t, testOptions(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	if _, err := n.Increment(ctx, "c", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Increment(ctx, "c", math.MaxInt64); !errors.Is(err, ErrCounterRange) {
		t.Fatalf("a second +MaxInt64: %v", err)
	}
	if c, _ := n.Counter("c"); c.Value != math.MaxInt64 {
		t.Fatalf("counter %d after a refused overflow, want MaxInt64", c.Value)
	}
	if _, err := n.Increment(ctx, "c", -5); err != nil {
		t.Fatalf("a decrement back into range: %v", err)
	}
	// Totals merged from two clusters can each fit while their sum does
	// not: the value saturates, the same on every cluster.
	c := store.Counter{Totals: map[string]store.PN{"a": {P: math.MaxInt64}, "b": {P: math.MaxInt64}}}
	if c.Value() != math.MaxInt64 {
		t.Fatalf("merged value %d, want saturation at MaxInt64", c.Value())
	}
	c = store.Counter{Totals: map[string]store.PN{"a": {N: math.MaxInt64}, "b": {N: math.MaxInt64}}}
	if c.Value() != math.MinInt64 {
		t.Fatalf("merged value %d, want saturation at MinInt64", c.Value())
	}
}

// TestRangeDeleteGuard: a range from the smallest key to the end of the key
// space is "delete everything", which is not an API call (start=%00 used to
// pass the guard and empty every cluster).
func TestRangeDeleteGuard(t *testing.T) {
	n := openNode(t, testOptions(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	putN(t, n, "k", 3)
	for _, start := range []string{"\x00", "\x00\x00"} {
		if _, err := n.DeleteRange(ctx, start, ""); !errors.Is(err, errBadRequest) {
			t.Fatalf("DeleteRange(%q, \"\"): %v", start, err)
		}
	}
	if d, _ := n.Digest(); d.Keys != 3 {
		t.Fatalf("%d keys left, want 3", d.Keys)
	}
	if _, err := n.DeleteRange(ctx, "\x00", "k001"); err != nil {
		t.Fatalf("a bounded range from NUL: %v", err)
	}
}

// TestScanPageBoundedByBytes: a page stops at DefaultScanBytes of keys and
// values, not only at its item limit.
func TestScanPageBoundedByBytes(t *testing.T) {
	n := openNode(t, testOptions(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	big := make([]byte, 1<<20-64)
	for i := 0; i < 12; i++ {
		if _, err := n.Put(ctx, fmt.Sprintf("big%02d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	items, next, err := n.Scan(store.ScanOptions{Limit: store.MaxScanLimit})
	if err != nil || len(items) != 4 || next != "big03" {
		t.Fatalf("a page of 1 MiB values: %d items, next %q, %v; want 4 (4 MiB) and more to come", len(items), next, err)
	}
}
