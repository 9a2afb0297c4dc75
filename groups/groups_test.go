package groups

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
)

// Every group's loops end at Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func aloneDeps(t *testing.T, dir string, count int) Deps {
	clock := hlc.NewClock(hlc.SystemClock{}, time.Second)
	return Deps{
		Count: count, Dir: dir, Store: store.Options{Logger: quiet}, Logger: quiet,
		Replica: replica.Deps{Cluster: "a", NodeID: "n1", Incarnation: "0000000a", Clock: clock, Logger: quiet,
			Committer: replica.CommitEnv{MaxGroup: 16, IdemWindow: time.Hour},
			OnFatal:   func(err error) { t.Errorf("fatal: %v", err) }, Describe: func() string { return "" }},
		Bounds: &replica.Bounds{MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, MaxReplicateBytes: 16 << 20, PinWindow: time.Hour,
			Clock: clock, Peers: func() []replica.PeerLimits { return nil }},
		Admit: func(context.Context) error { return nil },
	}
}

// TestGroupsOfANodeAlone: a node alone opens groups 1 and 2 of a cluster
// of three, each a group of one with its own store and raft log under
// groups/g; a write of a key goes to the group of its slot and is there,
// and nowhere else, after a reopen; each group's stream is cut once its
// entries applied (no peer reads it); a Set of one group, or of more than
// MaxGroups, is refused.
func TestGroupsOfANodeAlone(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(aloneDeps(t, dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	s.Run()
	slots, _ := slot.Initial(3)
	written := map[string]int{}
	for i := 0; len(written) < 60; i++ {
		k := fmt.Sprintf("key-%d", i)
		g := s.Of(k)
		if g != slots.Group(k) {
			t.Fatalf("key %q: group %d, the slot map says %d", k, g, slots.Group(k))
		}
		if g == 0 {
			continue // group 0 is the node's own replica
		}
		res, err := s.Group(g).Sub.Submit(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: k, Value: []byte(k)}})()
		if err != nil {
			t.Fatalf("write %q to group %d: %v", k, g, err)
		}
		if res.Stream != s.Group(g).Rep.Stream().Stream() {
			t.Fatalf("write %q answered from stream %s, group %d's is %s", k, res.Stream, g, s.Group(g).Rep.Stream().Stream())
		}
		written[k] = g
	}
	for g := 1; g < 3; g++ {
		out := s.Group(g).Rep.Stream()
		deadline := time.Now().Add(10 * time.Second)
		for out.First() <= out.Last() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if out.First() <= out.Last() {
			t.Fatalf("group %d's stream still holds [%d, %d]: never cut", g, out.First(), out.Last())
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(aloneDeps(t, dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for k, g := range written {
		for h := 1; h < 3; h++ {
			r, err := s.Group(h).Store.Get(k)
			switch {
			case h == g && (err != nil || string(r.Value) != k):
				t.Fatalf("key %q in group %d after a reopen: %+v, %v", k, g, r, err)
			case h != g && !errors.Is(err, store.ErrNotFound):
				t.Fatalf("key %q of group %d found in group %d: %+v, %v", k, g, h, r, err)
			}
		}
	}
	for _, n := range []int{1, MaxGroups + 1} {
		if _, err := Open(aloneDeps(t, t.TempDir(), n)); err == nil {
			t.Fatalf("a set of %d groups opened", n)
		}
	}
}
