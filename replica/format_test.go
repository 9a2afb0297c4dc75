package replica

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/wal"
)

// lastCommands reads the commands at the end of a closed replica's raft log.
func lastCommands(t *testing.T, dir string, n int) [][]byte {
	t.Helper()
	rl, err := wal.Open(filepath.Join(dir, "cluster", "raft"), &wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	first, _ := rl.FirstIndex()
	last, _ := rl.LastIndex()
	var out [][]byte
	for i := last; i >= first && len(out) < n; i-- {
		var l raft.Log
		if err := rl.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type == raft.LogCommand {
			out = append(out, l.Data)
		}
	}
	return out
}

// TestNodeAloneProposesWithIDs: a node alone reads every encoding it
// writes, so its log moves to the newest at its first open; its writes
// then carry proposal IDs naming it, and survive a reopen.
func TestNodeAloneProposesWithIDs(t *testing.T) {
	dir := t.TempDir()
	r := openAndRun(t, dir)
	if f := r.Machine().Format(); f != machine.ReadsFormat {
		t.Fatalf("format %d after open, want %d", f, machine.ReadsFormat)
	}
	for i := 0; i < 5; i++ {
		put(t, r, fmt.Sprint("k", i), "v")
	}
	closeReplica(r)
	var seqs []uint64
	for _, data := range lastCommands(t, dir, 5) {
		id, ok := machine.PeekID(data)
		if !ok || id.Node != "n1" {
			t.Fatalf("a write's command without this node's proposal id: %v %v", id, ok)
		}
		seqs = append(seqs, id.Seq)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] >= seqs[i-1] {
			t.Fatalf("proposal sequence does not grow: %v (newest first)", seqs)
		}
	}
	r = openAndRun(t, dir)
	defer closeReplica(r)
	if rec, err := r.d.Store.Get("k4"); err != nil || string(rec.Value) != "v" {
		t.Fatalf("after a reopen: %v %v", rec, err)
	}
}

// TestAdmissionHoldsTheFormatRaise: a node being added holds its admission
// until the configuration has it, and the leader's raise of the format
// waits for it (else it could check the members without it and commit an
// encoding the newcomer cannot read just before it joins): the admission
// holds the lock RaiseFormat takes from its check of the members to its
// commit. Once the log moved to the newest encoding, a build that describes
// nothing or reads encoding 1 only is refused as a member, and this build
// is admitted.
func TestAdmissionHoldsTheFormatRaise(t *testing.T) {
	n := openAndRun(t, t.TempDir())
	defer closeReplica(n)
	if f := n.Machine().Format(); f != machine.ReadsFormat {
		t.Fatalf("format %d, want %d", f, machine.ReadsFormat)
	}
	if _, err := n.AdmitMember(""); err == nil {
		t.Fatal("a build that describes nothing was admitted to a log of the newest encoding")
	}
	if _, err := n.AdmitMember(`{"api":"x","replicate":"y","commands":1}`); err == nil {
		t.Fatal("a build that reads encoding 1 was admitted to a log of the newest encoding")
	}
	release, err := n.AdmitMember(fmt.Sprintf(`{"api":"x","replicate":"y","commands":%d}`, machine.ReadsFormat))
	if err != nil {
		t.Fatalf("a build of this version refused: %v", err)
	}
	if n.formatMu.TryLock() {
		t.Fatal("an admission in flight does not hold the format raise's lock")
	}
	release()
	if !n.formatMu.TryLock() {
		t.Fatal("a released admission still holds the format raise's lock")
	}
	n.formatMu.Unlock()
}
