package httpapi

import (
	"errors"
	"testing"

	"github.com/replicator/replicator/api"
)

func FuzzDecodeDelta(f *testing.F) {
	f.Add([]byte(`{"delta": 1}`))
	f.Add([]byte(`{"delta": -9223372036854775807}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDelta(b)
		if err == nil && d == 0 {
			t.Fatal("zero delta accepted")
		}
		if err != nil && !errors.Is(err, api.ErrBadRequest) {
			t.Fatalf("error outside the bad-request class: %v", err)
		}
	})
}

func FuzzDecodeBatchRequest(f *testing.F) {
	f.Add([]byte(`{"ops":[{"op":"set","key":"t/1","value":"x"},{"op":"delete","key":"t/3"}],"operation_id":"op-1"}`))
	f.Add([]byte(`{"ops":[{"op":"set","key":"k","value_b64":"AAE="}]}`))
	f.Add([]byte(`{"ops":[{"op":"set","key":"k","value":"v","ttl":"30s"},{"op":"set","key":"j","expires":"2030-01-02T03:04:05Z"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, _, err := DecodeBatchRequest(b)
		if err != nil {
			if !errors.Is(err, api.ErrBadRequest) {
				t.Fatalf("error outside the bad-request class: %v", err)
			}
			return
		}
		for _, op := range ops {
			if op.Delete && len(op.Value) > 0 {
				t.Fatal("a delete with a value decoded")
			}
			if op.Expires < 0 || (op.Delete && op.Expires != 0) {
				t.Fatalf("an expiry of %d on %+v decoded", op.Expires, op)
			}
		}
	})
}

func FuzzDecodeBulkLine(f *testing.F) {
	f.Add([]byte(`{"key":"k","value":"v"}`))
	f.Add([]byte(`{"key":"k","value_b64":"AAE="}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := DecodeBulkLine(b); err != nil && !errors.Is(err, api.ErrBadRequest) {
			t.Fatalf("error outside the bad-request class: %v", err)
		}
		if fast, ok := fastBulkLine(b); ok {
			slow, err := slowBulkLine(b)
			if err != nil || slow.Key != fast.Key || string(slow.Value) != string(fast.Value) {
				t.Fatalf("fast path read %+v, encoding/json %+v %v", fast, slow, err)
			}
		}
	})
}

// TestBulkLineFastPathAgrees: the fast parser and encoding/json read the
// same records.
func TestBulkLineFastPathAgrees(t *testing.T) {
	for _, line := range []string{
		`{"key":"k","value":"v"}`, `{"key":"a/b c","value":""}`, `{"key":"ü","value":"ö"}`,
		`{"key":"k","value":"with \"quote\""}`, `{"key":"k\\n","value":"v"}`, `{ "key":"k","value":"v"}`,
		`{"key":"k","value":"v","x":1}`, `{"key":"k","value_b64":"AAE="}`,
	} {
		fast, fok := fastBulkLine([]byte(line))
		slow, serr := slowBulkLine([]byte(line))
		if fok && (serr != nil || fast.Key != slow.Key || string(fast.Value) != string(slow.Value)) {
			t.Fatalf("%s: fast %+v, slow %+v %v", line, fast, slow, serr)
		}
	}
}
