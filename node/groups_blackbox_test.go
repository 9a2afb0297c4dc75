package node_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/groups"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
)

// TestGroupsOfANodeAlone: a node alone started with three raft groups
// writes each key in its slot's group and reads it back; a scan in small
// pages yields every live key once, in order, across the groups; an atomic
// batch across groups is refused whole, one within a group (a hash tag)
// written; a range delete over every group deletes each group's keys in
// the range and no other; the keys are there after a restart; a restart
// with another number of groups is refused.
func TestGroupsOfANodeAlone(t *testing.T) {
	dir := t.TempDir()
	o := nodetest.Options("a", dir)
	o.Groups = 3
	// Tombstones collected a second after their delete.
	o.Testing.ShortRetention, o.TombstoneRetention, o.IdempotencyWindow, o.PinWindow = true, time.Second, time.Second, 500*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.RESPListener = ln
	n := nodetest.Start(t, o)
	ctx := context.Background()
	m, _ := slot.Initial(3)
	var keys []string
	in := map[int]int{}
	for i := 0; i < 60; i++ {
		k := fmt.Sprintf("k/%02d", i)
		keys = append(keys, k)
		in[m.Group(k)]++
		if _, err := n.Put(ctx, k, []byte(k)); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	if len(in) != 3 {
		t.Fatalf("the keys fell in %d groups, want 3: %v", len(in), in)
	}
	for _, k := range keys {
		if r, err := n.Get(k); err != nil || string(r.Value) != k {
			t.Fatalf("get %s: %q, %v", k, r.Value, err)
		}
	}
	if got := scanAll(t, n); !slices.Equal(got, keys) {
		t.Fatalf("the scan in pages of 7 yields %v, want %v", got, keys)
	}
	// Each group holds its keys and no other.
	rep := n.LocalCluster()
	if len(rep.Groups) != 3 {
		t.Fatalf("the cluster report shows %d groups: %+v", len(rep.Groups), rep.Groups)
	}
	slots := 0
	for _, g := range rep.Groups {
		slots += g.Slots
		if g.State != "leader" {
			t.Fatalf("group %d: this node alone is %q", g.Group, g.State)
		}
	}
	if slots != slot.Count {
		t.Fatalf("the groups own %d slots, want %d", slots, slot.Count)
	}
	// Each group's series under its label: the writes of group 2's keys.
	_, metrics := nodetest.Do(t, "GET", n.URL()+"/metrics", nil)
	want2 := fmt.Sprintf("replicator_local_writes_total{cluster=\"a\",group=\"2\"} %d\n", in[2])
	if !strings.Contains(string(metrics), want2) {
		t.Fatalf("/metrics lacks %q", want2)
	}
	// An atomic batch across groups: refused whole.
	var a, b string
	for _, k := range keys {
		if m.Group(k) == 0 && a == "" {
			a = k
		}
		if m.Group(k) == 2 && b == "" {
			b = k
		}
	}
	_, err = n.Propose(ctx, api.Write{Ops: []api.BatchOp{{Key: a, Value: []byte("x")}, {Key: b, Value: []byte("x")}}})
	var cross *api.CrossGroupError
	if !errors.As(err, &cross) || !errors.Is(err, api.ErrNotWritten) {
		t.Fatalf("a batch across groups 0 and 2: %v", err)
	}
	for _, k := range []string{a, b} {
		if r, _ := n.Get(k); string(r.Value) != k {
			t.Fatalf("%s is %q after the refused batch", k, r.Value)
		}
	}
	// The same through the RESP door: MULTI/EXEC across groups answers
	// CROSSSLOT, and the door serves on.
	rc := redisClient(t, ln.Addr().String(), 2, nil)
	_, err = rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, a, "y", 0)
		p.Set(ctx, b, "y", 0)
		return nil
	})
	if err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Fatalf("MULTI/EXEC across groups: %v, want CROSSSLOT", err)
	}
	if v, err := rc.Get(ctx, b).Result(); err != nil || v != b {
		t.Fatalf("GET %s after the refused transaction: %q, %v", b, v, err)
	}
	if _, err := n.Propose(ctx, api.Write{Ops: []api.BatchOp{{Key: "{t}a", Value: []byte("1")}, {Key: "{t}b", Value: []byte("2")}}}); err != nil {
		t.Fatalf("a batch of one hash tag: %v", err)
	}
	// A range delete over every group: k/10 to k/30.
	if _, err := n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "k/10", End: "k/30"}}); err != nil {
		t.Fatalf("range delete: %v", err)
	}
	want := append(slices.Clone(keys[:10]), keys[30:]...)
	want = append(want, "{t}a", "{t}b")
	if got := scanAll(t, n); !slices.Equal(got, want) {
		t.Fatalf("after the range delete the scan yields %v, want %v", got, want)
	}
	d1, err := n.Digest()
	if err != nil || d1.Keys != len(want) || d1.Tombstones != 20 {
		t.Fatalf("digest: %+v, %v (want %d keys, 20 tombstones)", d1, err, len(want))
	}
	// Each group collects its tombstones past the retention.
	time.Sleep(1200 * time.Millisecond)
	if got, err := n.CollectTombstones(); err != nil || got != 23 {
		t.Fatalf("collected %d tombstones (%v), want the range delete's: 20 keys' and each group's range", got, err)
	}
	if d, err := n.Digest(); err != nil || d.Tombstones != 0 || d.Hash != d1.Hash {
		t.Fatalf("after collection: %+v (%v), before %+v", d, err, d1)
	}
	// A backup would hold group 0's keys alone: refused.
	if resp, body := nodetest.Do(t, "GET", n.URL()+"/admin/backup", nil); resp.StatusCode != 400 || !strings.Contains(string(body), "raft groups") {
		t.Fatalf("a backup of a node of several groups: %d %s", resp.StatusCode, body)
	}
	n.Close()

	o1 := nodetest.Options("a", dir)
	o.RESPListener = nil
	if _, err := node.Open(ctx, o1); !errors.Is(err, groups.ErrGroups) {
		t.Fatalf("a restart with one group: %v, want groups.ErrGroups", err)
	}
	n = nodetest.Start(t, o)
	if got := scanAll(t, n); !slices.Equal(got, want) {
		t.Fatalf("after a restart the scan yields %v, want %v", got, want)
	}
	if d2, err := n.Digest(); err != nil || d2.Hash != d1.Hash || d2.Keys != d1.Keys {
		t.Fatalf("after a restart the digest is %+v (%v), was %+v", d2, err, d1)
	}
}

// scanAll scans n's live keys in pages of 7.
func scanAll(t *testing.T, n *node.Node) []string {
	t.Helper()
	var out []string
	after := ""
	for {
		items, next, err := n.Scan(store.ScanOptions{After: after, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			out = append(out, it.Key)
		}
		if next == "" {
			return out
		}
		after = next
	}
}

// TestGroupsOverThreeNodes: three nodes of a cluster of three groups
// form every group over their one raft port; each group's leadership
// spreads to a node of its own; a write through any node reaches its key's
// group's leader (forwarded when another node leads it) and reads back
// there; the leader of one group goes, and the cluster's writes go on in
// every group; the running nodes converge to one digest.
func TestGroupsOverThreeNodes(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, func(_ string, o *node.Options) { o.Groups = 3 })
	ctx := context.Background()
	// Leaders spread: one group each.
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		rep := c.Nodes[c.Names[0]].LocalCluster()
		seen := map[string]bool{}
		for _, g := range rep.Groups {
			seen[g.Leader] = g.Leader != ""
		}
		return len(rep.Groups) == 3 && len(seen) == 3 && !seen[""], fmt.Sprintf("groups %+v", rep.Groups)
	})
	put := func(via, k string) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			_, err := c.Nodes[via].Put(ctx, k, []byte(k))
			if err == nil || !errors.Is(err, api.ErrNotWritten) || ctx.Err() != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var keys []string
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("k/%02d", i)
		via := c.Names[i%3]
		if err := put(via, k); err != nil {
			t.Fatalf("put %s via %s: %v", k, via, err)
		}
		// Answered once applied at the node that took it.
		if r, err := c.Nodes[via].Get(k); err != nil || string(r.Value) != k {
			t.Fatalf("%s reads %s as %q, %v after writing it", via, k, r.Value, err)
		}
		keys = append(keys, k)
	}
	// The leader of group 1 goes; every group takes writes again.
	var gone string
	for _, g := range c.Nodes[c.Names[0]].LocalCluster().Groups {
		if g.Group == 1 {
			gone = g.Leader
		}
	}
	c.Stop(gone)
	for i := 30; i < 60; i++ {
		k := fmt.Sprintf("k/%02d", i)
		via := c.Names[i%3]
		if via == gone {
			via = c.Names[(i+1)%3]
			if via == gone {
				via = c.Names[(i+2)%3]
			}
		}
		if err := put(via, k); err != nil {
			t.Fatalf("put %s via %s after %s went: %v", k, via, gone, err)
		}
		keys = append(keys, k)
	}
	d := c.Converged()
	if d.Keys != len(keys) {
		t.Fatalf("the running nodes converged on %d keys, want %d", d.Keys, len(keys))
	}
	for _, name := range c.Names {
		if n := c.Nodes[name]; n != nil {
			if got := scanAll(t, n); !slices.Equal(got, keys) {
				t.Fatalf("%s's scan yields %v", name, got)
			}
		}
	}
}
