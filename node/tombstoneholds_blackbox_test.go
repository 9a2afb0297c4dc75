package node_test

// Operator events (issue 12) that hold tombstones back, tried through the
// node's exported API and its HTTP surface: a peer's batch arrives at the
// replicate endpoint as a peer's shipper sends it, and dead letters are the
// operator's admin routes.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// aloneWithPeerB is a node of cluster a on a manual clock, with peer b
// known by its secret only (its URL would come by gossip, which finds
// nobody here).
func aloneWithPeerB(t *testing.T, pc *hlc.ManualClock, tweak func(*node.Options)) *node.Node {
	o := nodetest.Options("a", t.TempDir())
	o.Clock = pc
	o.TombstoneRetention = 10 * time.Minute
	o.PinWindow = time.Minute
	o.Peers = []node.Peer{{Name: "b", Secret: "s"}}
	o.Gossip = &node.GossipOptions{Bind: "127.0.0.1:0"}
	if tweak != nil {
		tweak(o)
	}
	return nodetest.Start(t, o)
}

// sendFromB posts b's entries to n as b's shipper would.
func sendFromB(t *testing.T, n *node.Node, es ...entry.Entry) {
	t.Helper()
	if st, body := nodetest.SendBatch(t, n, "b", "s", es...); st != http.StatusOK {
		t.Fatalf("b's batch: %d %s", st, body)
	}
}

// TestUnlinkedPeerHoldsTombstones (event 5): a peer configured by secret
// only (no URL yet) can send writes, so it holds back tombstone collection
// like a linked one: an older write from it must not resurrect a key.
func TestUnlinkedPeerHoldsTombstones(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	n := aloneWithPeerB(t, pc, nil)
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
	sendFromB(t, n, e)
	if r, err := n.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("b's older write resurrected k: %q %v", r.Value, err)
	}
}

// TestDeadLetterHoldsTombstones: a dead letter is a write that can still be
// replayed; tombstones it could shadow are kept until it is replayed or
// discarded, so a replay cannot bring a deleted key back.
func TestDeadLetterHoldsTombstones(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	n := aloneWithPeerB(t, pc, func(o *node.Options) { o.MaxValueBytes = 16 })
	ctx := context.Background()
	old := hlc.Timestamp{Wall: pc.Now()}
	e := entry.Entry{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: old, Stamp: old, Op: entry.OpSet, Key: "k", Value: make([]byte, 64)}
	sendFromB(t, n, e)
	resp, body := nodetest.Do(t, http.MethodGet, n.URL()+"/admin/deadletters", nil)
	var dl struct {
		DeadLetters []api.DeadLetterReport `json:"dead_letters"`
	}
	if err := json.Unmarshal(body, &dl); err != nil || resp.StatusCode != http.StatusOK || len(dl.DeadLetters) != 1 {
		t.Fatalf("dead letters: %d %s", resp.StatusCode, body)
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
	sendFromB(t, n, e2)
	if c, err := n.CollectTombstones(); err != nil || c != 0 {
		t.Fatalf("collected %d (%v) with a dead letter older than the tombstone", c, err)
	}
	if resp, body := nodetest.Do(t, http.MethodPost, n.URL()+"/admin/deadletters/"+dl.DeadLetters[0].ID+"/replay", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("replay: %d %s", resp.StatusCode, body)
	}
	if _, err := n.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the replayed dead letter resurrected k: %v", err)
	}
	if c, err := n.CollectTombstones(); err != nil || c != 1 {
		t.Fatalf("collected %d (%v) once the dead letter was replayed, want 1", c, err)
	}
}
