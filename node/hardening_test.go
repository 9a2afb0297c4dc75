package node

// Hostile input (issue 13): each test is named for the finding it covers.

import (
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
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
