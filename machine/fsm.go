package machine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/atomicfile"
	"github.com/replicator/replicator/store"
)

// The state machine as raft sees it (docs/CLUSTER.md): a node alone is a
// raft group of one, so a single node and a node of a larger cluster run one
// write path. The raft log (package wal, fsynced) is the redo log; the
// machine applies each command into one Pebble batch that records the log
// index it applied. The FSM is built from its Deps, as Consul's fsm is:
// functions and values, never the node, so it can be built and tested alone.

// Deps is what the FSM needs besides the machine.
type Deps struct {
	// Machine applies the commands; Store is the tree it applies them to.
	Machine *Machine
	Store   *store.Store
	// Dir is the group's directory: snapshots' checkpoints are cut there,
	// and a tree being installed is recorded there (RestoringFile).
	Dir string
	// Trees: a snapshot carries a checkpoint of the whole tree, which the
	// leader sends a follower that lags behind its log (a cluster of
	// several). A node alone needs none: nobody follows it, and the tree
	// in place is its snapshot.
	Trees bool
	// Proposed returns the command this node built for data, if it is this
	// node's own proposal (the leader applies what it built instead of
	// decoding its bytes again); nil otherwise.
	Proposed func(data []byte) *Command
	// Applied is told of every command applied, with the machine's result.
	Applied func(index uint64, res *Result)
	// Broken is told of the first command the machine could not apply.
	Broken func(err error)
	// Restoring is told when a snapshot's tree starts and stops replacing
	// the store's (local reads wait meanwhile).
	Restoring func(bool)
	// Installed is told once a snapshot's tree replaced the store's, with
	// the index it applied.
	Installed func(applied uint64) error
	Logger    *slog.Logger
}

// FSM is the raft.FSM of a cluster's group.
type FSM struct {
	d Deps
	// broken is set at the first command the machine could not apply:
	// every later command assumes it, so none is applied until a restart
	// replays the log from the machine's applied index.
	broken atomic.Pointer[error]
}

// NewFSM builds the FSM from its dependencies; nil functions do nothing.
func NewFSM(d Deps) *FSM {
	if d.Proposed == nil {
		d.Proposed = func([]byte) *Command { return nil }
	}
	if d.Applied == nil {
		d.Applied = func(uint64, *Result) {}
	}
	if d.Broken == nil {
		d.Broken = func(error) {}
	}
	if d.Restoring == nil {
		d.Restoring = func(bool) {}
	}
	if d.Installed == nil {
		d.Installed = func(uint64) error { return nil }
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &FSM{d: d}
}

// Err is the error that stopped the machine, or nil.
func (f *FSM) Err() error {
	if errp := f.broken.Load(); errp != nil {
		return *errp
	}
	return nil
}

// Break stops the machine with err unless it is stopped already (the node
// halts: nothing may be applied past a fatal error).
func (f *FSM) Break(err error) { f.broken.CompareAndSwap(nil, &err) }

// Apply applies one committed command. It returns the *Result, or the error
// that stopped the machine.
func (f *FSM) Apply(l *raft.Log) any {
	if errp := f.broken.Load(); errp != nil {
		return *errp
	}
	var res *Result
	var err error
	if c := f.d.Proposed(l.Data); c != nil {
		res, err = f.d.Machine.ApplyCommand(l.Index, c)
	} else {
		res, err = f.d.Machine.Apply(l.Index, l.Data)
	}
	if err != nil {
		f.broken.Store(&err)
		f.d.Broken(fmt.Errorf("apply log entry %d: %w", l.Index, err))
		return err
	}
	f.d.Applied(l.Index, res)
	return res
}

// SnapshotHead is a snapshot's head: the last command the tree applied when
// it was taken, and whether a checkpoint of the tree comes with it.
type SnapshotHead struct {
	Format  string `json:"format"`
	Applied uint64 `json:"applied"`
	Tree    bool   `json:"tree,omitempty"`
}

const snapshotFormat = "replicator-machine/0"

// DecodeSnapshotHead reads a snapshot's head as Persist wrote it.
func DecodeSnapshotHead(b []byte) (SnapshotHead, error) {
	var h SnapshotHead
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&h); err != nil || h.Format != snapshotFormat {
		return h, fmt.Errorf("machine: not a snapshot this build reads (%v)", err)
	}
	return h, nil
}

// treeSink is the snapshot sink of package cluster: it takes a head and a
// checkpoint directory instead of a byte stream.
type treeSink interface {
	raft.SnapshotSink
	SetHead(head []byte)
	AdoptTree(dir string) error
}

// treeSnapshot is a snapshot package cluster opened: its head and tree.
type treeSnapshot interface {
	Head() []byte
	TreeDir() string
}

// snapshot is a snapshot taken: its head, and the checkpoint directory
// (empty for a node alone) that Persist hands to the sink.
type snapshot struct {
	head SnapshotHead
	dir  string
}

// Snapshot makes the tree durable through the last command applied, so that
// raft may then drop the log before it: the tree, not the log, holds it.
// With Trees it takes a checkpoint of the tree (hard links, on the FSM's
// goroutine so that it holds exactly what was applied).
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	if errp := f.broken.Load(); errp != nil {
		return nil, *errp
	}
	s := &snapshot{head: SnapshotHead{Format: snapshotFormat, Applied: f.d.Machine.Applied()}}
	if !f.d.Trees {
		return s, f.d.Store.Sync()
	}
	s.head.Tree = true
	s.dir = filepath.Join(f.d.Dir, fmt.Sprintf("checkpoint-%d-%d", s.head.Applied, time.Now().UnixNano()))
	if err := f.d.Store.Checkpoint(s.dir); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

// Persist hands the snapshot's head and checkpoint to the sink.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	head, err := json.Marshal(s.head)
	if err != nil {
		sink.Cancel()
		return err
	}
	head = append(head, '\n')
	tsink, ok := sink.(treeSink)
	if !ok {
		sink.Cancel()
		return fmt.Errorf("machine: snapshot: a sink of %T cannot take a tree", sink)
	}
	tsink.SetHead(head)
	if s.dir != "" {
		if err := tsink.AdoptTree(s.dir); err != nil {
			sink.Cancel()
			return err
		}
		s.dir = ""
	}
	return sink.Close()
}

// Release drops a checkpoint that was not persisted.
func (s *snapshot) Release() {
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// Restore installs a snapshot: one the tree already holds changes nothing;
// a newer one (the leader's, sent because this node lagged behind its log)
// replaces the tree with the snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	inner := io.ReadCloser(rc)
	for {
		w, ok := inner.(raft.ReadCloserWrapper) // raft counts what is read
		if !ok {
			break
		}
		inner = w.WrappedReadCloser()
	}
	ts, isTree := inner.(treeSnapshot)
	var head []byte
	if isTree {
		head = ts.Head()
	} else {
		b, err := io.ReadAll(io.LimitReader(rc, 1<<20))
		if err != nil {
			return fmt.Errorf("machine: restore: %w", err)
		}
		head = b
	}
	h, err := DecodeSnapshotHead(head)
	if err != nil {
		return fmt.Errorf("machine: restore: %w", err)
	}
	if h.Applied <= f.d.Machine.Applied() {
		return nil
	}
	if !h.Tree || !isTree || ts.TreeDir() == "" {
		return fmt.Errorf("machine: restore: the tree applied up to %d, the snapshot holds %d and no tree to install", f.d.Machine.Applied(), h.Applied)
	}
	return f.InstallTree(ts.TreeDir(), h.Applied)
}

// RestoringFile names, while a snapshot's tree replaces the store's, the
// tree being installed: a crash halfway leaves a mix, which the next start
// replaces again (FinishRestore) before anything reads it.
func RestoringFile(dir string) string { return filepath.Join(dir, "RESTORING") }

// InstallTree replaces the store's tree with a snapshot's checkpoint at
// tree, which applied the log up to applied. It runs on the FSM's goroutine
// (nothing applies meanwhile), or before raft starts.
func (f *FSM) InstallTree(tree string, applied uint64) error {
	start := time.Now()
	f.d.Restoring(true)
	defer f.d.Restoring(false)
	if err := atomicfile.Write(RestoringFile(f.d.Dir), []byte(tree+"\n")); err != nil {
		return fmt.Errorf("machine: restore: %w", err)
	}
	if err := f.d.Store.ReplaceFrom(tree); err != nil {
		return fmt.Errorf("machine: restore: %w", err)
	}
	if err := f.d.Machine.Reload(); err != nil {
		return fmt.Errorf("machine: restore: %w", err)
	}
	if got := f.d.Machine.Applied(); got != applied {
		return fmt.Errorf("machine: restore: %w: the snapshot's tree applied %d, its head says %d", store.ErrCorrupt, got, applied)
	}
	if err := os.Remove(RestoringFile(f.d.Dir)); err != nil {
		return fmt.Errorf("machine: restore: %w", err)
	}
	if err := atomicfile.SyncDir(f.d.Dir); err != nil {
		return fmt.Errorf("machine: restore: %w", err)
	}
	if err := f.d.Installed(applied); err != nil {
		return err
	}
	f.d.Logger.Warn("installed a snapshot of the cluster's tree: this node lagged behind the log", "applied", applied,
		"stream", f.d.Machine.Stream(), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// FinishRestore completes a tree replacement a crash interrupted, before
// the machine reads the tree, and drops the checkpoints a stop left between
// a snapshot and its persisting (their hard links would keep old tables on
// disk).
func FinishRestore(dir string, st *store.Store, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := finishRestore(dir, st, log); err != nil {
		return err
	}
	ms, _ := filepath.Glob(filepath.Join(dir, "checkpoint-*"))
	for _, m := range ms {
		if err := os.RemoveAll(m); err != nil {
			log.Warn("removing a checkpoint left by a stop", "dir", m, "err", err)
		}
	}
	return nil
}

func finishRestore(dir string, st *store.Store, log *slog.Logger) error {
	b, err := os.ReadFile(RestoringFile(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("machine: %w", err)
	}
	tree := strings.TrimSpace(string(b))
	if _, err := os.Stat(tree); err != nil {
		return fmt.Errorf("machine: a snapshot's tree was being installed from %s when the node stopped, and it is gone (%v): "+
			"the store is a mix; set this data directory aside and start the node with an empty one (a node of several comes back as a new incarnation "+
			"and catches up from the leader)", tree, err)
	}
	log.Warn("finishing the installation of a snapshot's tree a stop interrupted", "from", tree)
	if err := st.ReplaceFrom(tree); err != nil {
		return fmt.Errorf("machine: finish a restore: %w", err)
	}
	if err := os.Remove(RestoringFile(dir)); err != nil {
		return err
	}
	return atomicfile.SyncDir(dir)
}
