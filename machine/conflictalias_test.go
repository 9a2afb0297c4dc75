package machine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// TestConflictRecordKeepsItsIDAsAnAlias (issue 49): a record's ID is a hash
// of (key, loser, winner), so it changes when the key moves on and the
// loss is named against the new version. From format 13 the record keeps
// its earlier ID as an alias: a lookup by it finds the record, a restore
// by it answers 412 naming the record that took it over and the version
// the key holds; when the record goes (collection), the alias goes too.
func TestConflictRecordKeepsItsIDAsAnAlias(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b := newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+300)
	c := newConflictCluster(t, "c", entry.StreamID{0xc}, 1e15+600)
	b.apply(&Command{Format: &FormatCmd{Version: FormatConflictAliases}})
	a.put("k", "x")
	b.put("k", "y")
	b.ship(a, false) // a's x loses to b's y, unseen: logged
	first := b.log()["k"]
	if len(first) != 1 || string(first[0].LoserValue) != "x" {
		t.Fatalf("at b: %+v, want x lost to y", first)
	}
	oldID := first[0].ID
	c.put("k", "z") // newer, and c saw neither
	b.ship(c, false)
	var moved *entry.Conflict
	for _, r := range b.log()["k"] {
		if string(r.LoserValue) == "x" {
			moved = &r
		}
	}
	if moved == nil || moved.ID == oldID || moved.Winner.Origin != "c" || len(moved.Aliases) != 1 || moved.Aliases[0] != oldID {
		t.Fatalf("x's record after c's z: %+v (old ID %s)", moved, oldID)
	}
	rec, ok, err := b.st.ConflictByID(oldID)
	if err != nil || !ok || rec.ID != moved.ID {
		t.Fatalf("the old ID does not find the record: %+v %v %v", rec, ok, err)
	}
	cl := &ConflictLog{Store: b.st, Format: func() int { return int(b.m.Format()) },
		Propose: func(context.Context, api.Write) (api.WriteResult, error) {
			t.Fatal("a restore by a superseded ID was proposed")
			return api.WriteResult{}, nil
		}}
	_, err = cl.RestoreConflict(context.Background(), strings.ToUpper(oldID))
	var pe *api.PreconditionError
	if !errors.As(err, &pe) || pe.Current != moved.Winner.String() || !strings.Contains(pe.Why, moved.ID) {
		t.Fatalf("restore by the old ID: %v", err)
	}
	// Collected with its record.
	b.apply(&Command{Collect: &CollectCmd{ConflictsBefore: hlc.Timestamp{Wall: 9e18}, Max: 100}})
	if _, ok, err := b.st.ConflictByID(oldID); ok || err != nil {
		t.Fatalf("the alias outlived its record: %v %v", ok, err)
	}
	if _, ok, err := b.st.ConflictByID(moved.ID); ok || err != nil {
		t.Fatalf("the record outlived its collection: %v %v", ok, err)
	}

	// Before format 13 a moved record keeps no alias (every node alike).
	a2 := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b2 := newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+300)
	c2 := newConflictCluster(t, "c", entry.StreamID{0xc}, 1e15+600)
	a2.put("k", "x")
	b2.put("k", "y")
	b2.ship(a2, false)
	c2.put("k", "z")
	b2.ship(c2, false)
	for _, r := range b2.log()["k"] {
		if len(r.Aliases) != 0 {
			t.Fatalf("format %d kept aliases: %+v", b2.m.Format(), r)
		}
	}
}
