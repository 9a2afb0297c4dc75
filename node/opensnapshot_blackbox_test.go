package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/store"
)

// TestOpenSnapshotHoldsCollection: while a re-seed or backfill from a peer
// is open here, no tombstone is collected (its entries relay old versions a
// collected tombstone could no longer shadow); one left open by a peer that
// is no longer configured holds nothing back, since it can never end. The
// open snapshots are written into a's tree while it is stopped, as a
// snapshot interrupted by a crash leaves them.
func TestOpenSnapshotHoldsCollection(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
	}, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	ctx := context.Background()
	if _, err := a.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	pc.Advance(12 * time.Minute)
	for _, n := range []*node.Node{a, b} {
		if _, err := n.Put(ctx, "later-"+n.ClusterID(), []byte("y")); err != nil {
			t.Fatal(err)
		}
	}
	m.Settle()

	open := func(sender string) entry.StreamID {
		t.Helper()
		o := store.OpenSnapshot{Sender: sender, Stream: entry.NewStreamID(), Kind: store.SnapshotBackfill}
		m.Restart("a", func(dir string) {
			nodetest.Beneath(t, dir, func(bt *store.Batch) {
				if err := bt.OpenSnapshot(o); err != nil {
					t.Fatal(err)
				}
			})
		})
		return o.Stream
	}
	s := open("b")
	if n, err := m.Nodes["a"].CollectTombstones(); err != nil || n != 0 {
		t.Fatalf("a collected %d tombstones (%v) while b's backfill is open", n, err)
	}
	m.Restart("a", func(dir string) {
		nodetest.Beneath(t, dir, func(bt *store.Batch) {
			if err := bt.CloseSnapshot("b", s); err != nil {
				t.Fatal(err)
			}
		})
	})
	open("gone") // a peer removed from the configuration
	// b may send a again the backfill a said it held open (a sender that
	// lost track of a snapshot sends it anew): the tombstone goes once
	// that ends, and nothing but a removed peer's snapshot holds it.
	collected := 0
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		n, err := m.Nodes["a"].CollectTombstones()
		if err != nil {
			t.Fatal(err)
		}
		collected += n
		return collected == 1, fmt.Sprintf("a collected %d tombstones with only a removed peer's snapshot open, want 1", collected)
	})
}
