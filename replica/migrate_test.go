package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/legacywal"
	"github.com/replicator/replicator/store"
)

// TestMigrateWALInPlace opens a data directory as a build before the
// cluster's log left it (a WAL whose first entries were shipped and cut,
// whose last ones the store never applied) and checks that the node keeps
// its stream: every entry applied, the unshipped ones readable for the
// shippers byte for byte, and the next write numbered after the last.
func TestMigrateWALInPlace(t *testing.T) {
	dir := t.TempDir()
	// The old directory's WAL (made by legacywal's TestOldDirectoryFixture):
	// these ten writes, the first two shipped and cut.
	if err := os.CopyFS(filepath.Join(dir, "wal"), os.DirFS("testdata/legacy-wal")); err != nil {
		t.Fatal(err)
	}
	var ents []*entry.Entry
	for i := 0; i < 10; i++ {
		ents = append(ents, &entry.Entry{Commit: hlc.Timestamp{Wall: 1_764_000_000_000_000_000 + int64(i)}, Op: entry.OpSet,
			Key: fmt.Sprintf("k%d", i), Value: []byte("old")})
	}
	l, err := legacywal.Open(filepath.Join(dir, "wal"), &legacywal.Options{Origin: "a", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stream := l.Stream()
	var raws [][]byte
	for i := uint64(3); i <= 10; i++ {
		raw, err := l.ReadRaw(i)
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, bytes.Clone(raw))
	}
	l.Close()
	// The old build's store applied the first six.
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := st.NewBatch()
	for i, e := range ents[:6] {
		e.Index, e.Origin, e.Stream = uint64(i+1), "a", stream
		if _, err := b.ApplyEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetLocalApplied(store.AppliedIndex{Stream: stream, Index: 6, Commit: ents[5].Commit}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	st.Close()

	for start := 0; start < 3; start++ {
		n := openAndRun(t, dir)
		// The first start writes nothing (a node stopped right after its
		// migration), the second writes once.
		want := uint64(10)
		if start == 2 {
			want = 11
		}
		if n.Stream().Stream() != stream || n.Stream().First() != 3 || n.Stream().Last() != want {
			t.Fatalf("start %d: stream %s [%d, %d], want %s [3, %d]", start, n.Stream().Stream(), n.Stream().First(), n.Stream().Last(), stream, want)
		}
		for i := uint64(3); i <= 10; i++ {
			raw, err := n.Stream().ReadRaw(i)
			if err != nil || !bytes.Equal(raw, raws[i-3]) {
				t.Fatalf("start %d: entry %d differs from the WAL's: %v", start, i, err)
			}
		}
		for i := 0; i < 10; i++ {
			if r, err := n.d.Store.Get(fmt.Sprintf("k%d", i)); err != nil || string(r.Value) != "old" {
				t.Fatalf("start %d: k%d = %q %v", start, i, r.Value, err)
			}
		}
		if start == 1 {
			res, err := putErr(n, "new", "v")
			if err != nil || res.Index != 11 {
				t.Fatalf("first write after the migration: index %d, %v", res.Index, err)
			}
			st, _ := entry.ParseStamp(res.Version)
			if !ents[9].Commit.Less(st.HLC) {
				t.Fatalf("stamped %s, not above the WAL's last commit %s", st.HLC, ents[9].Commit)
			}
		}
		closeReplica(n)
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); !os.IsNotExist(err) {
		t.Fatalf("the WAL is still in place: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "wal.migrated-"+stream.String())); err != nil {
		t.Fatalf("the migrated WAL is not kept: %v", err)
	}
}

// TestLostRaftDirectoryStartsNewStream: a node whose raft directory is gone
// (wiped, or set aside after damage) keeps everything its tree applied, but
// commands after that may have been shipped and lost with the log: it
// starts a new log and a new stream, so no index means two writes.
func TestLostRaftDirectoryStartsNewStream(t *testing.T) {
	dir := t.TempDir()
	n := openAndRun(t, dir)
	for i := 0; i < 5; i++ {
		if _, err := putErr(n, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	stream := n.Stream().Stream()
	closeReplica(n)
	if err := os.RemoveAll(filepath.Join(dir, "cluster")); err != nil {
		t.Fatal(err)
	}
	n = openAndRun(t, dir)
	defer closeReplica(n)
	res, err := putErr(n, "after", "v")
	if err != nil || res.Index != 1 || n.Stream().Stream() == stream || n.Stream().Stream().IsZero() {
		t.Fatalf("after the raft directory was lost: index %d on %s (%v), want 1 on a stream other than %s", res.Index, n.Stream().Stream(), err, stream)
	}
	for i := 0; i < 5; i++ {
		if _, err := n.d.Store.Get(fmt.Sprintf("k%d", i)); err != nil {
			t.Fatalf("k%d: %v", i, err)
		}
	}
}

// TestTreeBehindSnapshot: a tree older than the raft log's snapshot (the
// store directory restored alone from a backup) lacks committed commands.
// While the log still holds them, the node applies them from it and the
// stream goes on; once the log was compacted past them, their entries may
// have been shipped and the node must not number writes with their indexes
// again: it sets the raft directory aside and starts a new stream.
func TestTreeBehindSnapshot(t *testing.T) {
	for _, compacted := range []bool{false, true} {
		t.Run(fmt.Sprintf("compacted=%v", compacted), func(t *testing.T) {
			dir := t.TempDir()
			n := openAndRun(t, dir)
			if _, err := putErr(n, "early", "v"); err != nil {
				t.Fatal(err)
			}
			old := n.Stream().Stream()
			closeReplica(n)
			backup := filepath.Join(t.TempDir(), "store")
			if err := os.CopyFS(backup, os.DirFS(filepath.Join(dir, "store"))); err != nil {
				t.Fatal(err)
			}
			n = openAndRun(t, dir)
			late := 5
			if compacted {
				late = 300 // past the 128 commands a solo group's log keeps
			}
			for i := 0; i < late; i++ {
				if _, err := putErr(n, fmt.Sprintf("late%d", i), "v"); err != nil {
					t.Fatal(err)
				}
			}
			if err := n.Group().Snapshot(); err != nil {
				t.Fatal(err)
			}
			closeReplica(n)
			if err := os.RemoveAll(filepath.Join(dir, "store")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(backup, filepath.Join(dir, "store")); err != nil {
				t.Fatal(err)
			}
			n = openAndRun(t, dir)
			defer closeReplica(n)
			res, err := putErr(n, "after", "v")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := n.d.Store.Get("early"); err != nil {
				t.Fatalf("the restored tree's write: %v", err)
			}
			aside, _ := filepath.Glob(filepath.Join(dir, "cluster.lost-*"))
			if !compacted {
				if n.Stream().Stream() != old || res.Index != uint64(late+2) || len(aside) != 0 {
					t.Fatalf("stream %s index %d (set aside %v), want %s index %d", n.Stream().Stream(), res.Index, aside, old, late+2)
				}
				for i := 0; i < late; i++ {
					if _, err := n.d.Store.Get(fmt.Sprintf("late%d", i)); err != nil {
						t.Fatalf("late%d not applied from the log: %v", i, err)
					}
				}
				return
			}
			if n.Stream().Stream() == old || res.Index != 1 || len(aside) != 1 {
				t.Fatalf("stream %s (old %s), index %d, set aside %v: want a new stream from index 1", n.Stream().Stream(), old, res.Index, aside)
			}
		})
	}
}

// TestOldDirectoryWithoutWALStartsNewStream: a data directory of a build
// before the log whose WAL is gone (moved away, or lost) may have shipped
// entries past what its store applied: the node begins a new stream, as
// that build did.
func TestOldDirectoryWithoutWALStartsNewStream(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	old := entry.NewStreamID()
	e := entry.Entry{Index: 1, Origin: "a", Stream: old, Commit: hlc.Timestamp{Wall: time.Now().UnixNano()}, Op: entry.OpSet, Key: "k", Value: []byte("v")}
	b := st.NewBatch()
	if _, err := b.ApplyEntry(&e); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(b.SetLocalApplied(store.AppliedIndex{Stream: old, Index: 1, Commit: e.Commit}), b.Commit(true)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	st.Close()
	n := openAndRun(t, dir)
	defer closeReplica(n)
	if n.Stream().Stream() == old {
		t.Fatal("the stream went on without its WAL")
	}
	res, err := putErr(n, "new", "v")
	if err != nil || res.Index != 1 {
		t.Fatalf("first write: index %d, %v", res.Index, err)
	}
	if r, err := n.d.Store.Get("k"); err != nil || string(r.Value) != "v" {
		t.Fatalf("the store's write: %v", err)
	}
}

// openAndRun opens a node alone's replica on dir and runs its only term,
// as a node's start does.
func openAndRun(t *testing.T, dir string) *Replica {
	t.Helper()
	r, _ := openReplica(t, dir, &events{}, nil)
	r.Run()
	return r
}

// closeReplica stops r and closes what it holds, as a node's close does.
func closeReplica(r *Replica) {
	r.Stop()
	closers[r]()
}

// putErr writes key through the submitter and returns its outcome.
func putErr(r *Replica, key, value string) (api.WriteResult, error) {
	b := &Bounds{MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, MaxReplicateBytes: 16 << 20, PinWindow: time.Hour,
		Clock: r.d.Clock, Peers: func() []PeerLimits { return nil }}
	sub := &Submitter{Bounds: b, Com: r.Committer(), Admit: func(context.Context) error { return nil }}
	return sub.Submit(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: []byte(value)}})()
}
