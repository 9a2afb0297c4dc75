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
