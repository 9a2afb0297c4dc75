package machine

import (
	"errors"
	"testing"

	"github.com/replicator/replicator/entry"
)

// TestExpiryDecidedAtCommit: a version's expiry is stored with it, and the
// decisions of later writes read it against their own commit time (every
// node decides the same): before it, the key holds a value (SET NX
// refused, a delete writes); from it on, none (SET NX written, a delete of
// it writes nothing, an increment may make it a counter).
func TestExpiryDecidedAtCommit(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatExpiry}})
	index := uint64(2)
	apply := func(ps ...Proposal) *Result {
		t.Helper()
		index++
		return mustApply(t, m, index, &Command{Local: ps})
	}
	// k expires 2,500 ns after its commit: the stamper steps by 1,000.
	p := s.put("k", "v")
	p.Entry.Expires = p.Entry.Commit.Wall + 2500
	apply(p)
	if r, err := st.Get("k"); err != nil || r.Expires != p.Entry.Expires {
		t.Fatalf("k: %+v %v, want expiry %d", r, err, p.Entry.Expires)
	}
	nx := func() Proposal {
		q := s.put("k", "mine")
		q.Cond = &Condition{IfNoneMatch: true}
		return q
	}
	if w := apply(nx()).Writes[0]; !errors.Is(w.Err, ErrPrecondition) {
		t.Fatalf("SET NX 1,000 ns after the write, before its expiry: %+v", w)
	}
	s.next() // past the expiry (3,000 ns after the write)
	del := Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: "k", Commit: s.next()}}
	if w := apply(del).Writes[0]; w.Entry.Index != 0 || w.Existed != 0 {
		t.Fatalf("a delete of an expired key wrote: %+v", w)
	}
	if w := apply(nx()).Writes[0]; w.Err != nil || w.Entry.Index == 0 {
		t.Fatalf("SET NX after the expiry: %+v", w)
	}
	if r, _ := st.Get("k"); string(r.Value) != "mine" || r.Expires != 0 {
		t.Fatalf("k after SET NX: %+v", r)
	}
	// An expired plain value does not keep a counter off its key.
	q := s.put("c", "1")
	q.Entry.Expires = q.Entry.Commit.Wall + 1
	apply(q)
	if w := apply(s.incr("c", 2)).Writes[0]; w.Err != nil {
		t.Fatalf("an increment of a key whose plain value expired: %v", w.Err)
	}
}

// TestConflictKeepsTheLosersExpiry: an EXPIRE at one cluster racing a SET
// of the key at another converges last-writer-wins on the whole version
// (value and expiry together), and the conflict record of the loser keeps
// its expiry, at both clusters, for a restore to write it back with it.
func TestConflictKeepsTheLosersExpiry(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b := newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+500)
	for _, c := range []*conflictCluster{a, b} {
		c.apply(&Command{Format: &FormatCmd{Version: FormatExpiry}})
	}
	a.put("k", "v")
	b.ship(a, false)
	// a: EXPIRE (the value read, a new expiry); b, later: a SET.
	p := a.stamps.put("k", "v")
	p.Entry.Expires = 2e15
	res := a.apply(&Command{Local: []Proposal{p}})
	a.out = append(a.out, res.Writes[0].Entry)
	b.put("k", "b's")
	a.ship(b, false)
	b.ship(a, false)
	for _, c := range []*conflictCluster{a, b} {
		r, err := c.st.Get("k")
		if err != nil || string(r.Value) != "b's" || r.Expires != 0 {
			t.Fatalf("%s holds %+v %v, want b's later SET whole, without an expiry", c.name, r, err)
		}
		lg := c.log()["k"]
		if len(lg) != 1 || lg[0].LoserExpires != 2e15 || string(lg[0].LoserValue) != "v" {
			t.Fatalf("%s logged %+v, want the EXPIRE's version (value v, expiry 2e15)", c.name, lg)
		}
	}
}
