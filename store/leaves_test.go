package store

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// TestKeptLeavesMatchAScan: leaves kept by hashing batches (sets, deletes,
// range deletes, stale and duplicate writes of three origins, several keys a
// batch, batches dropped uncommitted) equal leaves summed afresh from the
// data, after every batch and after a reopen.
func TestKeptLeavesMatchAScan(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Leaves() != nil {
		t.Fatal("leaves kept before they were built")
	}
	if err := s.RebuildLeaves(); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	check := func(when string) {
		t.Helper()
		want, err := s.ScanLeaves()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(s.Leaves(), want) {
			t.Fatalf("%s: the kept leaves differ from a scan", when)
		}
	}
	wall := int64(1000)
	for i := 0; i < 400; i++ {
		b := s.NewBatch()
		b.Hash()
		for j := 0; j < 1+r.IntN(8); j++ {
			wall += int64(r.IntN(3))
			origin := []string{"a", "b", "c"}[r.IntN(3)]
			st := entry.Stamp{HLC: hlc.Timestamp{Wall: wall - int64(r.IntN(20))}, Origin: origin}
			key := fmt.Sprintf("k%03d", r.IntN(60))
			var err error
			switch x := r.IntN(10); {
			case x < 6:
				w := Write{Key: key, Value: []byte(fmt.Sprint(r.IntN(1000))), Stamp: st, Local: origin == "a"}
				_, err = b.mergeWrite(&w)
			case x < 9:
				w := Write{Key: key, Tombstone: true, Stamp: st, Local: origin == "a"}
				_, err = b.mergeWrite(&w)
			default:
				_, _, err = b.MergeRange(RangeTombstone{Start: key, End: key + "5", Stamp: st})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if r.IntN(10) == 0 {
			b.Close() // dropped: nothing of it may stay in the leaves
			check(fmt.Sprint("after dropped batch ", i))
			continue
		}
		if err := b.Commit(false); err != nil {
			t.Fatal(err)
		}
		b.Close()
		check(fmt.Sprint("after batch ", i))
	}
	kept := s.Leaves()
	nonzero := 0
	for _, l := range kept {
		if !l.IsZero() {
			nonzero++
		}
	}
	if nonzero == 0 {
		t.Fatal("no leaf holds anything: the test wrote nothing live")
	}
	s.Close()
	if s, err = Open(dir, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !reflect.DeepEqual(s.Leaves(), kept) {
		t.Fatal("the leaves read at open differ from those kept")
	}
	check("after reopen")

	// A copy taken while the data moved past the saved leaves (as a crash
	// leaves it) keeps none until rebuilt.
	b := s.NewBatch()
	b.Hash()
	if _, err := b.mergeWrite(&Write{Key: "late", Value: []byte("v"), Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: wall + 100}, Origin: "b"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	check("after a write past the saved leaves")
	if err := s.Checkpoint(dir + "-crashed"); err != nil {
		t.Fatal(err)
	}
	c, err := Open(dir+"-crashed", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Leaves() != nil {
		t.Fatal("leaves saved before the last write were taken as the data's")
	}
	if err := c.RebuildLeaves(); err != nil {
		t.Fatal(err)
	}
	if want, _ := s.ScanLeaves(); !reflect.DeepEqual(c.Leaves(), want) {
		t.Fatal("rebuilt leaves differ from the data's")
	}

	// A batch that changes data without keeping the leaves drops them.
	if _, err := s.Set("unhashed", []byte("v"), entry.Stamp{HLC: hlc.Timestamp{Wall: wall + 200}, Origin: "b"}); err != nil {
		t.Fatal(err)
	}
	if s.Leaves() != nil {
		t.Fatal("leaves kept through a write that did not hash")
	}
}

// BenchmarkHashedWrites is a tracked batch of 100 fresh keys, with and
// without the kept leaves (issue 30's budget: at most 10 % of one-way
// throughput).
func BenchmarkHashedWrites(b *testing.B) {
	for _, hash := range []bool{false, true} {
		b.Run(fmt.Sprintf("hash=%v", hash), func(b *testing.B) {
			s, err := Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.RebuildLeaves(); err != nil {
				b.Fatal(err)
			}
			val := make([]byte, 100)
			b.ResetTimer()
			for n := 0; n < b.N; n += 100 {
				bt := s.NewBatch()
				if hash {
					bt.Hash()
				} else {
					bt.Track(nil)
				}
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
		})
	}
}
