package machine

import (
	"errors"
	"testing"

	"github.com/replicator/replicator/entry"
)

// write applies one local proposal at c and keeps its entry for shipping.
func (c *conflictCluster) write(p Proposal) Write {
	c.t.Helper()
	res := c.apply(&Command{Local: []Proposal{p}})
	w := res.Writes[0]
	if w.Err == nil && w.Entry.Index > 0 {
		c.out = append(c.out, w.Entry)
	}
	return w
}

// read is what c reads at key now (entry.Resolve at the stamper's wall).
func (c *conflictCluster) read(key string) entry.View {
	c.t.Helper()
	v, _, _, err := c.st.Read(key, c.stamps.wall)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

func floorsPair(t *testing.T) (a, b *conflictCluster) {
	a = newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b = newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+500)
	for _, c := range []*conflictCluster{a, b} {
		c.apply(&Command{Format: &FormatCmd{Version: FormatCounterFloors}})
	}
	return a, b
}

// TestCounterOnAPlainInteger: INCR on a key holding an integer string adds
// to it (Redis's "SET n 5, INCR n" is 6), on a value that is not an
// integer it is refused and writes nothing, and a SET of the key replaces
// what its counter counted here.
func TestCounterOnAPlainInteger(t *testing.T) {
	a, _ := floorsPair(t)
	a.write(a.stamps.put("n", "5"))
	if w := a.write(a.stamps.incr("n", 1)); w.Err != nil || w.CounterValue != 6 {
		t.Fatalf("INCR after SET n 5: %+v", w)
	}
	if v := a.read("n"); !v.Counted || string(v.Value) != "6" {
		t.Fatalf("n reads %+v, want 6", v)
	}
	a.write(a.stamps.put("s", "abc"))
	if w := a.write(a.stamps.incr("s", 1)); !errors.Is(w.Err, ErrNotInteger) || w.Entry.Index != 0 {
		t.Fatalf("INCR of a value that is not an integer: %+v", w)
	}
	w := a.write(a.stamps.put("n", "100"))
	if len(w.Entry.Floors) != 1 {
		t.Fatalf("SET over a counted key carries floors %v, want what it counted here", w.Entry.Floors)
	}
	if v := a.read("n"); v.Counted || string(v.Value) != "100" {
		t.Fatalf("n after SET n 100 reads %+v", v)
	}
	if w := a.write(a.stamps.incr("n", -1)); w.CounterValue != 99 {
		t.Fatalf("DECR after SET n 100: %+v", w)
	}
}

// TestCounterDeleteIsObservedRemove: a delete of a counter removes the
// increments its cluster had seen; an increment at another cluster
// concurrent with it survives, two concurrent deletes remove what each saw
// once (never below zero), and every cluster reads the same whatever the
// order the entries arrive in.
func TestCounterDeleteIsObservedRemove(t *testing.T) {
	a, b := floorsPair(t)
	for range 3 {
		a.write(a.stamps.incr("c", 1))
	}
	b.ship(a, false)
	// b deletes what it saw (3); a, concurrently, adds 2.
	del := b.write(Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: "c", Commit: b.stamps.next()}})
	if del.Entry.Index == 0 || del.Existed != 1 || len(del.Entry.Floors) != 1 {
		t.Fatalf("DEL of a counter: %+v", del)
	}
	if v := b.read("c"); v.Present {
		t.Fatalf("c after its delete at b reads %+v", v)
	}
	a.write(a.stamps.incr("c", 2))
	b.ship(a, false)
	a.ship(b, false)
	for _, c := range []*conflictCluster{a, b} {
		if v := c.read("c"); string(v.Value) != "2" {
			t.Fatalf("%s reads c as %+v, want the concurrent increment alone (2)", c.name, v)
		}
	}
	// Both delete concurrently, having seen 5 (a's totals): 0 at both,
	// not -5.
	b.ship(a, false)
	a.write(Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: "c", Commit: a.stamps.next()}})
	b.write(Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: "c", Commit: b.stamps.next()}})
	b.ship(a, false)
	a.ship(b, false)
	for _, c := range []*conflictCluster{a, b} {
		if v := c.read("c"); v.Present {
			t.Fatalf("%s reads c as %+v after two concurrent deletes", c.name, v)
		}
	}
	// A delete of a key that holds nothing (its counter removed) writes
	// nothing; an increment after it counts from zero.
	if w := a.write(Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: "c", Commit: a.stamps.next()}}); w.Entry.Index != 0 {
		t.Fatalf("a delete of a deleted counter wrote %+v", w.Entry)
	}
	if w := a.write(a.stamps.incr("c", 1)); w.CounterValue != 1 {
		t.Fatalf("INCR after the delete: %+v", w)
	}
	b.ship(a, false)
	if da, db := a.digest(), b.digest(); da != db {
		t.Fatalf("digests differ: %s %s", da, db)
	}
}

// TestCounterSetRacesIncrement: a SET at one cluster and an INCR at
// another, concurrent: the SET replaces what it saw, the increment it did
// not see adds to the value it wrote (11), at both. A SET of a value that
// is not an integer hides the increments until a write that sees them.
func TestCounterSetRacesIncrement(t *testing.T) {
	a, b := floorsPair(t)
	a.write(a.stamps.incr("n", 1))
	b.ship(a, false)
	b.write(b.stamps.put("n", "10"))
	a.write(a.stamps.incr("n", 1))
	b.ship(a, false)
	a.ship(b, false)
	for _, c := range []*conflictCluster{a, b} {
		if v := c.read("n"); string(v.Value) != "11" || !v.Counted {
			t.Fatalf("%s reads n as %+v, want 10 + the unseen increment", c.name, v)
		}
	}
	b.write(b.stamps.put("n", "text"))
	a.write(a.stamps.incr("n", 5))
	b.ship(a, false)
	a.ship(b, false)
	for _, c := range []*conflictCluster{a, b} {
		if v := c.read("n"); string(v.Value) != "text" || v.Counted {
			t.Fatalf("%s reads n as %+v, want the value that is not an integer", c.name, v)
		}
	}
	if da, db := a.digest(), b.digest(); da != db {
		t.Fatalf("digests differ: %s %s", da, db)
	}
}

// TestCounterWithExpiry: INCR keeps the key's expiry (the increments count
// on the value that expires); once it passed, the key reads absent,
// increments included, and the next INCR counts from zero (clearing the
// expired value), as in Redis's rate limiters. The peer reads the same.
func TestCounterWithExpiry(t *testing.T) {
	a, b := floorsPair(t)
	p := a.stamps.put("r", "1")
	p.Entry.Expires = p.Entry.Commit.Wall + 2500
	a.write(p)
	if w := a.write(a.stamps.incr("r", 1)); w.CounterValue != 2 {
		t.Fatalf("INCR of a value that expires: %+v", w)
	}
	if v := a.read("r"); v.Expires != p.Entry.Expires || string(v.Value) != "2" {
		t.Fatalf("r reads %+v, want 2 expiring at %d", v, p.Entry.Expires)
	}
	a.stamps.next()
	a.stamps.next()
	if v := a.read("r"); v.Present || !v.Expired {
		t.Fatalf("r after its expiry reads %+v", v)
	}
	w := a.write(a.stamps.incr("r", 1))
	if w.CounterValue != 1 || !w.Entry.Clears {
		t.Fatalf("INCR after the expiry: %+v", w)
	}
	b.ship(a, false)
	for _, c := range []*conflictCluster{a, b} {
		if v := c.read("r"); string(v.Value) != "1" || v.Expires != 0 {
			t.Fatalf("%s reads r as %+v, want 1 without an expiry", c.name, v)
		}
	}
}

func (c *conflictCluster) digest() string {
	c.t.Helper()
	d, err := c.st.Digest()
	if err != nil {
		c.t.Fatal(err)
	}
	return d.Hash
}
