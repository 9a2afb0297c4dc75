package machine

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/store"
)

// sink is a snapshot sink as package cluster's: it takes a head and adopts
// a checkpoint directory.
type sink struct {
	head []byte
	tree string
	dir  string
	done bool
}

func (s *sink) Write(p []byte) (int, error) { return 0, errors.New("a tree sink takes no bytes") }
func (s *sink) Close() error                { s.done = true; return nil }
func (s *sink) ID() string                  { return "test" }
func (s *sink) Cancel() error               { return nil }
func (s *sink) SetHead(h []byte)            { s.head = h }
func (s *sink) AdoptTree(dir string) error {
	s.tree = filepath.Join(s.dir, "tree")
	return os.Rename(dir, s.tree)
}

// snap is a snapshot as package cluster opens it.
type snap struct {
	io.Reader
	head []byte
	tree string
}

func (s *snap) Close() error    { return nil }
func (s *snap) Head() []byte    { return s.head }
func (s *snap) TreeDir() string { return s.tree }

// TestFSMFromDeps: the FSM is built from its Deps alone. A leader's
// snapshot carries a checkpoint of the tree; a follower that lags behind
// installs it and then holds what the leader held, and is told so through
// Installed; an older snapshot changes nothing; a command the machine
// cannot apply breaks it for good and is reported through Broken.
func TestFSMFromDeps(t *testing.T) {
	leaderM, leaderSt := openMachine(t, t.TempDir())
	defer leaderSt.Close()
	var appliedTo uint64
	leader := NewFSM(Deps{Machine: leaderM, Store: leaderSt, Dir: t.TempDir(), Trees: true,
		Applied: func(i uint64, _ *Result) { appliedTo = i }})
	for i, b := range script(t) {
		if res := leader.Apply(&raft.Log{Index: uint64(i + 1), Data: b}); res == nil {
			t.Fatalf("command %d: no result", i+1)
		} else if err, ok := res.(error); ok {
			t.Fatalf("command %d: %v", i+1, err)
		}
	}
	if appliedTo != leaderM.Applied() {
		t.Fatalf("Applied told %d, the machine applied %d", appliedTo, leaderM.Applied())
	}
	fs, err := leader.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sk := &sink{dir: t.TempDir()}
	if err := fs.Persist(sk); err != nil || !sk.done || sk.tree == "" {
		t.Fatalf("persist: %v (done %v, tree %q)", err, sk.done, sk.tree)
	}
	fs.Release()

	followerM, followerSt := openMachine(t, t.TempDir())
	defer followerSt.Close()
	var installed uint64
	var restoring []bool
	follower := NewFSM(Deps{Machine: followerM, Store: followerSt, Dir: t.TempDir(), Trees: true,
		Restoring: func(on bool) { restoring = append(restoring, on) },
		Installed: func(a uint64) error { installed = a; return nil }})
	if err := follower.Restore(&snap{head: sk.head, tree: sk.tree}); err != nil {
		t.Fatal(err)
	}
	if installed != leaderM.Applied() || followerM.Applied() != leaderM.Applied() || len(restoring) != 2 || !restoring[0] || restoring[1] {
		t.Fatalf("installed %d, applied %d, restoring %v; want %d", installed, followerM.Applied(), restoring, leaderM.Applied())
	}
	dl, _ := leaderSt.Digest()
	df, _ := followerSt.Digest()
	if dl != df {
		t.Fatalf("the follower's tree differs from the leader's:\n%+v\n%+v", df, dl)
	}
	if _, err := os.Stat(RestoringFile(follower.d.Dir)); !os.IsNotExist(err) {
		t.Fatalf("the restoring mark stayed: %v", err)
	}
	// An older snapshot (or the same) changes nothing.
	installed = 0
	if err := follower.Restore(&snap{head: sk.head, tree: sk.tree}); err != nil || installed != 0 {
		t.Fatalf("the same snapshot again: %v, installed %d", err, installed)
	}

	var broken error
	follower.d.Broken = func(err error) { broken = err }
	next := followerM.Applied() + 1
	if res, ok := follower.Apply(&raft.Log{Index: next, Data: []byte{0xff, 0x00}}).(error); !ok || broken == nil {
		t.Fatalf("an undecodable command: %v, broken %v", res, broken)
	}
	good := script(t)[0]
	if _, ok := follower.Apply(&raft.Log{Index: next + 1, Data: good}).(error); !ok || follower.Err() == nil {
		t.Fatal("a broken FSM applied a later command")
	}
	if _, err := follower.Snapshot(); err == nil {
		t.Fatal("a broken FSM took a snapshot")
	}
}

// TestFinishRestore: a stop while a tree replaced the store's is finished
// at the next start, from the tree the mark names.
func TestFinishRestore(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	for i, b := range script(t) {
		if _, err := m.Apply(uint64(i+1), b); err != nil {
			t.Fatal(err)
		}
	}
	tree := filepath.Join(t.TempDir(), "tree")
	if err := st.Checkpoint(tree); err != nil {
		t.Fatal(err)
	}
	want, _ := st.Digest()
	st.Close()
	st2, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	dir := t.TempDir()
	os.WriteFile(RestoringFile(dir), []byte(tree+"\n"), 0o644)
	os.Mkdir(filepath.Join(dir, "checkpoint-1-2"), 0o755)
	if err := FinishRestore(dir, st2, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := st2.Digest(); got != want {
		t.Fatalf("after finishing: %+v, want %+v", got, want)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}
