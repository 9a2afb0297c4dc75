package store

import (
	"fmt"
	"hash/maphash"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// stampAt is origin's stamp at wall time w.
func stampAt(w int64, origin string) entry.Stamp {
	return entry.Stamp{HLC: hlc.Timestamp{Wall: w}, Origin: origin}
}

// openTemp opens a store in a temporary directory, closed with the test.
func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSeenKeysGrows: every key added is held through the parts' growth,
// and keys never added are mostly answered no.
func TestSeenKeysGrows(t *testing.T) {
	f := &seenKeys{seed: maphash.MakeSeed()}
	f.grow(1 << 14)
	const n = 1 << 18 // sixteen times the first part
	for i := 0; i < n; i++ {
		f.add([]byte(fmt.Sprintf("dkey-%d", i)))
	}
	if len(f.parts) < 3 {
		t.Fatalf("%d parts after %d keys: the filter did not grow", len(f.parts), n)
	}
	for i := 0; i < n; i++ {
		if !f.mayHold([]byte(fmt.Sprintf("dkey-%d", i))) {
			t.Fatalf("key %d added but not held", i)
		}
	}
	fp := 0
	for i := 0; i < 100000; i++ {
		if f.mayHold([]byte(fmt.Sprintf("dother-%d", i))) {
			fp++
		}
	}
	// About 1 % per part.
	if fp > 100000*len(f.parts)*3/200 {
		t.Fatalf("%d of 100000 keys never added are maybe held (%d parts)", fp, len(f.parts))
	}
}

// TestTrackedWriteDescendsFromReopenedAndReplacedTrees: a local write of a
// key stored before the store was reopened, or brought in by ReplaceFrom,
// descends from the stored version (the keys filter was rebuilt; a miss
// would give it a context of its own stamp only), and a fresh key's write
// has only its own stamp.
func TestTrackedWriteDescendsFromReopenedAndReplacedTrees(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if _, err := s.Set(fmt.Sprintf("k%04d", i), []byte("v"), stampAt(int64(10+i), "b")); err != nil {
			t.Fatal(err)
		}
	}
	localWrite := func(s *Store, key string, at entry.Stamp) entry.Context {
		t.Helper()
		b := s.NewBatch()
		defer b.Close()
		b.Track(nil)
		w := Write{Key: key, Value: []byte("new"), Stamp: at, Local: true}
		if out, err := b.mergeWrite(&w); err != nil || out != entry.Applied {
			t.Fatalf("local write of %s: %v %v", key, out, err)
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(key)
		if err != nil || !reflect.DeepEqual(got.Ctx, w.Ctx) {
			t.Fatalf("%s stored with context %v, written with %v (%v)", key, got.Ctx, w.Ctx, err)
		}
		return w.Ctx
	}
	check := func(s *Store, key string, at entry.Stamp, want entry.Context) {
		t.Helper()
		if got := localWrite(s, key, at); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: context %v, want %v", key, got, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(filepath.Join(dir, "a"), nil); err != nil {
		t.Fatal(err)
	}
	check(s, "k0007", stampAt(5000, "a"), entry.Context{{Origin: "a", HLC: stampAt(5000, "a").HLC}, {Origin: "b", HLC: stampAt(17, "b").HLC}})
	check(s, "fresh", stampAt(5001, "a"), entry.Context{{Origin: "a", HLC: stampAt(5001, "a").HLC}})
	// An atomic batch (one stamp): a fresh key, then a stored one, which
	// is still read although the batch's stamp is above the tree's.
	b := s.NewBatch()
	b.Track(nil)
	w1 := Write{Key: "fresh2", Value: []byte("x"), Stamp: stampAt(5002, "a"), Local: true}
	w2 := Write{Key: "k0001", Value: []byte("x"), Stamp: stampAt(5002, "a"), Local: true}
	for _, w := range []*Write{&w1, &w2} {
		if out, err := b.mergeWrite(w); err != nil || out != entry.Applied {
			t.Fatalf("atomic write of %s: %v %v", w.Key, out, err)
		}
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if want := (entry.Context{{Origin: "a", HLC: stampAt(5002, "a").HLC}, {Origin: "b", HLC: stampAt(11, "b").HLC}}); !reflect.DeepEqual(w2.Ctx, want) {
		t.Fatalf("atomic batch: k0001's context %v, want %v", w2.Ctx, want)
	}
	if err := s.Checkpoint(filepath.Join(dir, "cp")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	r, err := Open(filepath.Join(dir, "r"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	check(r, "other", stampAt(100, "c"), entry.Context{{Origin: "c", HLC: stampAt(100, "c").HLC}})
	if err := r.ReplaceFrom(filepath.Join(dir, "cp")); err != nil {
		t.Fatal(err)
	}
	check(r, "k0999", stampAt(6000, "c"), entry.Context{{Origin: "b", HLC: stampAt(1009, "b").HLC}, {Origin: "c", HLC: stampAt(6000, "c").HLC}})
	check(r, "fresh", stampAt(6001, "c"), entry.Context{{Origin: "a", HLC: stampAt(5001, "a").HLC}, {Origin: "c", HLC: stampAt(6001, "c").HLC}})
}

// TestTrackedFreshKeyBelowTheTree: a key the tree never held, written
// below the tree's max stamp (a peer's older write, or writers whose stamps
// reach the log out of order), is not read but still loses to a newer range
// delete over it, and otherwise lands.
func TestTrackedFreshKeyBelowTheTree(t *testing.T) {
	s := openTemp(t)
	b := s.NewBatch()
	b.Track(nil)
	if _, _, err := b.MergeRange(RangeTombstone{Start: "r", End: "s", Stamp: stampAt(700, "a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.mergeWrite(&Write{Key: "top", Value: []byte("v"), Stamp: stampAt(900, "a"), Local: true}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		at   entry.Stamp
		want entry.Outcome
	}{{"r1", stampAt(650, "b"), entry.Stale}, {"r2", stampAt(750, "b"), entry.Applied}, {"q", stampAt(10, "b"), entry.Applied}} {
		w := Write{Key: tc.key, Value: []byte("old"), Stamp: tc.at, Ctx: entry.Context{{Origin: "b", HLC: tc.at.HLC}}}
		if out, err := b.mergeWrite(&w); err != nil || out != tc.want {
			t.Fatalf("%s at %v: %v %v, want %v", tc.key, tc.at, out, err, tc.want)
		}
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if r, err := s.Get("q"); err != nil || string(r.Value) != "old" {
		t.Fatalf("q: %+v %v", r, err)
	}
	if r, err := s.Get("r1"); err == nil && !r.Tombstone {
		t.Fatalf("r1 under a newer range delete: %+v", r)
	}
}

// BenchmarkOpenScansKeys is what the keys filter adds to opening a store:
// one pass over the data keys (compare BenchmarkOpenScansKeys/keys=0).
func BenchmarkOpenScansKeys(b *testing.B) {
	for _, n := range []int{0, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			s, err := Open(dir, nil)
			if err != nil {
				b.Fatal(err)
			}
			val := make([]byte, 100)
			for i := 0; i < n; {
				bt := s.NewBatch()
				for j := 0; j < 10000 && i < n; j, i = j+1, i+1 {
					st := entry.Stamp{HLC: hlc.Timestamp{Wall: int64(i + 1)}, Origin: "a"}
					if _, err := bt.Merge(Write{Key: fmt.Sprintf("key-%012d", i), Value: val, Stamp: st}); err != nil {
						b.Fatal(err)
					}
				}
				if err := bt.Commit(false); err != nil {
					b.Fatal(err)
				}
				bt.Close()
			}
			s.Close()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s, err := Open(dir, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				s.Close()
				b.StartTimer()
			}
		})
	}
}

// TestTrackedWriteSeesThisProcessWrites: keys written since the store
// opened, by a batch that tracked versions or by one before the log kept
// contexts (format 3, then 4 in the same process), are read by the next
// tracked write, which descends from them.
func TestTrackedWriteSeesThisProcessWrites(t *testing.T) {
	s := openTemp(t)
	if _, err := s.Set("untracked", []byte("v"), stampAt(10, "b")); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	b.Track(nil)
	if _, err := b.mergeWrite(&Write{Key: "tracked", Value: []byte("v"), Stamp: stampAt(20, "b"), Ctx: entry.Context{{Origin: "b", HLC: stampAt(20, "b").HLC}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	for _, tc := range []struct {
		key  string
		prev entry.Stamp
	}{{"untracked", stampAt(10, "b")}, {"tracked", stampAt(20, "b")}} {
		b := s.NewBatch()
		b.Track(nil)
		w := Write{Key: tc.key, Value: []byte("new"), Stamp: stampAt(100, "a"), Local: true}
		if _, err := b.mergeWrite(&w); err != nil {
			t.Fatal(err)
		}
		b.Close()
		want := entry.Context{{Origin: "a", HLC: stampAt(100, "a").HLC}, {Origin: "b", HLC: tc.prev.HLC}}
		if !reflect.DeepEqual(w.Ctx, want) {
			t.Fatalf("%s: context %v, want %v (the write did not see the stored version)", tc.key, w.Ctx, want)
		}
	}
}
