package store

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// localWrite writes key as this cluster (a) does, in a tracked batch, and
// returns the context the write was given: what the tree held for it.
func localWrite(t *testing.T, s *Store, key string, wall int64, tomb bool) entry.Context {
	t.Helper()
	b := s.NewBatch()
	defer b.Close()
	b.Track(nil)
	w := Write{Key: key, Value: []byte("v"), Tombstone: tomb, Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: wall}, Origin: "a"}, Local: true}
	if _, err := b.mergeWrite(&w); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(false); err != nil {
		t.Fatal(err)
	}
	return w.Ctx
}

// peerWrite merges cluster b's write of key, as an inbound batch does.
func peerWrite(t *testing.T, s *Store, key string, wall int64, tomb bool) {
	t.Helper()
	b := s.NewBatch()
	defer b.Close()
	b.Track(nil)
	ts := hlc.Timestamp{Wall: wall}
	w := Write{Key: key, Value: []byte("b"), Tombstone: tomb, Stamp: entry.Stamp{HLC: ts, Origin: "b"}, Ctx: entry.Context{{Origin: "b", HLC: ts}}}
	if _, err := b.mergeWrite(&w); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
}

// TestVersionCacheForgetsWhatLeaves: a record that leaves the tree by a way
// other than a merge (collection, a backfill's drop, a replaced tree, a
// write beneath) is not answered from the cache afterwards: the next local
// write's context is what the tree holds then, as without the cache.
func TestVersionCacheForgetsWhatLeaves(t *testing.T) {
	ts := func(w int64) entry.ContextItem { return entry.ContextItem{Origin: "a", HLC: hlc.Timestamp{Wall: w}} }
	t.Run("collected tombstone", func(t *testing.T) {
		s := openTest(t)
		peerWrite(t, s, "k", 90, false) // the second version is cached
		peerWrite(t, s, "k", 100, true)
		if n, err := s.CollectTombstones(hlc.Timestamp{Wall: 200}, 0); err != nil || n != 1 {
			t.Fatalf("collected %d, %v", n, err)
		}
		if ctx := localWrite(t, s, "k", 300, false); !reflect.DeepEqual(ctx, entry.Context{ts(300)}) {
			t.Fatalf("context %v: the collected tombstone was answered from the cache", ctx)
		}
	})
	t.Run("backfill drop", func(t *testing.T) {
		s := openTest(t)
		peerWrite(t, s, "k", 90, false)
		peerWrite(t, s, "k", 100, false)
		if st := s.VersionCacheStats(); st.Keys != 1 {
			t.Fatalf("cache holds %d keys, want the one merged", st.Keys)
		}
		b := s.NewBatch()
		if n, err := b.DropUncarried("b", "a", "", "", hlc.Timestamp{Wall: 200}); err != nil || n != 1 {
			t.Fatalf("dropped %d, %v", n, err)
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
		b.Close()
		if ctx := localWrite(t, s, "k", 300, false); !reflect.DeepEqual(ctx, entry.Context{ts(300)}) {
			t.Fatalf("context %v: the dropped version was answered from the cache", ctx)
		}
	})
	t.Run("replaced tree", func(t *testing.T) {
		src := openTest(t)
		peerWrite(t, src, "k", 50, false)
		dir := filepath.Join(t.TempDir(), "cp")
		if err := src.Checkpoint(dir); err != nil {
			t.Fatal(err)
		}
		s := openTest(t)
		localWrite(t, s, "k", 90, false)
		localWrite(t, s, "k", 100, false)
		if err := s.ReplaceFrom(dir); err != nil {
			t.Fatal(err)
		}
		want := entry.Context{ts(300), {Origin: "b", HLC: hlc.Timestamp{Wall: 50}}}
		if ctx := localWrite(t, s, "k", 300, false); !reflect.DeepEqual(ctx, want) {
			t.Fatalf("context %v, want %v over the copied b:50", ctx, want)
		}
	})
	t.Run("written beneath", func(t *testing.T) {
		s := openTest(t)
		localWrite(t, s, "k", 90, false)
		localWrite(t, s, "k", 100, false)
		if err := s.WriteBeneath("k", &Record{Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: 150}, Origin: "c"}, Value: []byte("c")}); err != nil {
			t.Fatal(err)
		}
		want := entry.Context{{Origin: "a", HLC: hlc.Timestamp{Wall: 300}}, {Origin: "c", HLC: hlc.Timestamp{Wall: 150}}}
		if ctx := localWrite(t, s, "k", 300, false); !reflect.DeepEqual(ctx, want) {
			t.Fatalf("context %v, want %v: the version beneath was not read", ctx, want)
		}
	})
	t.Run("hit", func(t *testing.T) {
		s := openTest(t)
		localWrite(t, s, "k", 100, false) // a fresh key: not read, not cached
		localWrite(t, s, "k", 200, false) // read, and cached
		localWrite(t, s, "k", 300, false)
		if st := s.VersionCacheStats(); st.Hits != 1 || st.Misses != 1 || st.Keys != 1 {
			t.Fatalf("stats %+v, want the third write answered by the cache", st)
		}
	})
}
