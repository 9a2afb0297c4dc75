package wire

import (
	"bytes"
	"errors"
	"reflect"
	"runtime"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

func TestEntryCodecRoundTrip(t *testing.T) {
	c := NewCodec()
	d := Defaults{Origin: "a", Stream: entry.StreamID{9}}
	for _, e := range []entry.Entry{
		{Index: 1, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "k", Value: []byte("v")},
		{Index: 1 << 40, Origin: "b", Stream: entry.StreamID{7}, Commit: hlc.Timestamp{Wall: 5, Logical: 2}, Stamp: hlc.Timestamp{Wall: 3}, Op: entry.OpDelete, Key: "k/ü"},
		{Index: 2, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "empty"},
		{Index: 3, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "ctx", Value: []byte("v"),
			Ctx: entry.Context{{Origin: "a", HLC: hlc.Timestamp{Wall: 5}}, {Origin: "c", HLC: hlc.Timestamp{Wall: 9, Logical: 3}}}},
		{Index: 4, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "ttl", Value: []byte("v"), Expires: 1e18},
		{Index: 5, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpMulti,
			Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "x", Value: []byte("1"), Expires: 7e17}, {Op: entry.OpDelete, Key: "y"}}},
		{Index: 6, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpDelete, Key: "ctr",
			Floors: map[string]entry.PN{"a": {P: 3}, "b/0123456789abcdef0123456789abcdef": {P: 1, N: 2}}},
		{Index: 7, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpCounter, Key: "ctr",
			Ctr: &entry.PN{P: 1}, CtrComp: "a", Clears: true, Floors: map[string]entry.PN{"a": {P: 3}}},
		{Index: 8, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpMulti,
			Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "x", Value: []byte("1"), Floors: map[string]entry.PN{"a": {P: 4}}}}},
	} {
		b := c.AppendEntry(nil, &e, d)
		got, err := c.DecodeEntry(b, d)
		if err != nil {
			t.Fatalf("%+v: %v", e, err)
		}
		if e.Stamp.IsZero() {
			e.Stamp = e.Commit
		}
		if got.Index != e.Index || got.Origin != e.Origin || got.Stream != e.Stream || got.Commit != e.Commit ||
			got.Stamp != e.Stamp || got.Op != e.Op || got.Key != e.Key || !bytes.Equal(got.Value, e.Value) || !reflect.DeepEqual(got.Ctx, e.Ctx) ||
			got.Expires != e.Expires || !opsEqual(got.Ops, e.Ops) || !reflect.DeepEqual(got.Floors, e.Floors) || got.Clears != e.Clears {
			t.Fatalf("round trip %+v -> %+v", e, got)
		}
	}
}

// opsEqual compares batch ops field by field (an empty value decodes as
// none).
func opsEqual(a, b []entry.BatchOp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Op != y.Op || x.Key != y.Key || !bytes.Equal(x.Value, y.Value) || x.End != y.End || x.Expires != y.Expires ||
			!reflect.DeepEqual(x.Ctx, y.Ctx) || !reflect.DeepEqual(x.Floors, y.Floors) {
			return false
		}
	}
	return true
}

func FuzzDecodeEntry(f *testing.F) {
	c := NewCodec()
	d := Defaults{Origin: "a", Stream: entry.StreamID{9}}
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 3, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "k", Value: []byte("v"), Origin: "a", Stream: entry.StreamID{9}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 3, Commit: hlc.Timestamp{Wall: 5}, Stamp: hlc.Timestamp{Wall: 4}, Op: entry.OpDelete, Key: "k", Origin: "b", Stream: entry.StreamID{1}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 4, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpCounter, Key: "c", Ctr: &entry.PN{P: 2, N: 1},
		CtrComp: "a/0123456789abcdef0123456789abcdef", Origin: "a", Stream: entry.StreamID{9}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 5, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpMulti, Oversize: 70 << 20, Origin: "a", Stream: entry.StreamID{9}}, d))
	ctx := entry.Context{{Origin: "a", HLC: hlc.Timestamp{Wall: 5}}, {Origin: "b", HLC: hlc.Timestamp{Wall: 3, Logical: 1}}}
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 6, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "k", Value: []byte("v"), Ctx: ctx, Origin: "a", Stream: entry.StreamID{9}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 7, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpMulti, Origin: "a", Stream: entry.StreamID{9},
		Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "x", Value: []byte("1"), Ctx: ctx}, {Op: entry.OpDelete, Key: "y"}}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 8, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "k", Value: []byte("v"), Expires: 9e17, Origin: "a", Stream: entry.StreamID{9}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 9, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpMulti, Origin: "a", Stream: entry.StreamID{9},
		Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "x", Value: []byte("1"), Expires: 9e17}}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 10, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpCounter, Key: "c", Ctr: &entry.PN{P: 2},
		CtrComp: "a", Clears: true, Floors: map[string]entry.PN{"a": {P: 1}, "b": {N: 4}}, Origin: "a", Stream: entry.StreamID{9}}, d))
	f.Add(c.AppendEntry(nil, &entry.Entry{Index: 11, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpMulti, Origin: "a", Stream: entry.StreamID{9},
		Ops: []entry.BatchOp{{Op: entry.OpDelete, Key: "x", Floors: map[string]entry.PN{"a": {P: 1}}}}}, d))
	f.Add([]byte{0x80})
	// nesting where the format has none, and lengths that lie
	f.Add(append([]byte{0x82, 0xa1, 'i', 0x01, 0xa3, 'o', 'p', 's'}, append(bytes.Repeat([]byte{0x91}, 20000), 0xc0)...))
	f.Add([]byte{0x82, 0xa1, 'i', 0x01, 0xa3, 'v', 'a', 'l', 0xc6, 0x7f, 0xff, 0xff, 0xff, 'x'})
	f.Add([]byte{0x82, 0xa1, 'i', 0x01, 0xa3, 'o', 'p', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		dc := NewCodec()
		e, err := dc.DecodeEntry(b, d)
		if err != nil {
			if !errors.Is(err, entry.ErrMalformed) {
				t.Fatalf("error outside the malformed class: %v", err)
			}
			return
		}
		// Whatever decodes must survive a re-encode unchanged.
		again, err := dc.DecodeEntry(dc.AppendEntry(nil, &e, d), d)
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if again.Index != e.Index || again.Key != e.Key || !bytes.Equal(again.Value, e.Value) ||
			again.LWW() != e.LWW() || again.Commit != e.Commit || again.Op != e.Op ||
			again.CtrComp != e.CtrComp || again.Oversize != e.Oversize || !reflect.DeepEqual(again.Ctx, e.Ctx) ||
			again.Expires != e.Expires || !opsEqual(again.Ops, e.Ops) || !reflect.DeepEqual(again.Floors, e.Floors) || again.Clears != e.Clears {
			t.Fatalf("re-encode changed the entry: %+v -> %+v", e, again)
		}
	})
}

func TestLyingBinLengthNotAllocated(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := NewCodec().DecodeEntry([]byte("\x82\xa1i\x01\xa3val\xc6\x7f\xff\xff\xff\x95"), Defaults{Origin: "a", Stream: entry.StreamID{1}})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, entry.ErrMalformed) {
		t.Fatalf("a lying bin length: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("allocated %d bytes for a 14-byte entry", grew)
	}
}
