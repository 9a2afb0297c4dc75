package node

import (
	"context"
	"strings"
	"testing"
)

// TestDeadLetters: b accepts smaller values than a. An entry over b's limit
// is set aside as a dead letter instead of wedging the link; later entries
// flow; the operator can replay or discard it.
func TestDeadLetters(t *testing.T) {
	m := newTestMesh(t, nil, nil, "a", "b")
	a := m.nodes["a"]
	ctx := context.Background()
	// b lowers its limit while a's entries are on their way: a took them
	// under the limit b had said it accepts.
	m.cut("a", "b", true)
	for _, kv := range []struct{ k, v string }{{"big-1", strings.Repeat("x", 2000)}, {"big-2", strings.Repeat("y", 2000)}, {"small", "fine"}} {
		if _, err := a.Put(ctx, kv.k, []byte(kv.v)); err != nil {
			t.Fatal(err)
		}
	}
	m.opts["b"].MaxValueBytes = 1000
	m.restart("b", nil)
	b := m.nodes["b"]
	m.cut("a", "b", false)
	m.settle()
	if r, err := b.Get("small"); err != nil || string(r.Value) != "fine" {
		t.Fatalf("the link is wedged behind the oversized entries: %v", err)
	}
	dl, err := b.dead.DeadLetters()
	if err != nil || len(dl) != 2 || dl[0].Key != "big-1" || dl[0].Op != "set" {
		t.Fatalf("dead letters: %+v %v", dl, err)
	}
	hw, _ := b.store.HWMs()
	if len(hw) != 1 || hw[0].Merged+hw[0].DeadLettered != hw[0].Index || hw[0].DeadLettered != 2 {
		t.Fatalf("hwm %+v", hw)
	}
	if err := b.dead.ReplayDeadLetter(dl[0].ID); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Get("big-1"); err != nil || len(r.Value) != 2000 {
		t.Fatalf("replayed dead letter not applied: %v", err)
	}
	if err := b.dead.DiscardDeadLetter(dl[1].ID); err != nil {
		t.Fatal(err)
	}
	if dl, _ := b.dead.DeadLetters(); len(dl) != 0 {
		t.Fatalf("left: %+v", dl)
	}
	if err := b.dead.DiscardDeadLetter("nope"); err == nil {
		t.Fatal("discarding an unknown dead letter succeeded")
	}
}
