package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// TestRestoredOldBackupDoesNotSpreadZombies: a is restored from a backup
// older than the tombstone retention. Keys it held then were deleted since
// and the tombstones collected at every cluster. a's restore is caught, a
// rejoins and re-seeds b and c with its tree: they do not take those keys
// back (counted as possible resurrections), a comparison from a reports
// each as a possible resurrection and a repair copies none, and the
// operator's delete at a (docs/OPERATIONS.md) makes the three agree.
func TestRestoredOldBackupDoesNotSpreadZombies(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
		o.AntiEntropyInterval = -1
	}, "a", "b", "c")
	ctx := context.Background()
	const zombies = 5
	nodetest.PutN(t, m.Nodes["a"], "zombie-", zombies)
	nodetest.PutN(t, m.Nodes["a"], "kept-", 3)
	m.Converged(20 * time.Second)

	backup := t.TempDir() + "/backup"
	m.Restart("a", func(dir string) { nodetest.CopyDir(t, dir, backup) })
	for i := 0; i < zombies; i++ {
		if _, err := m.Nodes["a"].Delete(ctx, fmt.Sprintf("zombie-%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	m.Converged(20 * time.Second)
	// Past the retention, with writes from every cluster moving each
	// frontier on, every cluster collects the deletes' tombstones.
	collected := map[string]int{}
	for round := 0; round < 2; round++ {
		pc.Advance(20 * time.Minute)
		for name, n := range m.Nodes {
			if _, err := n.Put(ctx, fmt.Sprintf("later-%s-%d", name, round), []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		m.Converged(20 * time.Second)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		for name, n := range m.Nodes {
			c, err := n.CollectTombstones()
			if err != nil {
				return false, err.Error()
			}
			collected[name] += c
		}
		for name := range m.Nodes {
			if collected[name] < zombies {
				return false, fmt.Sprintf("collected %v", collected)
			}
		}
		return true, ""
	})

	old := m.Nodes["a"].OriginReport().Stream
	m.Restart("a", func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		nodetest.CopyDir(t, backup, dir)
	})
	a := m.Nodes["a"]
	// The rejoin ends: a asked b and c for their trees and re-seeded each.
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		why := ""
		for name, n := range m.Nodes {
			if r := n.PeersReport().Rejoin; len(r.Phases) > 0 || len(r.Requests) > 0 {
				why += fmt.Sprintf("%s: rejoin %+v; ", name, r)
			}
			for _, l := range n.PeerStatus() {
				if l.EntriesBehind > 0 || l.NeedsReseed || l.State == "reseeding" || l.ReseedOwed {
					why += fmt.Sprintf("%s -> %s: %s; ", name, l.Peer, l.State)
				}
			}
		}
		if a.OriginReport().Stream == old {
			why = "a did not notice its restore"
		}
		return why == "", why
	})
	for i := 0; i < zombies; i++ {
		k := fmt.Sprintf("zombie-%03d", i)
		if _, err := a.Get(k); err != nil {
			t.Fatalf("a lost %s, which its backup held: %v", k, err)
		}
		for _, name := range []string{"b", "c"} {
			if _, err := m.Nodes[name].Get(k); !errors.Is(err, api.ErrNotFound) {
				t.Fatalf("%s: the rejoin's re-seed brought back %s, deleted and collected there: %v", name, k, err)
			}
		}
	}
	for _, name := range []string{"b", "c"} {
		if got := m.Nodes[name].PeersReport().Incoming["a"].Resurrections; got != zombies {
			t.Fatalf("%s counted %d possible resurrections from a's re-seed, want %d", name, got, zombies)
		}
	}
	for _, peer := range []string{"b", "c"} {
		rep, err := client.New(a.URL(), nil).Diff(ctx, peer, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Divergent) != zombies || rep.Count(client.LacksMaybeDeleted) != zombies || rep.Repaired != 0 {
			t.Fatalf("a against %s: %d divergent (%d possible resurrections), %d repaired: %+v",
				peer, len(rep.Divergent), rep.Count(client.LacksMaybeDeleted), rep.Repaired, rep.Divergent)
		}
		back, err := client.New(m.Nodes[peer].URL(), nil).Diff(ctx, "a", true)
		if err != nil {
			t.Fatal(err)
		}
		if back.Repaired != 0 || back.Count(client.LacksMaybeDeleted) != zombies {
			t.Fatalf("%s against a: %d repaired, %d possible resurrections", peer, back.Repaired, back.Count(client.LacksMaybeDeleted))
		}
		if _, err := m.Nodes[peer].Get("zombie-000"); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("%s's repair pulled a possible resurrection: %v", peer, err)
		}
	}
	// What the operator does (docs/OPERATIONS.md): delete each at a.
	for i := 0; i < zombies; i++ {
		if _, err := a.Delete(ctx, fmt.Sprintf("zombie-%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	m.Converged(20 * time.Second)
}
