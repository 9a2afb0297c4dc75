package node

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/wal"
)

// lastCommands reads the commands at the end of a stopped node's raft log.
func lastCommands(t *testing.T, dir string, n int) [][]byte {
	t.Helper()
	rl, err := wal.Open(filepath.Join(dir, "cluster", "raft"), &wal.Options{Logger: quiet})
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
// writes, so its log moves to encoding 2 at its first start; its writes
// then carry proposal IDs naming it, and survive a restart.
func TestNodeAloneProposesWithIDs(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir)
	o.NodeID = "n1"
	n := openNode(t, o)
	if f := n.machine.Format(); f != machine.ReadsFormat {
		t.Fatalf("format %d after open, want %d", f, machine.ReadsFormat)
	}
	for i := 0; i < 5; i++ {
		if _, err := n.Put(context.Background(), fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()
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
	n = openNode(t, testOptions(dir))
	defer n.Close()
	if r, err := n.Get("k4"); err != nil || string(r.Value) != "v" {
		t.Fatalf("after a restart: %v %v", r, err)
	}
}

// TestMixedVersionClusterKeepsEncoding1: while one member runs a build that
// reads command encoding 1 only (a rolling upgrade half done), the leader
// never writes encoding 2, and that member applies every command; once it
// is upgraded, the log moves to encoding 2 and every node applies it. A
// build before encoding 2 is then refused as a new member.
func TestMixedVersionClusterKeepsEncoding1(t *testing.T) {
	c := newRaftCluster(t, "m", 3, func(name string, o *Options) {
		if name == "m3" {
			o.Testing.ReadsFormat = 1
		}
	})
	l := c.leader()
	put := func(through, key string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := c.client(through).Put(context.Background(), key, []byte("v"))
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("put %s through %s: %v", key, through, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i := 0; i < 10; i++ {
		put(c.names[i%3], fmt.Sprint("before/", i))
	}
	time.Sleep(3 * time.Second) // a few rounds of the leader's check
	for _, name := range c.names {
		if f := c.nodes[name].machine.Format(); f != 1 {
			t.Fatalf("%s: format %d while m3 reads encoding 1 only", name, f)
		}
		if err := c.nodes[name].rep.FSM().Err(); err != nil {
			t.Fatalf("%s stopped: %v", name, err)
		}
	}
	c.converged()
	if l == "m3" {
		t.Logf("the old build led")
	}

	// A node of the old build being added holds its admission until the
	// configuration has it: the leader's raise of the format waits for it
	// (else it could check the members without it and commit encoding 2
	// just before it joins).
	ld := c.nodes[c.leader()]
	release, err := ld.rep.AdmitMember(`{"api":"x","replicate":"y","commands":1}`)
	if err != nil {
		t.Fatalf("a build of encoding 1 refused by a log of encoding 1: %v", err)
	}
	raised := make(chan struct{})
	go func() { ld.rep.RaiseFormat(); close(raised) }()
	select {
	case <-raised:
		t.Fatal("the format's raise checked the members while an admission was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	release()
	<-raised

	// m3 is upgraded: restarted on this build.
	c.stop("m3")
	c.opts["m3"].Testing.ReadsFormat = 0
	c.start("m3")
	deadline := time.Now().Add(30 * time.Second)
	for c.nodes[c.leader()].machine.Format() != machine.ReadsFormat {
		if time.Now().After(deadline) {
			t.Fatal("the log did not move to encoding 2 once every member read it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < 10; i++ {
		put(c.names[i%3], fmt.Sprint("after/", i))
	}
	d := c.converged()
	if d.Keys != 20 {
		t.Fatalf("%d keys, want 20", d.Keys)
	}
	for _, name := range c.names {
		if f := c.nodes[name].machine.Format(); f != machine.ReadsFormat {
			t.Fatalf("%s at format %d", name, f)
		}
	}
	ld = c.nodes[c.leader()]
	if _, err := ld.rep.AdmitMember(""); err == nil {
		t.Fatal("a build that describes nothing was admitted to a log of encoding 2")
	}
	if _, err := ld.rep.AdmitMember(`{"api":"x","replicate":"y","commands":1}`); err == nil {
		t.Fatal("a build that reads encoding 1 was admitted to a log of encoding 2")
	}
	release, err = ld.rep.AdmitMember(fmt.Sprintf(`{"api":"x","replicate":"y","commands":%d}`, machine.ReadsFormat))
	if err != nil {
		t.Fatalf("a build of this version refused: %v", err)
	}
	release()
}
