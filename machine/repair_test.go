package machine

import (
	"bytes"
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

// TestReseedLeavesPossibleResurrections: a re-seed's version older than the
// tree's collection horizon, of a key the tree holds nothing of, is not
// taken (it may be a delete collected here: a peer restored from an old
// backup re-seeding); one newer than the horizon is, and so is an old one
// of a key the tree holds a record of (last-writer-wins decides), and a
// backfill's (keys a filter held back were never here).
func TestReseedLeavesPossibleResurrections(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 1000}, Max: 10}})
	if _, err := st.Set("held", []byte("mine"), entry.Stamp{HLC: hlc.Timestamp{Wall: 100}, Origin: "a"}); err != nil {
		t.Fatal(err)
	}
	snap := func(stream entry.StreamID, backfill bool, ents ...entry.Entry) *Command {
		for i := range ents {
			ents[i].Index, ents[i].Origin, ents[i].Stream, ents[i].Commit, ents[i].Op = uint64(i+1), "b", stream, hlc.Timestamp{Wall: 5000}, entry.OpSet
		}
		h := wire.Header{Sender: "b", Stream: stream, Snapshot: true, Backfill: backfill}
		return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: hlc.Timestamp{Wall: 5000}, Batch: &wire.Batch{Header: h, Entries: ents}}}
	}
	at := func(w int64) hlc.Timestamp { return hlc.Timestamp{Wall: w} }
	r := mustApply(t, m, 3, snap(entry.StreamID{0x5a}, false,
		entry.Entry{Key: "zombie", Value: []byte("old"), Stamp: at(500)},
		entry.Entry{Key: "fresh", Value: []byte("new"), Stamp: at(2000)},
		entry.Entry{Key: "held", Value: []byte("theirs"), Stamp: at(600)},
	)).Inbound
	if r.Err != nil || r.Resurrections != 1 || r.Applied != 2 {
		t.Fatalf("re-seed: %+v", r)
	}
	if _, err := st.Get("zombie"); err == nil {
		t.Fatal("a re-seed brought back a key older than the collection horizon")
	}
	for k, want := range map[string]string{"fresh": "new", "held": "theirs"} {
		if rec, err := st.Get(k); err != nil || string(rec.Value) != want {
			t.Fatalf("%s: %q %v, want %q", k, rec.Value, err, want)
		}
	}
	h, _ := st.HWM("b", entry.StreamID{0x5a})
	if h.Index != 3 || h.Merged != 3 {
		t.Fatalf("the snapshot's mark does not account for its entries: %+v", h)
	}
	// A backfill's old version is taken.
	r = mustApply(t, m, 4, snap(entry.StreamID{0x5b}, true, entry.Entry{Key: "zombie", Value: []byte("carried"), Stamp: at(500)})).Inbound
	if r.Err != nil || r.Applied != 1 || r.Resurrections != 0 {
		t.Fatalf("backfill: %+v", r)
	}
}
