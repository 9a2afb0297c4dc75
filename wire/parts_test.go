package wire

import (
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// TestSplitInbound: what goes where. A key's entry goes to its group
// alone; a range delete, a filtered marker and a stub without a key to
// every group; an atomic batch is split by its keys, a range delete in it
// going to every group's piece; the others' runs are foreign runs, joined
// where contiguous, each with the commit of its last index.
func TestSplitInbound(t *testing.T) {
	stream := entry.StreamID{0xb}
	at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: int64(i) * 10} }
	groupOf := func(k string) int { return int(k[0] - 'a') } // "a..." in 0, "b..." in 1, "c..." in 2
	e := func(i uint64, op entry.Op, key string) entry.Entry {
		return entry.Entry{Index: i, Origin: "b", Stream: stream, Commit: at(i), Op: op, Key: key}
	}
	multi := e(4, entry.OpMulti, "")
	multi.Ops = []entry.BatchOp{{Op: entry.OpSet, Key: "a1"}, {Op: entry.OpDeleteRange, Key: "x", End: "y"}, {Op: entry.OpSet, Key: "b1"}}
	marker := entry.Entry{Index: 5, FilteredTo: 7, Origin: "b", Stream: stream, Commit: at(7)}
	rd := e(8, entry.OpDeleteRange, "a")
	rd.End = "c"
	bt := &Batch{Header: Header{Sender: "b", Stream: stream}, Entries: []entry.Entry{
		e(1, entry.OpSet, "a0"), e(2, entry.OpSet, "b0"), e(3, entry.OpDelete, "a2"), multi, marker, rd, e(9, entry.OpSet, "c9"),
	}}
	parts, err := SplitInbound(&Inbound{Sender: "b", Batch: bt, Dead: map[uint64]string{4: "why"}}, 3, groupOf)
	if err != nil {
		t.Fatal(err)
	}
	indexes := func(p *Inbound) (out []uint64) {
		for _, e := range p.Batch.Entries {
			out = append(out, e.Index)
		}
		return out
	}
	want := []struct {
		entries []uint64
		foreign []ForeignRun
		dead    bool
	}{
		{[]uint64{1, 3, 4, 5, 8}, []ForeignRun{{From: 2, To: 2, Commit: at(2)}, {From: 9, To: 9, Commit: at(9)}}, true},
		{[]uint64{2, 4, 5, 8}, []ForeignRun{{From: 1, To: 1, Commit: at(1)}, {From: 3, To: 3, Commit: at(3)}, {From: 9, To: 9, Commit: at(9)}}, true},
		{[]uint64{4, 5, 8, 9}, []ForeignRun{{From: 1, To: 3, Commit: at(3)}}, true},
	}
	for g, p := range parts {
		if !reflect.DeepEqual(indexes(p), want[g].entries) || !reflect.DeepEqual(p.Foreign, want[g].foreign) || (p.Dead[4] != "") != want[g].dead {
			t.Errorf("group %d: entries %v, foreign %v, dead %v; want %v, %v", g, indexes(p), p.Foreign, p.Dead, want[g].entries, want[g].foreign)
		}
	}
	ops := func(g int) (keys []string) {
		for _, e := range parts[g].Batch.Entries {
			for _, o := range e.Ops {
				keys = append(keys, o.Key)
			}
		}
		return keys
	}
	if !reflect.DeepEqual(ops(0), []string{"a1", "x"}) || !reflect.DeepEqual(ops(1), []string{"x", "b1"}) || !reflect.DeepEqual(ops(2), []string{"x"}) {
		t.Errorf("the atomic batch's pieces: %v, %v, %v", ops(0), ops(1), ops(2))
	}
	if len(bt.Entries[3].Ops) != 3 {
		t.Error("splitting changed the batch it split")
	}
}

// FuzzSplitInbound: any batch a sender may send, split into one to four
// groups, gives every group a part whose entries and foreign runs cover
// the batch's indexes exactly, once, in order, and that encodes and
// decodes again (the command carries it); an atomic batch's pieces hold
// its operations, each once across the groups but range deletes, which
// every piece holds.
func FuzzSplitInbound(f *testing.F) {
	stream := entry.StreamID{1}
	multi := entry.Entry{Index: 8, Origin: "a", Stream: stream, Commit: hlc.Timestamp{Wall: 10}, Op: entry.OpMulti, Ops: []entry.BatchOp{
		{Op: entry.OpSet, Key: "m1", Value: []byte("1")}, {Op: entry.OpDeleteRange, Key: "r", End: "s"}, {Op: entry.OpSet, Key: "m2"}}}
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: stream}, Entries: []entry.Entry{
		{Index: 7, Origin: "a", Stream: stream, Commit: hlc.Timestamp{Wall: 9}, Op: entry.OpSet, Key: "k", Value: []byte("v")}, multi,
		{Index: 9, FilteredTo: 12, Origin: "a", Stream: stream, Commit: hlc.Timestamp{Wall: 11}},
		{Index: 13, Origin: "a", Stream: stream, Commit: hlc.Timestamp{Wall: 12}, Op: entry.OpDeleteRange, Key: "a", End: "z"},
		{Index: 14, Origin: "a", Stream: stream, Commit: hlc.Timestamp{Wall: 13}, Op: entry.OpDelete, Key: "q"}}}), uint8(3))
	f.Fuzz(func(t *testing.T, body []byte, g uint8) {
		b, err := DecodeBatch(body)
		if err != nil || len(b.Entries) == 0 {
			return
		}
		for i := 1; i < len(b.Entries); i++ {
			if b.Entries[i].Index != b.Entries[i-1].Last()+1 {
				return // the acceptor refuses it before any split
			}
		}
		groups := 1 + int(g%4)
		groupOf := func(k string) int {
			h := 0
			for _, c := range []byte(k) {
				h = h*31 + int(c)
			}
			return (h%groups + groups) % groups
		}
		parts, err := SplitInbound(&Inbound{Sender: b.Sender, Batch: b}, groups, groupOf)
		if err != nil || len(parts) != groups {
			t.Fatalf("%d parts, %v", len(parts), err)
		}
		first, last := b.Entries[0].Index, b.Entries[len(b.Entries)-1].Last()
		ops := 0
		for gi, p := range parts {
			next, ents, runs := first, p.Batch.Entries, p.Foreign
			for len(ents) > 0 || len(runs) > 0 {
				switch {
				case len(ents) > 0 && ents[0].Index == next:
					next = ents[0].Last() + 1
					for _, op := range ents[0].Ops {
						if op.Op != entry.OpDeleteRange {
							ops++
						}
					}
					ents = ents[1:]
				case len(runs) > 0 && runs[0].From == next && runs[0].To >= next:
					next = runs[0].To + 1
					runs = runs[1:]
				default:
					t.Fatalf("group %d: at index %d, entries %v, runs %v", gi, next, ents, runs)
				}
			}
			if next != last+1 {
				t.Fatalf("group %d covers up to %d, the batch to %d", gi, next-1, last)
			}
			if _, err := DecodeBatch(EncodeBatch(p.Batch)); err != nil && len(p.Batch.Entries) > 0 {
				t.Fatalf("group %d's part does not decode: %v", gi, err)
			}
		}
		want := 0
		for _, e := range b.Entries {
			for _, op := range e.Ops {
				if op.Op != entry.OpDeleteRange {
					want++
				}
			}
		}
		if ops != want {
			t.Fatalf("the groups' pieces hold %d operations, the batch %d", ops, want)
		}
	})
}
