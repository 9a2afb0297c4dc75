package store

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
)

// TestKeptLeavesMatchAScan: leaves kept by batches (sets, deletes, range
// deletes, counters, stale and duplicate writes of three origins, tracked
// and blind batches, several keys a batch, batches dropped uncommitted,
// tombstones collected) equal leaves summed afresh from the data, after
// every batch, after a reopen and after a snapshot's tree is copied in.
func TestKeptLeavesMatchAScan(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	r := rand.New(rand.NewPCG(7, 8))
	check := func(s *Store, when string) {
		t.Helper()
		want, err := s.ScanLeaves()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Leaves(), want) {
			t.Fatalf("%s: the kept leaves differ from a scan", when)
		}
		snap := s.db.NewSnapshot()
		_, _, _, live, err := scanTree(snap)
		snap.Close()
		if err != nil || s.Live() != live {
			t.Fatalf("%s: %d live keys kept, a scan counts %d (%v)", when, s.Live(), live, err)
		}
	}
	wall := int64(1000)
	for i := 0; i < 400; i++ {
		b := s.NewBatch()
		if r.IntN(3) > 0 {
			b.Track(nil)
		}
		for j := 0; j < 1+r.IntN(8); j++ {
			wall += int64(r.IntN(3))
			origin := []string{"a", "b", "c"}[r.IntN(3)]
			st := entry.Stamp{HLC: hlc.Timestamp{Wall: wall - int64(r.IntN(20))}, Origin: origin}
			key := fmt.Sprintf("k%03d", r.IntN(60))
			var err error
			switch x := r.IntN(12); {
			case x < 6:
				w := Write{Key: key, Value: []byte(fmt.Sprint(r.IntN(1000))), Stamp: st, Local: origin == "a"}
				_, err = b.mergeWrite(&w)
			case x < 9:
				w := Write{Key: key, Tombstone: true, Stamp: st, Local: origin == "a"}
				_, err = b.mergeWrite(&w)
			case x < 11:
				_, err = b.MergeCounter(key, origin, entry.PN{P: uint64(r.IntN(50)), N: uint64(r.IntN(20))}, st)
			default:
				_, _, err = b.MergeRange(RangeTombstone{Start: key, End: key + "5", Stamp: st})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if r.IntN(10) == 0 {
			b.Close() // dropped: nothing of it may stay in the leaves
			continue
		}
		if err := b.Commit(false); err != nil {
			t.Fatal(err)
		}
		b.Close()
		// Every fifth batch (a scan sums 2^20 leaves: slow under -race);
		// a leaf kept wrong stays wrong until checked.
		if i%5 == 4 {
			check(s, fmt.Sprint("after batch ", i))
		}
		if i%50 == 49 {
			if _, err := s.CollectTombstones(hlc.Timestamp{Wall: wall - 30}, 0); err != nil {
				t.Fatal(err)
			}
			check(s, fmt.Sprint("after collecting at batch ", i))
		}
	}
	check(s, "after the last batch")
	kept := s.Leaves()
	nonzero := 0
	for _, l := range kept {
		if !l.IsZero() {
			nonzero++
		}
	}
	if nonzero < 40 {
		t.Fatalf("%d leaves hold anything: the test wrote little live", nonzero)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Leaves(), kept) {
		t.Fatal("the leaves summed at open differ from those kept")
	}

	// A snapshot's tree copied in brings its own leaves.
	other, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Set("elsewhere", []byte("v"), entry.Stamp{HLC: hlc.Timestamp{Wall: 5}, Origin: "b"}); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "cp")
	if err := other.Checkpoint(cp); err != nil {
		t.Fatal(err)
	}
	if err := s.ReplaceFrom(cp); err != nil {
		t.Fatal(err)
	}
	check(s, "after ReplaceFrom")
	if !slices.Equal(s.Leaves(), other.Leaves()) {
		t.Fatal("the copied tree's leaves differ from its source's")
	}
}

// TestRebuildFindsAHandEdit: a record changed in Pebble beneath the batches
// (bit rot, a hand edit) leaves the kept leaves differing from a scan in
// exactly its leaf, which a check of a sample holding it finds; a rebuild
// takes the scan's.
func TestRebuildFindsAHandEdit(t *testing.T) {
	s := openTemp(t)
	for i := 0; i < 100; i++ {
		if _, err := s.Set(fmt.Sprintf("k%03d", i), []byte("v"), stampAt(int64(i+1), "a")); err != nil {
			t.Fatal(err)
		}
	}
	rec := Record{Stamp: stampAt(7, "a"), Value: []byte("rotten")}
	if err := s.db.Set(dataKey("k006"), AppendRecord(nil, &rec), nil); err != nil {
		t.Fatal(err)
	}
	scanned, err := s.ScanLeaves()
	if err != nil {
		t.Fatal(err)
	}
	kept := s.Leaves()
	var differ []int
	for i := range kept {
		if kept[i] != scanned[i] {
			differ = append(differ, i)
		}
	}
	if want := []int{hashtree.Leaf("k006")}; !reflect.DeepEqual(differ, want) {
		t.Fatalf("leaves differing from a scan: %v, want %v", differ, want)
	}
	// The check of a sample holding the leaf finds it; one without it
	// does not.
	leaf := hashtree.Leaf("k006")
	if got, err := s.CheckLeaves(func(l int) bool { return l%16 != leaf%16 }, true); err != nil || len(got) != 0 {
		t.Fatalf("check of a sample without it: %v %v", got, err)
	}
	if got, err := s.CheckLeaves(func(l int) bool { return l%16 == leaf%16 }, false); err != nil || !slices.Equal(got, []int{leaf}) {
		t.Fatalf("check of the sample with the edited leaf: %v %v", got, err)
	}
	// Fixed by the check, with a write since the edit: the leaves then
	// say what the tree holds.
	if _, err := s.Set("after", []byte("v"), stampAt(500, "b")); err != nil {
		t.Fatal(err)
	}
	all := func(int) bool { return true }
	if got, err := s.CheckLeaves(all, true); err != nil || !slices.Equal(got, []int{leaf}) {
		t.Fatalf("check of every leaf: %v %v", got, err)
	}
	if now, _ := s.ScanLeaves(); !slices.Equal(s.Leaves(), now) {
		t.Fatal("the fixed leaves differ from a scan")
	}
	if got, err := s.CheckLeaves(all, false); err != nil || len(got) != 0 {
		t.Fatalf("check after the fix: %v %v", got, err)
	}
	if n, err := s.RebuildLeaves(); err != nil || n != 0 {
		t.Fatalf("a rebuild after the fix changed %d leaves (%v)", n, err)
	}
	// A rebuild also sets the live-key count from its scan (a drift of
	// the leaves may come with one of the count).
	want := s.Live()
	s.live.Add(5)
	if _, err := s.RebuildLeaves(); err != nil || s.Live() != want {
		t.Fatalf("after a rebuild the kept live-key count is %d, a scan counts %d (%v)", s.Live(), want, err)
	}
}

// BenchmarkHashedWrites is a tracked batch of 100 fresh keys: the write
// path with the leaves kept (their cost against a build without them is
// measured by replicator bench, docs/PERFORMANCE.md).
func BenchmarkHashedWrites(b *testing.B) {
	s, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	val := make([]byte, 100)
	b.ResetTimer()
	for n := 0; n < b.N; n += 100 {
		bt := s.NewBatch()
		bt.Track(nil)
		for i := 0; i < 100; i++ {
			st := entry.Stamp{HLC: hlc.Timestamp{Wall: int64(n + i + 1)}, Origin: "a"}
			w := Write{Key: fmt.Sprintf("key-%012d", n+i), Value: val, Stamp: st, Local: true}
			if _, err := bt.mergeWrite(&w); err != nil {
				b.Fatal(err)
			}
		}
		if err := bt.Commit(false); err != nil {
			b.Fatal(err)
		}
		bt.Close()
	}
}
