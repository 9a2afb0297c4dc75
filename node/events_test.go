package node

// Operator events (issue 12): each test is named for the event it
// reproduces, and asserts the outcome an operator relies on.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// TestUnlinkedPeerHoldsTombstones (event 5): a peer configured by secret
// only (no URL yet) can send writes, so it holds back tombstone collection
// like a linked one: an older write from it must not resurrect a key.
func TestUnlinkedPeerHoldsTombstones(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	o := testOptions(t.TempDir())
	o.Clock = pc
	o.TombstoneRetention = 10 * time.Minute
	o.PinWindow = time.Minute
	o.Peers = []Peer{{Name: "b", Secret: "s"}}
	o.Gossip = &GossipOptions{Bind: "127.0.0.1:0"} // the URL would come by gossip; never started here
	n := openNode(t, o)
	defer n.Close()
	ctx := context.Background()
	if _, err := n.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	pc.Advance(time.Second)
	old := pc.Now()
	pc.Advance(time.Second)
	if _, err := n.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	pc.Advance(20 * time.Minute)
	if c, err := n.CollectTombstones(); err != nil || c != 0 {
		t.Fatalf("collected %d tombstones (%v) while b, which may write, sent nothing yet", c, err)
	}
	// b's older write arrives: it loses to the tombstone.
	e := entry.Entry{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: hlc.Timestamp{Wall: old}, Op: entry.OpSet, Key: "k", Value: []byte("old")}
	e.Stamp = e.Commit
	if _, err := n.acceptor.Apply("b", &wire.Batch{Header: wire.Header{Sender: "b", Stream: e.Stream}, Entries: []entry.Entry{e}}); err != nil {
		t.Fatal(err)
	}
	if r, err := n.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("b's older write resurrected k: %q %v", r.Value, err)
	}
}

// TestDeadLetterHoldsTombstones: a dead letter is a write that can still be
// replayed; tombstones it could shadow are kept until it is replayed or
// discarded, so a replay cannot bring a deleted key back.
func TestDeadLetterHoldsTombstones(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	o := testOptions(t.TempDir())
	o.Clock = pc
	o.TombstoneRetention = 10 * time.Minute
	o.PinWindow = time.Minute
	o.MaxValueBytes = 16
	o.Peers = []Peer{{Name: "b", Secret: "s"}}
	o.Gossip = &GossipOptions{Bind: "127.0.0.1:0"}
	n := openNode(t, o)
	defer n.Close()
	ctx := context.Background()
	old := hlc.Timestamp{Wall: pc.Now()}
	e := entry.Entry{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: old, Stamp: old, Op: entry.OpSet, Key: "k", Value: make([]byte, 64)}
	if _, err := n.acceptor.Apply("b", &wire.Batch{Header: wire.Header{Sender: "b", Stream: e.Stream}, Entries: []entry.Entry{e}}); err != nil {
		t.Fatal(err)
	}
	dl, err := n.dead.DeadLetters()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters: %+v %v", dl, err)
	}
	pc.Advance(time.Second)
	if _, err := n.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	// b's frontier moves far past the delete.
	pc.Advance(30 * time.Minute)
	e2 := entry.Entry{Index: 2, Origin: "b", Stream: e.Stream, Commit: hlc.Timestamp{Wall: pc.Now()}, Op: entry.OpSet, Key: "other", Value: []byte("x")}
	e2.Stamp = e2.Commit
	if _, err := n.acceptor.Apply("b", &wire.Batch{Header: wire.Header{Sender: "b", Stream: e.Stream}, Entries: []entry.Entry{e2}}); err != nil {
		t.Fatal(err)
	}
	if c, err := n.CollectTombstones(); err != nil || c != 0 {
		t.Fatalf("collected %d (%v) with a dead letter older than the tombstone", c, err)
	}
	if err := n.dead.ReplayDeadLetter(dl[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the replayed dead letter resurrected k: %v", err)
	}
	if c, err := n.CollectTombstones(); err != nil || c != 1 {
		t.Fatalf("collected %d (%v) once the dead letter was replayed, want 1", c, err)
	}
}
