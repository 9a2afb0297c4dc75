package transport

import (
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

func TestProject(t *testing.T) {
	f := entry.Filter{Include: []string{"shared/"}, Exclude: []string{"shared/tmp/"}}
	idem := &entry.Idem{Key: "k1", Status: 200}
	cases := []struct {
		name string
		in   entry.Entry
		keep Keep
		want func(e entry.Entry) bool
	}{
		{"set crosses", entry.Entry{Op: entry.OpSet, Key: "shared/a", Idem: idem}, KeepAll, func(e entry.Entry) bool { return e.Idem != nil }},
		{"set stays", entry.Entry{Op: entry.OpSet, Key: "tenant1/a"}, KeepNone, nil},
		{"excluded", entry.Entry{Op: entry.OpDelete, Key: "shared/tmp/a"}, KeepNone, nil},
		{"counter follows its key", entry.Entry{Op: entry.OpCounter, Key: "shared/c", Ctr: &entry.PN{P: 1}}, KeepAll, nil},
		{"range inside", entry.Entry{Op: entry.OpDeleteRange, Key: "shared/a", End: "shared/b"}, KeepAll, nil},
		{"range clipped to one part", entry.Entry{Op: entry.OpDeleteRange, Key: "r", End: "shared/m", Idem: idem}, KeepPart,
			func(e entry.Entry) bool {
				return e.Op == entry.OpDeleteRange && e.Key == "shared/" && e.End == "shared/m" && e.Idem == nil
			}},
		{"range across the exclude", entry.Entry{Op: entry.OpDeleteRange, Key: "a", End: "z"}, KeepPart,
			func(e entry.Entry) bool {
				return e.Op == entry.OpMulti && len(e.Ops) == 2 && e.Ops[0].Op == entry.OpDeleteRange && e.Ops[0].Key == "shared/" && e.Ops[0].End == "shared/tmp/" &&
					e.Ops[1].Key == "shared/tmp0" && e.Ops[1].End == "shared0" && e.Idem == nil
			}},
		{"range outside", entry.Entry{Op: entry.OpDeleteRange, Key: "t", End: "u"}, KeepNone, nil},
		{"batch all in", entry.Entry{Op: entry.OpMulti, Idem: idem, Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "shared/a"}, {Op: entry.OpDelete, Key: "shared/b"}}}, KeepAll,
			func(e entry.Entry) bool { return e.Idem != nil }},
		{"batch across", entry.Entry{Op: entry.OpMulti, Idem: idem, Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "shared/a"}, {Op: entry.OpSet, Key: "tenant1/b"}}}, KeepPart,
			func(e entry.Entry) bool { return len(e.Ops) == 1 && e.Ops[0].Key == "shared/a" && e.Idem == nil }},
		{"batch out", entry.Entry{Op: entry.OpMulti, Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "x"}}}, KeepNone, nil},
	}
	for _, c := range cases {
		got, keep := Project(&c.in, f)
		if keep != c.keep || (c.want != nil && !c.want(got)) {
			t.Errorf("%s: keep %d, got %+v", c.name, keep, got)
		}
	}
}

// TestProjectorMarkers: a run of entries the filter leaves out becomes one
// marker with the run's last commit, and what crosses decodes as entries.
func TestProjectorMarkers(t *testing.T) {
	stream := entry.StreamID{7}
	codec := wire.NewCodec()
	defs := wire.Defaults{Origin: "a", Stream: stream}
	raw := func(i uint64, key string) []byte {
		e := entry.Entry{Index: i, Origin: "a", Stream: stream, Commit: hlc.Timestamp{Wall: int64(i) * 10}, Op: entry.OpSet, Key: key, Value: []byte("v")}
		return codec.AppendEntry(nil, &e, defs)
	}
	ls := entry.LinkSettings{Filters: []entry.FilterEpoch{{Filter: entry.Filter{Include: []string{"s/"}}}}}
	p := newProjector(ls, stream, "a", 0)
	if p == nil {
		t.Fatal("no projector for a filtering link")
	}
	var out []entry.Entry
	for i, k := range []string{"x1", "x2", "s/1", "x3"} {
		b, err := p.project(uint64(i+1), raw(uint64(i+1), k))
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			continue
		}
		if m := p.flush(); m != nil {
			e, err := codec.DecodeEntry(m, defs)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
		e, err := codec.DecodeEntry(b, defs)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	m, err := codec.DecodeEntry(p.flush(), defs)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, m)
	if len(out) != 3 || !out[0].IsMarker() || out[0].Index != 1 || out[0].FilteredTo != 2 || out[0].Commit.Wall != 20 ||
		out[1].Key != "s/1" || out[1].Index != 3 || !out[2].IsMarker() || out[2].Index != 4 || out[2].FilteredTo != 4 {
		t.Fatalf("projected: %+v", out)
	}
	if newProjector(entry.LinkSettings{}, stream, "a", 0) != nil {
		t.Fatal("a projector without a filter")
	}
}
