package antientropy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// side is one cluster: a store driven by a machine (repairs are commands).
type side struct {
	name, dir string
	st        *store.Store
	d         *machine.Direct
}

func newSide(t *testing.T, name string) *side {
	t.Helper()
	s := &side{name: name, dir: t.TempDir()}
	s.open(t)
	t.Cleanup(func() { s.st.Close() })
	if _, err := s.d.Apply(&machine.Command{Format: &machine.FormatCmd{Version: machine.FormatRepair}}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *side) open(t *testing.T) {
	t.Helper()
	st, err := store.Open(s.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := machine.OpenDirect(st, machine.Options{Cluster: s.name})
	if err != nil {
		t.Fatal(err)
	}
	s.st, s.d = st, d
}

// rot changes key's value in Pebble beneath the store, under the same
// stamp (a flipped bit, a hand edit), and opens the store again.
func (s *side) rot(t *testing.T, key string) {
	t.Helper()
	r, err := s.st.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.st.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := pebble.Open(s.dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest})
	if err != nil {
		t.Fatal(err)
	}
	r.Value = []byte("rotten")
	if err := db.Set(append([]byte("d"), key...), store.AppendRecord(nil, &r), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s.open(t)
}

func (s *side) incr(t *testing.T, key, comp string, pn entry.PN, st entry.Stamp) {
	t.Helper()
	b := s.st.NewBatch()
	defer b.Close()
	if _, err := b.MergeCounter(key, comp, pn, st); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
}

func at(wall int64, origin string) entry.Stamp {
	return entry.Stamp{HLC: hlc.Timestamp{Wall: wall}, Origin: origin}
}

func (s *side) set(t *testing.T, key, val string, st entry.Stamp) {
	t.Helper()
	if _, err := s.st.Set(key, []byte(val), st); err != nil {
		t.Fatal(err)
	}
}

func (s *side) del(t *testing.T, key string, st entry.Stamp) {
	t.Helper()
	if _, err := s.st.Delete(key, st); err != nil {
		t.Fatal(err)
	}
}

func (s *side) repair(t *testing.T, from string, vs []wire.TreeVersion) int {
	t.Helper()
	if len(vs) == 0 {
		return 0
	}
	res, err := s.d.Apply(&machine.Command{Repair: &machine.RepairCmd{Peer: from, Versions: vs}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Repair.Applied
}

func noSleep(context.Context, time.Duration) error { return nil }

// TestCompareFindsExactlyTheDivergence: two trees holding the same 20,000
// keys, then each kind of divergence on a few: a value one side lacks, an
// older value, a delete one side lacks, keys only one side holds (one of
// them older than the other's collection horizon), a value rotted under
// the same stamp, counters with higher components on each side. The
// comparison reports exactly those keys with who lacks what; a repair of
// each side pulls exactly what it lacks, and the trees are then equal but
// for what must not be copied.
func TestCompareFindsExactlyTheDivergence(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for _, s := range []*side{a, b} {
		bt := s.st.NewBatch()
		for i := 0; i < 20000; i++ {
			w := store.Write{Key: fmt.Sprintf("key-%05d", i), Value: []byte("v"), Stamp: at(int64(1000+i), []string{"a", "b"}[i%2])}
			if _, err := bt.Merge(w); err != nil {
				t.Fatal(err)
			}
		}
		if err := bt.Commit(true); err != nil {
			t.Fatal(err)
		}
		bt.Close()
	}
	// a holds newer versions of these (b lacks them)
	a.set(t, "key-00010", "newer", at(50000, "a"))
	a.del(t, "key-00011", at(50001, "a"))
	a.set(t, "only-a", "x", at(50002, "a"))
	// b holds newer versions of these (a lacks them)
	b.set(t, "key-00020", "newer", at(50003, "b"))
	b.del(t, "key-00021", at(50004, "b"))
	b.set(t, "only-b", "x", at(50005, "b"))
	// a key only b holds, older than a's collection horizon: a may have
	// deleted it and collected the tombstone.
	b.set(t, "zombie", "old", at(500, "b"))
	if _, err := a.d.Apply(&machine.Command{Collect: &machine.CollectCmd{Cutoff: hlc.Timestamp{Wall: 900}, Max: 10}}); err != nil {
		t.Fatal(err)
	}
	// counters: each side holds a component the other holds lower
	a.incr(t, "n", "a", entry.PN{P: 5}, at(60000, "a"))
	b.incr(t, "n", "a", entry.PN{P: 3}, at(60001, "a"))
	b.incr(t, "n", "b", entry.PN{N: 2}, at(60002, "b"))
	// a value changed beneath the tree under the same stamp (the leaves
	// summed at open see it)
	a.rot(t, "key-00030")

	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.Lacks{}
	for _, d := range rep.Divergent {
		got[d.Key] = d.Lacks
	}
	want := map[string]api.Lacks{
		"key-00010": api.LacksPeer, "key-00011": api.LacksPeer, "only-a": api.LacksPeer,
		"key-00020": api.LacksLocal, "key-00021": api.LacksLocal, "only-b": api.LacksLocal,
		"zombie": api.LacksMaybeDeleted, "key-00030": api.LacksUnknown, "n": api.LacksBoth,
	}
	if fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(want)) {
		t.Fatalf("divergent:\n got %v\nwant %v", sorted(got), sorted(want))
	}
	if rep.InFlight != 0 || rep.Compared > 2000 {
		t.Fatalf("in flight %d (want 0), compared %d keys (want only the differing leaves')", rep.InFlight, rep.Compared)
	}

	// Each side pulls what it lacks: exactly those keys change.
	if n := a.repair(t, "b", rep.Pulls()); n != 4 {
		t.Fatalf("a applied %d repaired versions, want 4", n)
	}
	back, err := Compare(context.Background(), "a", Local{St: b.st}, Local{St: a.st}, Options{Local: "b", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.repair(t, "a", back.Pulls()); n != 4 {
		t.Fatalf("b applied %d repaired versions, want 4 (3 lacked, the counter)", n)
	}
	after, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]api.Lacks{}
	for _, d := range after.Divergent {
		left[d.Key] = d.Lacks
	}
	if fmt.Sprint(sorted(left)) != fmt.Sprint(sorted(map[string]api.Lacks{"zombie": api.LacksMaybeDeleted, "key-00030": api.LacksUnknown})) {
		t.Fatalf("after repair: %v", sorted(left))
	}
	c, err := a.st.Counter("n")
	if err != nil || c.Totals["a"] != (entry.PN{P: 5}) || c.Totals["b"] != (entry.PN{N: 2}) {
		t.Fatalf("counter after repair: %v %v", c.Totals, err)
	}
	// Without the rotten key and the zombie, the trees are equal.
	a.del(t, "key-00030", at(70000, "a"))
	b.del(t, "key-00030", at(70000, "a"))
	b.del(t, "zombie", at(70001, "b"))
	a.del(t, "zombie", at(70001, "b"))
	final, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || !final.Equal {
		t.Fatalf("trees not equal after repair: %+v %v", final, err)
	}
	da, _ := a.st.Digest()
	db, _ := b.st.Digest()
	if da != db {
		t.Fatal("digests differ with equal trees")
	}
}

// TestCompareSkipsWritesInFlight: a key that changes on either side between
// the two looks is in flight, not divergent, even if it still differs.
func TestCompareSkipsWritesInFlight(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for i := 0; i < 100; i++ {
		a.set(t, fmt.Sprintf("k%03d", i), "v", at(int64(100+i), "a"))
		b.set(t, fmt.Sprintf("k%03d", i), "v", at(int64(100+i), "a"))
	}
	a.set(t, "k001", "w1", at(1000, "a")) // arrives at b during the wait
	a.set(t, "k002", "w1", at(1001, "a")) // written again at a during the wait
	a.set(t, "k003", "w1", at(1002, "a")) // really lacked by b
	settle := func(ctx context.Context, d time.Duration) error {
		b.set(t, "k001", "w1", at(1000, "a"))
		a.set(t, "k002", "w2", at(1003, "a"))
		return nil
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: settle})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Candidates != 3 || rep.InFlight != 2 || len(rep.Divergent) != 1 || rep.Divergent[0].Key != "k003" {
		t.Fatalf("candidates %d, in flight %d, divergent %+v; want 3, 2, k003", rep.Candidates, rep.InFlight, rep.Divergent)
	}
}

func sorted(m map[string]api.Lacks) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+string(v))
	}
	sort.Strings(out)
	return out
}

// TestCompareRangesAboveTheHorizons: a range delete one side collected and
// the other still keeps is not a difference; one above both sides'
// collection horizons that only one side keeps is reported (ranges_differ).
func TestCompareRangesAboveTheHorizons(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	rangeAt := func(s *side, wall int64) {
		bt := s.st.NewBatch()
		defer bt.Close()
		if _, _, err := bt.MergeRange(store.RangeTombstone{Start: "r/", End: "r0", Stamp: at(wall, "a")}); err != nil {
			t.Fatal(err)
		}
		if err := bt.Commit(true); err != nil {
			t.Fatal(err)
		}
	}
	rangeAt(a, 100)
	rangeAt(b, 100)
	if _, err := a.d.Apply(&machine.Command{Collect: &machine.CollectCmd{Cutoff: hlc.Timestamp{Wall: 200}, Max: 10}}); err != nil {
		t.Fatal(err)
	}
	if len(a.st.RangeTombstones()) != 0 || len(b.st.RangeTombstones()) != 1 {
		t.Fatal("test assumes a collected the range and b did not")
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || !rep.Equal {
		t.Fatalf("a range collected at one side only made the trees differ: %+v %v", rep, err)
	}
	rangeAt(b, 300)
	rep, err = Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || !rep.RangesDiffer || rep.RangesHere != 0 || rep.RangesPeer != 1 {
		t.Fatalf("a range only b keeps, above both horizons, went unseen: %+v %v", rep, err)
	}
}

// TestCompareScopedByFilters: a filtered link's comparison looks only at the
// keys both links carry (this side's filter toward the peer, the peer's
// toward this side): divergence outside them is not reported, and the
// repair pulls nothing from outside.
func TestCompareScopedByFilters(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for _, k := range []string{"in/1", "in/2", "in/tmp/1", "out/1", "both/1"} {
		a.set(t, k, "v", at(100, "a"))
		b.set(t, k, "v", at(100, "a"))
	}
	a.set(t, "in/1", "newer", at(200, "a"))     // in scope: b lacks it
	b.set(t, "in/2", "newer", at(201, "b"))     // in scope: a lacks it
	a.set(t, "in/tmp/1", "newer", at(202, "a")) // a's filter excludes it
	a.set(t, "out/1", "newer", at(203, "a"))    // not included by a's filter
	b.set(t, "both/1", "newer", at(204, "b"))   // a's filter includes it, b's toward a does not
	aToB := entry.Filter{Include: []string{"in/", "both/"}, Exclude: []string{"in/tmp/"}}
	bToA := entry.Filter{Include: []string{"in/"}}
	peer := Local{St: b.st, Toward: bToA, Scoped: &ScopeCache{}}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, peer, Options{Local: "a", Sleep: noSleep, Filter: aToB, Pass: 1})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.Lacks{}
	for _, d := range rep.Divergent {
		got[d.Key] = d.Lacks
	}
	if want := map[string]api.Lacks{"in/1": api.LacksPeer, "in/2": api.LacksLocal}; fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(want)) {
		t.Fatalf("scoped comparison: got %v, want %v", sorted(got), sorted(want))
	}
	if n := a.repair(t, "b", rep.Pulls()); n != 1 {
		t.Fatalf("repair applied %d, want 1 (in/2)", n)
	}
	// The unfiltered comparison sees everything.
	all, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || len(all.Divergent) != 4 {
		t.Fatalf("unfiltered: %d divergent (%v), want 4", len(all.Divergent), err)
	}
	// Filters no key passes both: nothing to compare.
	none, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st, Toward: entry.Filter{Include: []string{"zzz/"}}},
		Options{Local: "a", Sleep: noSleep, Filter: entry.Filter{Include: []string{"in/"}}, Pass: 2})
	if err != nil || !none.Equal {
		t.Fatalf("disjoint filters: %+v %v", none, err)
	}
}

// TestCompareSecondLookInParts: whole versions past an answer's byte budget
// come in several answers (each side covering a prefix of the keys asked,
// at its own budget), and the comparison still judges every key once.
func TestCompareSecondLookInParts(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	big := make([]byte, 300)
	for i := 0; i < 40; i++ {
		a.set(t, fmt.Sprintf("k%02d", i), string(big), at(int64(100+i), "a"))
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st, Budget: 1000}, Local{St: b.st, Budget: 700}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 40 || rep.Count(api.LacksPeer) != 40 || rep.InFlight != 0 {
		t.Fatalf("%d divergent (%d lacked by the peer), %d in flight; want 40, 40, 0", len(rep.Divergent), rep.Count(api.LacksPeer), rep.InFlight)
	}
	back, err := Compare(context.Background(), "a", Local{St: b.st, Budget: 700}, Local{St: a.st, Budget: 1000}, Options{Local: "b", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.repair(t, "a", back.Pulls()); n != 40 {
		t.Fatalf("repair in parts applied %d, want 40", n)
	}
}

// countingTree counts the leaves requests a tree answers.
type countingTree struct {
	Tree
	leaves *int
}

func (c countingTree) Ask(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	if req.Op == wire.TreeLeaves {
		*c.leaves++
	}
	return c.Tree.Ask(ctx, req)
}

// TestCompareFirstLookInParts: the first look's key lists have a byte
// budget too (long keys in many differing leaves): each answer covers whole
// leaves up to it and lists the rest, which the asker asks for again, and
// every differing key is still found exactly once.
func TestCompareFirstLookInParts(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	long := strings.Repeat("k", 300)
	for i := 0; i < 40; i++ {
		a.set(t, fmt.Sprintf("%s%02d", long, i), "v", at(int64(100+i), "a"))
		b.set(t, fmt.Sprintf("same%02d", i), "v", at(int64(100+i), "b"))
		a.set(t, fmt.Sprintf("same%02d", i), "v", at(int64(100+i), "b"))
	}
	var asked int
	rep, err := Compare(context.Background(), "b", countingTree{Local{St: a.st, Budget: 1000}, &asked}, Local{St: b.st, Budget: 700}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 40 || rep.Count(api.LacksPeer) != 40 || rep.InFlight != 0 || rep.Compared != 40 {
		t.Fatalf("%d divergent (%d lacked by the peer), %d in flight, %d compared; want 40, 40, 0, 40",
			len(rep.Divergent), rep.Count(api.LacksPeer), rep.InFlight, rep.Compared)
	}
	if asked < 10 {
		t.Fatalf("%d leaves requests for 40 keys of 300 bytes at a budget of 1000: the answers were not bounded", asked)
	}
	// An answer whose leaves are each over the budget still covers one.
	rep, err = Compare(context.Background(), "b", Local{St: a.st, Budget: 1}, Local{St: b.st, Budget: 1}, Options{Local: "a", Sleep: noSleep})
	if err != nil || len(rep.Divergent) != 40 {
		t.Fatalf("at a budget of one byte: %v, %d divergent", err, len(rep.Divergent))
	}
}

// TestCompareTheOriginRule (issue 45, case 2; case 7): a comparison
// between a and b lists apart the keys that differ only in a third
// cluster's version (c's filter toward b keeps c-only/ from b; a holds c's
// newer write of a key b holds c's older write of): not divergence between
// a and b, and neither side's repair copies them; a repair pulls only the
// peer's own writes (a counter's components of the peer), never the
// puller's own (a lost write of its own is own_write); a write and a
// delete under one stamp are unknown, not lacked; a range delete of the
// pair only one side keeps makes the comparison not equal, a third
// cluster's does not.
func TestCompareTheOriginRule(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("same-%02d", i)
		a.set(t, k, "v", at(100, "a"))
		b.set(t, k, "v", at(100, "a"))
	}
	a.set(t, "c-only/1", "c", at(1000, "c")) // c's filter keeps it from b
	a.set(t, "shared", "c2", at(1001, "c"))  // b has c's older write
	b.set(t, "shared", "c1", at(900, "c"))
	a.set(t, "from-b", "b", at(1002, "b")) // b's own write that b lost
	a.set(t, "from-a", "a", at(1003, "a")) // a's write b lacks
	b.set(t, "b-new", "b", at(1004, "b"))  // b's write a lacks
	a.set(t, "rot", "v", at(1005, "a"))    // one write, kept two ways
	b.del(t, "rot", at(1005, "a"))
	a.incr(t, "n-third", "c/s1", entry.PN{P: 5}, at(2000, "c"))
	b.incr(t, "n-third", "c/s1", entry.PN{P: 3}, at(2001, "c"))
	a.incr(t, "n-mixed", "b/s1", entry.PN{P: 4}, at(2002, "b")) // b lost its own
	a.incr(t, "n-mixed", "c/s1", entry.PN{P: 2}, at(2003, "c"))
	b.incr(t, "n-mixed", "c/s1", entry.PN{P: 1}, at(2004, "c"))
	b.incr(t, "n-mixed", "b/s1", entry.PN{P: 1}, at(2005, "b"))
	b.incr(t, "n-peer", "b/s1", entry.PN{P: 7}, at(2006, "b")) // a lacks b's
	b.incr(t, "n-peer", "c/s1", entry.PN{P: 7}, at(2007, "c")) // and c's

	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	lacks := func(ds []api.Divergence) []string {
		m := map[string]api.Lacks{}
		for _, d := range ds {
			m[d.Key] = d.Lacks
		}
		return sorted(m)
	}
	wantDiv := map[string]api.Lacks{"from-b": api.LacksOwnWrite, "from-a": api.LacksPeer, "b-new": api.LacksLocal, "rot": api.LacksUnknown,
		"n-mixed": api.LacksOwnWrite, "n-peer": api.LacksLocal}
	wantThird := map[string]api.Lacks{"c-only/1": api.LacksThirdOrigin, "shared": api.LacksThirdOrigin, "n-third": api.LacksThirdOrigin}
	if got := lacks(rep.Divergent); fmt.Sprint(got) != fmt.Sprint(sorted(wantDiv)) {
		t.Fatalf("divergent:\n got %v\nwant %v", got, sorted(wantDiv))
	}
	if got := lacks(rep.ThirdOrigin); fmt.Sprint(got) != fmt.Sprint(sorted(wantThird)) {
		t.Fatalf("third origin:\n got %v\nwant %v", got, sorted(wantThird))
	}
	var pulled []string
	for _, v := range rep.Pulls() {
		s := v.Key
		for _, c := range v.Totals {
			s += " " + c.Cluster
		}
		pulled = append(pulled, s)
	}
	sort.Strings(pulled)
	if got := fmt.Sprint(pulled); got != "[b-new n-peer b/s1]" {
		t.Fatalf("a pulls %s, want b's own writes only: [b-new n-peer b/s1]", got)
	}
	// b's side: it pulls a's own write, not its own lost one, nor c's.
	back, err := Compare(context.Background(), "a", Local{St: b.st}, Local{St: a.st}, Options{Local: "b", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	var backPulled []string
	for _, v := range back.Pulls() {
		backPulled = append(backPulled, v.Key)
	}
	if got := fmt.Sprint(backPulled); got != "[from-a]" {
		t.Fatalf("b pulls %s, want [from-a]", got)
	}
	if len(back.ThirdOrigin) != 3 {
		t.Fatalf("b's comparison lists %d keys of a third origin, want 3", len(back.ThirdOrigin))
	}

	// Range deletes: the pair's own only one side keeps make it unequal;
	// a third cluster's do not.
	x, y := newSide(t, "a"), newSide(t, "b")
	rng := func(s *side, start, end string, st entry.Stamp) {
		bt := s.st.NewBatch()
		defer bt.Close()
		if _, _, err := bt.MergeRange(store.RangeTombstone{Start: start, End: end, Stamp: st}); err != nil {
			t.Fatal(err)
		}
		if err := bt.Commit(true); err != nil {
			t.Fatal(err)
		}
	}
	rng(x, "c/", "c0", at(500, "c"))
	eq, err := Compare(context.Background(), "b", Local{St: x.st}, Local{St: y.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || !eq.Equal || eq.RangesDiffer {
		t.Fatalf("a third cluster's range delete at one side only: %+v %v", eq, err)
	}
	rng(x, "r/", "r0", at(600, "a"))
	ne, err := Compare(context.Background(), "b", Local{St: x.st}, Local{St: y.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || !ne.Equal || !ne.RangesDiffer || len(ne.RangesOnlyHere) != 1 || ne.RangesOnlyHere[0].Start != "r/" || len(ne.RangesOnlyPeer) != 0 {
		t.Fatalf("a's own range delete b lacks, with equal live versions: equal %v, differ %v, only here %+v (%v)", ne.Equal, ne.RangesDiffer, ne.RangesOnlyHere, err)
	}
}

// TestCompareHorizonAtTheSecondLook (issue 45, case 7): a side that
// collects, between the two looks, the delete of a key it holds nothing of
// at either look (a third cluster's delete, arrived late and collected) must
// be judged by its horizon of then: the peer's older version is a possible
// resurrection, not a version to pull.
func TestCompareHorizonAtTheSecondLook(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	b.set(t, "z", "old", at(200, "b"))
	settle := func(context.Context, time.Duration) error {
		a.del(t, "z", at(300, "c"))
		if _, err := a.d.Apply(&machine.Command{Collect: &machine.CollectCmd{Cutoff: hlc.Timestamp{Wall: 400}, Max: 10}}); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: settle})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 1 || rep.Divergent[0].Lacks != api.LacksMaybeDeleted || len(rep.Pulls()) != 0 {
		t.Fatalf("divergent %+v, pulls %d: want z a possible resurrection, nothing pulled", rep.Divergent, len(rep.Pulls()))
	}
}

// TestCompareRangesInPieces: a range delete one side keeps whole and the
// other in two touching pieces (a filtered link shipped one part, a
// widening's backfill the rest) covers the same keys: equal.
func TestCompareRangesInPieces(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	rng := func(s *side, start, end string) {
		bt := s.st.NewBatch()
		defer bt.Close()
		if _, _, err := bt.MergeRange(store.RangeTombstone{Start: start, End: end, Stamp: at(600, "a")}); err != nil {
			t.Fatal(err)
		}
		if err := bt.Commit(true); err != nil {
			t.Fatal(err)
		}
	}
	rng(a, "k/08", "k/11")
	rng(b, "k/08", "k/1")
	rng(b, "k/1", "k/11")
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil || !rep.Equal || rep.RangesDiffer {
		t.Fatalf("one range delete kept whole and in two pieces: %+v %v", rep, err)
	}
}

// TestCompareThirdOriginPastTheHorizon: a third cluster's key one side
// holds and the other never got (its author's filter keeps it from it),
// older than that side's collection horizon, is listed apart as a third
// cluster's, not as a possible resurrection between the two.
func TestCompareThirdOriginPastTheHorizon(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	a.set(t, "c-only/1", "c", at(500, "c"))
	a.set(t, "mine", "a", at(501, "a"))
	if _, err := b.d.Apply(&machine.Command{Collect: &machine.CollectCmd{Cutoff: hlc.Timestamp{Wall: 900}, Max: 10}}); err != nil {
		t.Fatal(err)
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 1 || rep.Divergent[0].Key != "mine" || rep.Divergent[0].Lacks != api.LacksMaybeDeleted {
		t.Fatalf("divergent %+v: want mine, a possible resurrection", rep.Divergent)
	}
	if len(rep.ThirdOrigin) != 1 || rep.ThirdOrigin[0].Key != "c-only/1" {
		t.Fatalf("third origin %+v: want c-only/1", rep.ThirdOrigin)
	}
}

// TestScopeCacheOneTreeAnAsker (issue 46, 10): a peer sending pass after
// pass holds one tree of the cache, and pushes out nobody else's.
func TestScopeCacheOneTreeAnAsker(t *testing.T) {
	var c ScopeCache
	sums := 0
	sum := func() ([]hashtree.Sum, error) { sums++; return []hashtree.Sum{{A: uint64(sums)}}, nil }
	if _, err := c.get("", 1, "s", sum); err != nil {
		t.Fatal(err)
	}
	for pass := uint64(100); pass < 200; pass++ {
		c.get("hostile", pass, "s", sum)
	}
	before := sums
	if _, err := c.get("", 1, "s", sum); err != nil || sums != before {
		t.Fatalf("this side's tree of pass 1 was pushed out by a peer's passes (%d sums, want %d)", sums, before)
	}
	owners := map[string]int{}
	for _, e := range c.entries {
		owners[e.owner]++
	}
	if owners["hostile"] != 1 {
		t.Fatalf("the peer holds %d trees, want 1", owners["hostile"])
	}
}

// TestCompareCarriesExpiry: a version that expires crosses a comparison
// with its expiry (the leaf digests cover it), and a repair writes it with
// it; to an asker that does not say it keeps expiry, the whole version is
// not answered (it would repair it as one that never expires).
func TestCompareCarriesExpiry(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for i := 0; i < 50; i++ {
		a.set(t, fmt.Sprintf("k%03d", i), "v", at(int64(100+i), "b"))
		b.set(t, fmt.Sprintf("k%03d", i), "v", at(int64(100+i), "b"))
	}
	if _, err := b.st.Merge(store.Write{Key: "ttl", Value: []byte("v"), Stamp: at(500, "b"), Expires: 1 << 61}); err != nil {
		t.Fatal(err)
	}
	// The same version with another expiry differs too.
	a.set(t, "k007", "x", at(600, "b"))
	if _, err := b.st.Merge(store.Write{Key: "k007", Value: []byte("x"), Stamp: at(600, "b"), Expires: 1 << 61}); err != nil {
		t.Fatal(err)
	}
	old, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range old.Pulls() {
		if v.Expires != 0 || v.Key == "ttl" {
			t.Fatalf("an asker that keeps no expiry was answered %+v", v)
		}
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep, Expiry: true})
	if err != nil {
		t.Fatal(err)
	}
	pulls := rep.Pulls()
	if len(pulls) != 1 || pulls[0].Key != "ttl" || pulls[0].Expires != 1<<61 {
		t.Fatalf("pulls %+v, want ttl with its expiry", pulls)
	}
	if n := a.repair(t, "b", pulls); n != 1 {
		t.Fatalf("repaired %d", n)
	}
	if r, err := a.st.Get("ttl"); err != nil || r.Expires != 1<<61 {
		t.Fatalf("a's ttl after the repair: %+v %v", r, err)
	}
	found := false
	for _, d := range rep.Divergent {
		found = found || d.Key == "k007"
	}
	if !found {
		t.Fatalf("the same version with another expiry is not a divergence: %+v", rep.Divergent)
	}
}

// TestCompareExpiredCollectedAtOneSide: each cluster collects expired
// versions at its own pace: a version one side collected (expired by its
// horizon) and the other still holds is listed apart as expired, not as
// divergence, and no repair takes it.
func TestCompareExpiredCollectedAtOneSide(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for _, s := range []*side{a, b} {
		if _, err := s.st.Merge(store.Write{Key: "ttl", Value: []byte("v"), Stamp: at(100, "b"), Expires: 500}); err != nil {
			t.Fatal(err)
		}
		s.set(t, "plain", "v", at(100, "b"))
	}
	if _, err := a.d.Apply(&machine.Command{Collect: &machine.CollectCmd{Cutoff: hlc.Timestamp{Wall: 900}, Max: 10}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.st.Get("ttl"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a did not collect the expired version: %v", err)
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep, Expiry: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 0 || len(rep.Expired) != 1 || rep.Expired[0].Key != "ttl" || len(rep.Pulls()) != 0 {
		t.Fatalf("divergent %+v, expired %+v, pulls %+v; want ttl listed as expired, nothing to repair", rep.Divergent, rep.Expired, rep.Pulls())
	}
}

// TestCompareCarriesFloors: a counter the peer deleted in part (its floors
// over the peer's own component) differs; an asker that keeps floors pulls
// them and reads what the peer reads, one that does not is not answered
// the counter; a counter both sides deleted whole is no divergence, even
// once one side collected it.
func TestCompareCarriesFloors(t *testing.T) {
	a, b := newSide(t, "a"), newSide(t, "b")
	for _, s := range []*side{a, b} {
		if _, err := s.d.Apply(&machine.Command{Format: &machine.FormatCmd{Version: machine.FormatCounterFloors}}); err != nil {
			t.Fatal(err)
		}
		bt := s.st.NewBatch()
		for _, k := range []string{"c", "gone"} {
			if _, err := bt.MergeCounter(k, "b", entry.PN{P: 5}, at(100, "b")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := bt.MergeFloors("gone", map[string]entry.PN{"b": {P: 5}}, at(150, "b")); err != nil {
			t.Fatal(err)
		}
		if err := bt.Commit(true); err != nil {
			t.Fatal(err)
		}
		bt.Close()
	}
	bt := b.st.NewBatch()
	if _, err := bt.MergeFloors("c", map[string]entry.PN{"b": {P: 3}}, at(200, "b")); err != nil {
		t.Fatal(err)
	}
	if err := bt.Commit(true); err != nil {
		t.Fatal(err)
	}
	bt.Close()
	old, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep, Expiry: true})
	if err != nil {
		t.Fatal(err)
	}
	if old.Equal || len(old.Pulls()) != 0 {
		t.Fatalf("an asker that keeps no floors: divergent %+v, pulls %+v", old.Divergent, old.Pulls())
	}
	rep, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep, Expiry: true, Floors: true})
	if err != nil {
		t.Fatal(err)
	}
	pulls := rep.Pulls()
	if len(pulls) != 1 || pulls[0].Key != "c" || len(pulls[0].Floors) != 1 {
		t.Fatalf("pulls %+v, want c with b's floors", pulls)
	}
	if n := a.repair(t, "b", pulls); n != 1 {
		t.Fatalf("repaired %d", n)
	}
	if v, _, _, err := a.st.Read("c", 0); err != nil || string(v.Value) != "2" {
		t.Fatalf("a reads c as %+v %v after the repair, want 2", v, err)
	}
	if _, err := b.d.Apply(&machine.Command{Collect: &machine.CollectCmd{Cutoff: hlc.Timestamp{Wall: 900}, Max: 10}}); err != nil {
		t.Fatal(err)
	}
	again, err := Compare(context.Background(), "b", Local{St: a.st}, Local{St: b.st}, Options{Local: "a", Sleep: noSleep, Expiry: true, Floors: true})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Equal || len(again.Divergent) != 0 {
		t.Fatalf("after the repair: %+v", again)
	}
}
