package node_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// Black-box tests of meshes of single-node clusters: through the exported
// API and the shared harness (internal/nodetest) only.

// TestTombstoneOutlivesDelayedOlderWrite: cluster c's older write of a key
// is held back on its way to a while b deletes the key and the tombstone
// passes its retention window at a. a must keep the tombstone (c's applied
// frontier is behind it), so the late write arrives stale instead of
// resurrecting the key; once c's frontier moves past, a collects it.
func TestTombstoneOutlivesDelayedOlderWrite(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
	}, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()

	// c is known to a, with a frontier.
	if _, err := c.Put(ctx, "warmup", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m.Settle()

	m.Cut("c", "a", true)
	pc.Advance(time.Second)
	if _, err := c.Put(ctx, "k", []byte("old from c")); err != nil {
		t.Fatal(err)
	}
	// b deletes the value it holds (a delete of a key that holds nothing
	// writes nothing: docs/DATAMODEL.md "Deletes").
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		_, err := b.Get("k")
		return err == nil, fmt.Sprintf("c's write at b: %v", err)
	})
	pc.Advance(time.Second)
	if _, err := b.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	m.Settle()
	if _, err := a.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a before the late write: %v", err)
	}

	pc.Advance(11 * time.Minute) // the tombstone is past retention
	if n, err := a.CollectTombstones(); err != nil || n != 0 {
		t.Fatalf("a collected %d tombstones (%v) while c's older write can still arrive", n, err)
	}

	m.Cut("c", "a", false)
	m.Settle()
	if r, err := a.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("c's late, older write resurrected k at a: %q %v", r.Value, err)
	}
	da, _ := a.Digest()
	for _, n := range []*node.Node{b, c} {
		if d, _ := n.Digest(); d.Hash != da.Hash {
			t.Fatalf("digests differ after the late write: %+v vs %+v", d, da)
		}
	}

	// c's frontier moves past the tombstone (plus the pin window): now no
	// older write can come, and a collects it.
	pc.Advance(2 * time.Minute)
	if _, err := c.Put(ctx, "later", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "later-b", []byte("y")); err != nil {
		t.Fatal(err)
	}
	m.Settle()
	if n, err := a.CollectTombstones(); err != nil || n != 1 {
		t.Fatalf("a collected %d tombstones (%v) once every frontier passed, want 1", n, err)
	}
	if d, _ := a.Digest(); d.Tombstones != 0 || d.Hash == "" {
		t.Fatalf("after collection: %+v", d)
	}
}

// TestIdlePeerDoesNotHoldCollection: a peer that writes nothing (a standby
// region that only receives) held every tombstone of its peers for ever:
// its applied frontier there never moves ("nothing applied from b yet", or
// its last write's commit). Its heartbeats now say when every entry of its
// stream is acknowledged and that what it appends later is committed above
// its clock: the peers count that as its frontier, and collect.
func TestIdlePeerDoesNotHoldCollection(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
	}, "a", "b")
	a := m.Nodes["a"]
	ctx := context.Background()
	if _, err := a.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	pc.Advance(12 * time.Minute)
	if _, err := a.Put(ctx, "later", []byte("y")); err != nil { // only a writes
		t.Fatal(err)
	}
	m.Settle()
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		n, err := a.CollectTombstones()
		return err == nil && n == 1, fmt.Sprintf("a collected %d tombstones (%v) with b idle", n, err)
	})
}
