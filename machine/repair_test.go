package machine

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// TestRepairAppliesVersionsAsTheyWere: a repair writes each version with its
// own stamp and origin, last-writer-wins (an older one changes nothing),
// counters by the pointwise maximum, with no outbound entry and no
// high-water mark; applied again it changes nothing.
func TestRepairAppliesVersionsAsTheyWere(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatRepair}})
	mustApply(t, m, 3, &Command{Local: []Proposal{s.put("held", "newer"), s.incr("n", 5)}})
	wal, _ := st.Outbound(testStream, 3)
	if wal != nil {
		t.Fatal("test assumes the stream holds two entries")
	}
	c0, err := st.Counter("n")
	if err != nil || len(c0.Totals) != 1 {
		t.Fatalf("counter before: %v %v", c0.Totals, err)
	}
	var comp string
	for comp = range c0.Totals {
	}
	old := hlc.Timestamp{Wall: 1e14}
	fresh := hlc.Timestamp{Wall: 2e15}
	rc := &RepairCmd{Peer: "b", Versions: []wire.TreeVersion{
		{Key: "lacked", Stamp: fresh, Origin: "b", Value: []byte("v"), Whole: true,
			Ctx: []wire.ContextItem{{Origin: "a", Stamp: old}}},
		{Key: "held", Stamp: old, Origin: "b", Value: []byte("older"), Whole: true},
		{Key: "n", Counter: true, Stamp: fresh, Origin: "b", Whole: true,
			Totals: []wire.Component{{Cluster: comp, P: 3}, {Cluster: "b", P: 7, N: 2}}},
		{Key: "gone", Stamp: fresh, Origin: "b", Tombstone: true, Whole: true},
	}}
	res := mustApply(t, m, 4, &Command{Repair: rc})
	if got := *res.Repair; got != (RepairResult{Applied: 3, Stale: 1}) {
		t.Fatalf("repair: %+v, want 3 applied, 1 stale", got)
	}
	if res.High != fresh {
		t.Fatalf("high %v, want %v", res.High, fresh)
	}
	r, err := st.Get("lacked")
	if err != nil || string(r.Value) != "v" || r.Stamp != (entry.Stamp{HLC: fresh, Origin: "b"}) || len(r.Ctx) != 1 {
		t.Fatalf("lacked: %+v %v", r, err)
	}
	if r, _ := st.Get("held"); string(r.Value) != "newer" {
		t.Fatalf("an older repaired version overwrote a newer one: %q", r.Value)
	}
	if r, err := st.Get("gone"); err != nil || !r.Tombstone {
		t.Fatalf("gone: %+v %v", r, err)
	}
	c, err := st.Counter("n")
	if err != nil || len(c.Totals) != 2 || c.Totals[comp] != (entry.PN{P: 5}) || c.Totals["b"] != (entry.PN{P: 7, N: 2}) {
		t.Fatalf("counter merged %v (%v), want %s 5/0 (the larger), b 7/2", c.Totals, err, comp)
	}
	if b, _ := st.Outbound(testStream, 3); b != nil {
		t.Fatal("a repair wrote an outbound entry")
	}
	if h, _ := st.HWMs(); len(h) != 0 {
		t.Fatalf("a repair moved high-water marks: %v", h)
	}
	before := st.Leaves()
	again := mustApply(t, m, 5, &Command{Repair: rc})
	if got := *again.Repair; got != (RepairResult{Stale: 4}) {
		t.Fatalf("repair again: %+v, want 4 stale", got)
	}
	after := st.Leaves()
	for i := range before {
		if before[i] != after[i] {
			t.Fatal("a repair applied twice changed the leaves")
		}
	}
}

// TestRepairNeedsFormat5: a build that plays format 4 refuses a repair (a
// leader proposes one only once every node reads it).
func TestRepairNeedsFormat5(t *testing.T) {
	st := openStore(t)
	m, err := Open(st, Options{Cluster: "a", ReadsFormat: FormatConflicts})
	if err != nil {
		t.Fatal(err)
	}
	rc := &RepairCmd{Versions: []wire.TreeVersion{{Key: "k", Stamp: hlc.Timestamp{Wall: 1}, Origin: "a", Whole: true}}}
	if _, err := m.Apply(1, encode(t, &Command{Repair: rc})); err == nil {
		t.Fatal("a format-4 build applied a repair")
	}
	b := encode(t, &Command{Repair: rc})
	c, err := Decode(b)
	if err != nil || c.Repair == nil || c.Repair.Versions[0].Key != "k" {
		t.Fatalf("decode: %+v %v", c, err)
	}
	if again := encode(t, &c); !bytes.Equal(again, b) {
		t.Fatal("a repair does not encode as it decoded")
	}
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestRejoinReseedLeavesPossibleResurrections: a rejoin's re-seed (a node
// that lost data and was restored) may carry versions older than this
// tree's collection horizon of keys it holds nothing of: deletes collected
// here. From format 6 they are not taken; a newer one is, and so is an old
// one of a key the tree holds a record of (last-writer-wins decides). An
// ordinary re-seed's and a backfill's old versions are taken (a peer added
// with data of its own, keys a filter held back: never here), and so is a
// rejoin's before the log reaches format 6 (every node must judge alike).
func TestRejoinReseedLeavesPossibleResurrections(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 1000}, Max: 10}})
	if _, err := st.Set("held", []byte("mine"), entry.Stamp{HLC: hlc.Timestamp{Wall: 100}, Origin: "a"}); err != nil {
		t.Fatal(err)
	}
	type kind struct{ rejoin, backfill bool }
	next := byte(0x50)
	snap := func(k kind, ents ...entry.Entry) *Command {
		next++
		stream := entry.StreamID{next}
		for i := range ents {
			ents[i].Index, ents[i].Origin, ents[i].Stream, ents[i].Commit, ents[i].Op = uint64(i+1), "b", stream, hlc.Timestamp{Wall: 5000}, entry.OpSet
		}
		h := wire.Header{Sender: "b", Stream: stream, Snapshot: true, Rejoin: k.rejoin, Backfill: k.backfill}
		return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: hlc.Timestamp{Wall: 5000}, Batch: &wire.Batch{Header: h, Entries: ents}}}
	}
	at := func(w int64) hlc.Timestamp { return hlc.Timestamp{Wall: w} }
	index := uint64(3)
	apply := func(c *Command) *InboundResult {
		index++
		r := mustApply(t, m, index, c).Inbound
		if r.Err != nil {
			t.Fatalf("apply %d: %v", index, r.Err)
		}
		return r
	}
	gone := func(key string) {
		t.Helper()
		if _, err := st.Get(key); err == nil {
			t.Fatalf("%s: a re-seed brought back a key older than the collection horizon", key)
		}
	}
	// Before format 6 a rejoin's old version is taken, as every build did.
	if m.Format() >= FormatRejoinHorizon {
		t.Fatalf("a fresh machine at format %d", m.Format())
	}
	if r := apply(snap(kind{rejoin: true}, entry.Entry{Key: "early", Value: []byte("old"), Stamp: at(500)})); r.Applied != 1 || r.Resurrections != 0 {
		t.Fatalf("rejoin at format %d: %+v", m.Format(), r)
	}
	index++
	mustApply(t, m, index, &Command{Format: &FormatCmd{Version: FormatRejoinHorizon}})
	r := apply(snap(kind{rejoin: true},
		entry.Entry{Key: "zombie", Value: []byte("old"), Stamp: at(500)},
		entry.Entry{Key: "fresh", Value: []byte("new"), Stamp: at(2000)},
		entry.Entry{Key: "held", Value: []byte("theirs"), Stamp: at(600)},
	))
	if r.Resurrections != 1 || r.Applied != 2 {
		t.Fatalf("rejoin: %+v", r)
	}
	gone("zombie")
	for k, want := range map[string]string{"fresh": "new", "held": "theirs", "early": "old"} {
		if rec, err := st.Get(k); err != nil || string(rec.Value) != want {
			t.Fatalf("%s: %q %v, want %q", k, rec.Value, err, want)
		}
	}
	h, _ := st.HWM("b", entry.StreamID{next})
	if h.Index != 3 || h.Merged != 3 {
		t.Fatalf("the snapshot's mark does not account for its entries: %+v", h)
	}
	// An ordinary re-seed's and a backfill's old versions are taken.
	for i, k := range []kind{{}, {backfill: true}} {
		key := fmt.Sprintf("carried-%d", i)
		if r := apply(snap(k, entry.Entry{Key: key, Value: []byte("old"), Stamp: at(500)})); r.Applied != 1 || r.Resurrections != 0 {
			t.Fatalf("%+v: %+v", k, r)
		}
		if _, err := st.Get(key); err != nil {
			t.Fatalf("%+v: %s not taken: %v", k, key, err)
		}
	}
}

// TestRepairJudgedAsInbound (issue 45, cases 4 and 7): from format 7 a
// repair's discards are judged as an inbound batch's are, against the peer
// the versions came from: a concurrent local version the repaired one
// discards is logged under the same ID the other cluster logs; at format 6
// nothing was logged. And a live version older than the tree's collection
// horizon, of a key the tree holds nothing of, is not taken (the tree may
// have collected its delete since the comparison), while one of a key it
// holds is.
func TestRepairJudgedAsInbound(t *testing.T) {
	for _, judged := range []bool{false, true} {
		t.Run(fmt.Sprint("judged=", judged), func(t *testing.T) {
			m, st := openMachine(t, t.TempDir()) // cluster a
			defer st.Close()
			s := &stamper{wall: 1e15}
			mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
			format := FormatRejoinHorizon
			if judged {
				format = FormatRepairJudged
			}
			mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: uint8(format)}})
			mustApply(t, m, 3, &Command{Local: []Proposal{s.put("k", "a's"), s.put("kept", "a's")}})
			mine, err := st.Get("k")
			if err != nil {
				t.Fatal(err)
			}
			// b wrote k concurrently, later, without having seen a's.
			theirs := hlc.Timestamp{Wall: 3e15}
			rc := &RepairCmd{Peer: "b", Versions: []wire.TreeVersion{{Key: "k", Stamp: theirs, Origin: "b", Value: []byte("b's"), Whole: true,
				Ctx: []wire.ContextItem{{Origin: "b", Stamp: theirs}}}}}
			res := mustApply(t, m, 4, &Command{Repair: rc})
			if res.Repair.Applied != 1 {
				t.Fatalf("repair: %+v", res.Repair)
			}
			recs, _, err := st.Conflicts(store.ConflictQuery{Key: "k"})
			if err != nil {
				t.Fatal(err)
			}
			want := entry.ConflictID("k", mine.Stamp, entry.Stamp{HLC: theirs, Origin: "b"})
			switch {
			case !judged && len(recs) != 0:
				t.Fatalf("at format 6 a repair logged %d records", len(recs))
			case judged && (len(recs) != 1 || recs[0].ID != want || recs[0].Peer != "b" || recs[0].Incoming):
				t.Fatalf("at format 7 the repair logged %+v, want one record %x of a's version lost to b's", recs, want)
			}
			// Collect below 2.5e15: a's tree holds nothing of "zombie".
			mustApply(t, m, 5, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 2.5e15}, Max: 10}})
			old := hlc.Timestamp{Wall: 2e15}
			res = mustApply(t, m, 6, &Command{Repair: &RepairCmd{Peer: "b", Versions: []wire.TreeVersion{
				{Key: "zombie", Stamp: old, Origin: "b", Value: []byte("old"), Whole: true},
				{Key: "kept", Stamp: hlc.Timestamp{Wall: 2.1e15}, Origin: "b", Value: []byte("b's"), Whole: true},
			}}})
			_, zerr := st.Get("zombie")
			if judged {
				if res.Repair.Resurrections != 1 || zerr == nil {
					t.Fatalf("format 7: %+v, zombie %v: want it not taken", res.Repair, zerr)
				}
				if r, _ := st.Get("kept"); string(r.Value) != "b's" {
					t.Fatalf("an old version of a key the tree holds was not taken: %q", r.Value)
				}
			} else if res.Repair.Resurrections != 0 || zerr != nil {
				t.Fatalf("format 6: %+v, zombie %v: want it taken, as before", res.Repair, zerr)
			}
		})
	}
}

// TestCollectKeepsTheRangesOfALink (issue 45, case 1): a collect command of
// format 7 leaves the tombstones and range tombstones of the ranges it
// keeps for a link, however old, counts them per link, and collects the
// rest; the command encodes and decodes as one shape.
func TestCollectKeepsTheRangesOfALink(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatKeptTombstones}})
	del := func(key string) Proposal {
		return Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: key, Commit: s.next()}}
	}
	// A delete writes a tombstone only over a value: the keys are written
	// first.
	group := []Proposal{s.put("t/1", "v"), s.put("t/2", "v"), s.put("u/1", "v"), del("t/1"), del("t/2"), del("u/1")}
	group = append(group, Proposal{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "t/r/", End: "t/r0", Commit: s.next()}})
	mustApply(t, m, 3, &Command{Local: group})
	keep := []KeepRanges{{Peer: "b", Spans: []entry.Span{{Start: "t/", End: "t0"}}}, {Peer: "c", Spans: []entry.Span{{Start: "t/2", End: "t/3"}}}}
	res := mustApply(t, m, 4, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 2e15}, Max: 100, Keep: keep}})
	if res.Collected != 1 {
		t.Fatalf("collected %d, want 1 (u/1)", res.Collected)
	}
	if b, c := res.Kept["b"], res.Kept["c"]; b.Tombstones != 2 || b.Ranges != 1 || b.Bytes <= 0 || c.Tombstones != 1 || c.Ranges != 0 {
		t.Fatalf("kept: %+v", res.Kept)
	}
	for _, k := range []string{"t/1", "t/2"} {
		if r, err := st.Get(k); err != nil || !r.Tombstone {
			t.Fatalf("%s: %+v %v: its tombstone went", k, r, err)
		}
	}
	if _, err := st.Get("u/1"); err == nil {
		t.Fatal("u/1's tombstone was kept")
	}
	if len(st.RangeTombstones()) != 1 {
		t.Fatal("the range tombstone under t/ went")
	}
	// Without the kept ranges they go.
	res = mustApply(t, m, 5, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 2e15}, Max: 100}})
	if res.Collected != 3 || len(st.RangeTombstones()) != 0 {
		t.Fatalf("collected %d, ranges left %d", res.Collected, len(st.RangeTombstones()))
	}
	// Malformed kept ranges are refused at decode.
	for _, bad := range [][]KeepRanges{
		{{Peer: "b", Spans: []entry.Span{{Start: "t0", End: "t/"}}}},
		{{Peer: "b", Spans: []entry.Span{{Start: "a", End: "c"}, {Start: "b", End: "d"}}}},
		{{Peer: "c", Spans: []entry.Span{{Start: "a"}}}, {Peer: "b", Spans: []entry.Span{{Start: "a"}}}},
		{{Peer: "B!", Spans: []entry.Span{{Start: "a"}}}},
	} {
		if _, err := Decode(encode(t, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 1}, Max: 1, Keep: bad}})); err == nil {
			t.Fatalf("decoded kept ranges %+v", bad)
		}
	}
}

// TestCollectKeepsAnOriginsDeletesOnward (issue 45): kept ranges of an
// origin (a peer's own link, as its heartbeats said) keep only the deletes
// that origin wrote, counted as origin->peer; the link command recording
// them, and the collect command carrying them, encode and decode as one
// shape, and malformed ones are refused.
func TestCollectKeepsAnOriginsDeletesOnward(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatKeptTombstones}})
	lc := &LinkCmd{Peer: "c", SetFromPeer: true, Filter: entry.Filter{Exclude: []string{"t/"}},
		Onward: []entry.TargetSpans{{Target: "b", Spans: []entry.Span{{Start: "t/", End: "t0"}}}}}
	got, err := Decode(encode(t, &Command{Link: lc}))
	if err != nil || !reflect.DeepEqual(got.Link.Onward, lc.Onward) || !got.Link.SetFromPeer {
		t.Fatalf("link command decoded as %+v (%v)", got.Link, err)
	}
	mustApply(t, m, 3, &Command{Link: lc})
	if on := m.Link("c").Onward; !reflect.DeepEqual(on, lc.Onward) {
		t.Fatalf("recorded onward %+v", on)
	}
	mustApply(t, m, 4, &Command{Local: []Proposal{
		s.put("t/1", "v"), // a delete writes a tombstone only over a value
		{Entry: entry.Entry{Op: entry.OpDelete, Key: "t/1", Commit: s.next()}},
		{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "t/r/", End: "t/r0", Commit: s.next()}},
	}})
	// This machine's cluster is a: kept for origin c, a's deletes go.
	keep := []KeepRanges{{Peer: "b", Origin: "c", Spans: []entry.Span{{Start: "t/", End: "t0"}}}}
	cc := &CollectCmd{Cutoff: hlc.Timestamp{Wall: 2e15}, Max: 100, Keep: keep}
	if got, err := Decode(encode(t, &Command{Collect: cc})); err != nil || !reflect.DeepEqual(got.Collect.Keep, keep) {
		t.Fatalf("collect decoded as %+v (%v)", got.Collect, err)
	}
	keepA := []KeepRanges{{Peer: "b", Origin: "a", Spans: []entry.Span{{Start: "t/", End: "t0"}}}}
	res := mustApply(t, m, 5, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 2e15}, Max: 100, Keep: keepA}})
	if res.Collected != 0 || res.Kept["a->b"].Tombstones != 1 || res.Kept["a->b"].Ranges != 1 || len(res.Kept) != 1 {
		t.Fatalf("kept for a->b: collected %d, kept %+v", res.Collected, res.Kept)
	}
	res = mustApply(t, m, 6, &Command{Collect: cc})
	if res.Collected != 2 || len(res.Kept) != 0 || len(st.RangeTombstones()) != 0 {
		t.Fatalf("kept for c->b, a's deletes: collected %d, kept %+v", res.Collected, res.Kept)
	}
	for _, bad := range [][]KeepRanges{
		{{Peer: "b", Origin: "b", Spans: []entry.Span{{Start: "a"}}}},
		{{Peer: "b", Origin: "d", Spans: []entry.Span{{Start: "a"}}}, {Peer: "b", Origin: "c", Spans: []entry.Span{{Start: "a"}}}},
		{{Peer: "b", Origin: "c", Spans: []entry.Span{{Start: "a"}}}, {Peer: "b", Origin: "c", Spans: []entry.Span{{Start: "b"}}}},
		{{Peer: "b", Origin: "C!", Spans: []entry.Span{{Start: "a"}}}},
	} {
		if _, err := Decode(encode(t, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 1}, Max: 1, Keep: bad}})); err == nil {
			t.Fatalf("decoded kept ranges %+v", bad)
		}
	}
	// A link command's onward ranges, malformed, are refused too.
	bad := *lc
	bad.Onward = []entry.TargetSpans{{Target: "b", Spans: []entry.Span{{Start: "z", End: "a"}}}}
	if _, err := Decode(encode(t, &Command{Link: &bad})); err == nil {
		t.Fatal("decoded an inverted onward range")
	}
}
