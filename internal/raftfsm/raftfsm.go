// Package raftfsm is a raft state machine that records the commands it
// applies, for the tests of the raft pieces (wal, raftconn, cluster):
// what each node applied, in which order, is the outcome they check.
package raftfsm

import (
	"encoding/json"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// Recorder records every applied command; it snapshots and restores them.
type Recorder struct {
	mu   sync.Mutex
	cmds []string
}

// Apply records the command and returns how many there are.
func (r *Recorder) Apply(l *raft.Log) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmds = append(r.cmds, string(l.Data))
	return len(r.cmds)
}

// Applied is every command applied so far, in order.
func (r *Recorder) Applied() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.cmds...)
}

// Snapshot captures the commands.
func (r *Recorder) Snapshot() (raft.FSMSnapshot, error) {
	b, err := json.Marshal(r.Applied())
	return snapshot(b), err
}

// Restore replaces the commands with a snapshot's.
func (r *Recorder) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var l []string
	if err := json.NewDecoder(rc).Decode(&l); err != nil {
		return err
	}
	r.mu.Lock()
	r.cmds = l
	r.mu.Unlock()
	return nil
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s snapshot) Release() {}
