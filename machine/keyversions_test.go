package machine

import (
	"errors"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// TestBatchConditionOnKeys: a batch conditional on keys' versions (a RESP
// transaction's reads and WATCH) is written whole when every key holds the
// version named (a live value's, a counter's, or "" for neither), and not
// at all otherwise, decided in commit order: a write earlier in the same
// group changes the version the batch sees.
func TestBatchConditionOnKeys(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	index := uint64(0)
	apply := func(ps ...Proposal) *Result {
		t.Helper()
		index++
		return mustApply(t, m, index, &Command{Local: ps})
	}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	index = 1
	batch := func(kvs ...string) Proposal {
		c := &Condition{}
		for i := 0; i < len(kvs); i += 2 {
			c.Keys = append(c.Keys, api.KeyVersion{Key: kvs[i], Version: kvs[i+1]})
		}
		return Proposal{Entry: entry.Entry{Op: entry.OpMulti, Commit: s.next(),
			Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "out", Value: []byte("x")}}}, Cond: c}
	}
	version := func(key string) string {
		r, err := st.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		return r.Stamp.String()
	}
	apply(s.put("a", "1"), s.incr("n", 3))
	va := version("a")
	c, err := st.Counter("n")
	if err != nil {
		t.Fatal(err)
	}
	vn := c.Stamp.String()

	// Every version holds: written.
	if w := apply(batch("a", va, "n", vn, "absent", "")).Writes[0]; w.Err != nil || w.Entry.Index == 0 {
		t.Fatalf("a batch whose versions hold: %+v", w)
	}
	out := version("out")

	refused := func(why string, wantKey string, ps ...Proposal) {
		t.Helper()
		before := m.Outbound().Last()
		res := apply(ps...)
		w := res.Writes[len(ps)-1]
		var pe *api.PreconditionError
		if !errors.As(w.Err, &pe) || !errors.Is(w.Err, ErrPrecondition) || pe.Key != wantKey {
			t.Fatalf("%s: %+v, want a precondition error on %q", why, w, wantKey)
		}
		if got := version("out"); got != out {
			t.Fatalf("%s: the refused batch wrote out (%s, was %s)", why, got, out)
		}
		if last := m.Outbound().Last(); last != before+uint64(len(ps)-1) {
			t.Fatalf("%s: the stream went from %d to %d", why, before, last)
		}
	}
	refused("a changed", "a", s.put("a", "2"), batch("a", va))
	va = version("a")
	refused("a key named absent holds a value", "a", batch("a", ""))
	refused("an absent key named with a version", "absent", batch("absent", va))
	refused("a counter incremented in the same group", "n", s.incr("n", 1), batch("n", vn))
	c, _ = st.Counter("n")
	vn = c.Stamp.String()
	refused("a counter incremented before", "n", batch("n", "1.0@x"))
	// A delete makes the key's version "": a batch that read it live is
	// refused; one that names it absent is written.
	apply(Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: "a", Commit: s.next()}})
	refused("a deleted key named live", "a", batch("a", va))
	if w := apply(batch("a", "", "n", vn)).Writes[0]; w.Err != nil || w.Entry.Index == 0 {
		t.Fatalf("a batch naming a deleted key absent: %+v", w)
	}
	if r, err := st.Get("a"); err != nil || !r.Tombstone {
		t.Fatalf("a: %+v, %v (the batch does not write a)", r, err)
	}
}

// TestKeyVersionsDecode: the condition's keys cross the log as they were
// proposed, only on a batch, and a bad shape is malformed.
func TestKeyVersionsDecode(t *testing.T) {
	s := &stamper{wall: 1e15}
	c := &Command{Local: []Proposal{{Entry: entry.Entry{Op: entry.OpMulti, Commit: s.next(), Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "k", Value: []byte("v")}}},
		Cond: &Condition{Keys: []api.KeyVersion{{Key: "k", Version: ""}, {Key: "w", Version: "5.0@a"}}}}}}
	got, err := Decode(encode(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if k := got.Local[0].Cond.Keys; len(k) != 2 || k[0] != (api.KeyVersion{Key: "k"}) || k[1] != (api.KeyVersion{Key: "w", Version: "5.0@a"}) {
		t.Fatalf("decoded keys %+v", k)
	}
	single := &Command{Local: []Proposal{{Entry: entry.Entry{Op: entry.OpSet, Key: "k", Value: []byte("v"), Commit: s.next()},
		Cond: &Condition{Keys: []api.KeyVersion{{Key: "k"}}}}}}
	if _, err := Decode(encode(t, single)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("keys' versions on a single write decoded: %v", err)
	}
}
