package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/datadir"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
)

// A follower that was down while the leader compacted its log gets the
// leader's tree (a snapshot that is a Pebble checkpoint), and so does a
// follower whose data directory was wiped; neither begins a stream.
func TestLaggingAndWipedFollowersCatchUpFromTheTree(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, func(_ string, o *node.Options) {
		o.Raft.SnapshotThreshold, o.Raft.TrailingLogs, o.Raft.SnapshotInterval = 16, 4, 100*time.Millisecond
	})
	leader := c.Leader()
	f := c.Follower()
	stream := c.Nodes[leader].OriginReport().Stream
	c.Stop(f)
	ctx := context.Background()
	put := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := c.Client(leader).Put(ctx, fmt.Sprintf("k%03d", i), []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(0, 100)
	if _, err := c.Client(leader).Delete(ctx, "k000"); err != nil {
		t.Fatal(err)
	}
	compacted(t, c.Nodes[leader], 50)
	c.Start(f)
	d := c.Converged()
	if d.Keys != 99 || d.Tombstones != 1 {
		t.Fatalf("after catching up: %+v", d)
	}
	if got := c.Nodes[f].OriginReport().Stream; got != stream {
		t.Fatalf("the follower's stream %s, the cluster's %s", got, stream)
	}
	// Wiped: an empty data directory under the same node ID.
	c.Stop(f)
	if err := os.RemoveAll(c.Dirs[f]); err != nil {
		t.Fatal(err)
	}
	put(100, 150)
	compacted(t, c.Nodes[leader], 110)
	c.Start(f)
	d = c.Converged()
	if d.Keys != 149 {
		t.Fatalf("after the wiped follower caught up: %+v", d)
	}
	if got := c.Nodes[f].OriginReport().Stream; got != stream {
		t.Fatalf("the wiped follower's stream %s, the cluster's %s", got, stream)
	}
	// And it takes part: writes through it land everywhere.
	if _, err := c.Client(f).Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if d := c.Converged(); d.Keys != 150 {
		t.Fatalf("%+v", d)
	}
}

// TestWipedOrRestoredVoterDoesNotLoseAcknowledgedWrites is the audit's
// sequence (issue 24): nodes L (leader), W, F; F stops; L acknowledges 5
// writes, committed by L and W; L and W stop; W comes back with an empty
// data directory (wiped), with everything but its identity files gone, or
// with a copy taken before the 5 writes (restored), and F comes back. Before incarnations, W's new life voted for
// F, whose log lacks the 5 writes, and they were lost. Now W is a new
// member nobody counts a vote from: no leader is elected until L returns,
// then W joins as a non-voter, votes once caught up, its old incarnation is
// out for good, and every node holds every acknowledged write.
func TestWipedOrRestoredVoterDoesNotLoseAcknowledgedWrites(t *testing.T) {
	for _, how := range []string{"wiped", "restored", "identity-kept"} {
		t.Run(how, func(t *testing.T) {
			c := nodetest.NewCluster(t, "a", 3, nil)
			l, w, f := c.Roles()
			ctx := context.Background()
			put := func(at, k string) {
				t.Helper()
				if _, err := c.Client(at).Put(ctx, k, []byte("v")); err != nil {
					t.Fatalf("put %s at %s: %v", k, at, err)
				}
			}
			for i := 0; i < 10; i++ {
				put(l, fmt.Sprintf("before%d", i))
			}
			c.Converged()
			backup := filepath.Join(t.TempDir(), "backup")
			if how == "restored" {
				c.Stop(w)
				nodetest.CopyDir(t, c.Dirs[w], backup)
				c.Start(w)
				c.Converged()
			}
			oldInc := c.Nodes[w].LocalCluster().Incarnation
			c.Stop(f)
			l = c.Leader()
			for i := 0; i < 5; i++ {
				put(l, fmt.Sprintf("acked%d", i))
			}
			for _, name := range []string{l, w} {
				if name != "" {
					c.Stop(name)
				}
			}
			if how == "identity-kept" {
				// Everything but its identity files goes (a partial wipe, or
				// identity files on a volume of their own): its raft state
				// is gone, so it is a new incarnation all the same.
				ents, _ := os.ReadDir(c.Dirs[w])
				for _, e := range ents {
					if e.Name() != "NODE_ID" && e.Name() != origin.IncarnationFile {
						os.RemoveAll(filepath.Join(c.Dirs[w], e.Name()))
					}
				}
			} else if err := os.RemoveAll(c.Dirs[w]); err != nil {
				t.Fatal(err)
			}
			if how == "restored" {
				nodetest.CopyDir(t, backup, c.Dirs[w])
				// A raw copy of a voter is refused: it would forget what it
				// acknowledged since the copy.
				o := *c.Opts[w]
				if _, err := node.Open(ctx, &o); err == nil || !strings.Contains(err.Error(), "replicator restore") {
					t.Fatalf("a voter started from a raw copy: %v", err)
				}
				rep, err := datadir.Restore(c.Dirs[w])
				if err != nil || !rep.Replaced || rep.Previous != oldInc || rep.Incarnation == oldInc {
					t.Fatalf("restore: %+v %v", rep, err)
				}
			}
			c.Start(w)
			c.Start(f)
			if got := c.Nodes[w].LocalCluster().Incarnation; got == oldInc {
				t.Fatalf("%s came back %s under its old incarnation %s", w, how, got)
			}
			// Many election timeouts: F's log lacks the 5 writes, and W's
			// new life is no voter of this configuration.
			time.Sleep(3 * time.Second)
			for _, name := range []string{w, f} {
				if strings.HasPrefix(c.Nodes[name].LocalCluster().State, "leader") {
					t.Fatalf("%s was elected without the 5 acknowledged writes", name)
				}
			}
			c.Start(l)
			c.Leader()
			d := c.Converged()
			if d.Keys != 15 {
				t.Fatalf("%d keys on every node, want 15 (10 before, 5 acknowledged): %+v", d.Keys, d)
			}
			for i := 0; i < 5; i++ {
				for _, name := range c.Names {
					if _, err := c.Nodes[name].Get(fmt.Sprintf("acked%d", i)); err != nil {
						t.Fatalf("%s lost acknowledged write acked%d: %v", name, i, err)
					}
				}
			}
			// W's new incarnation votes; the old one is out for good.
			ld := c.Nodes[c.Leader()]
			deadline := time.Now().Add(20 * time.Second)
			for {
				var ok bool
				voters := 0
				for _, sv := range servers(ld) {
					if sv.Voter {
						voters++
					}
					if sv.ID == w && sv.Voter && sv.Incarnation == c.Nodes[w].LocalCluster().Incarnation {
						ok = true
					}
				}
				if ok && voters == 3 && len(servers(ld)) == 3 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("configuration %+v: want %s's new incarnation voting and its old one gone", servers(ld), w)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if why := removedWhy(ld, cluster.ServerID(w, oldInc)); why == "" {
				t.Fatalf("%s's old incarnation %s is not recorded as removed", w, oldInc)
			}
			// And the cluster takes writes at every node.
			for _, name := range c.Names {
				put(name, "after-"+name)
			}
			if d := c.Converged(); d.Keys != 18 {
				t.Fatalf("%+v", d)
			}
		})
	}
}

// TestRecoveryRecordsTheLostAndSealsOnce (issue 24): after the loss of a
// majority, the survivor recovered with peers.json records the lost nodes
// as removed and seals the stream in its first term, and only then lets
// peers.json go. A stop at any step of that (before the term, after the
// lost were recorded, after the seal) recovers again at the next start and
// ends the same: the stream sealed once, the lost recorded. A lost node
// that comes back with its old directory is refused and told why, and the
// report shows it; wiped, it comes back as a new member.
func TestRecoveryRecordsTheLostAndSealsOnce(t *testing.T) {
	for _, stopAt := range []string{"begin", "lost-recorded", "sealed"} {
		t.Run(stopAt, func(t *testing.T) {
			c := nodetest.NewCluster(t, "a", 3, nil)
			leader := c.Leader()
			ctx := context.Background()
			for i := 0; i < 20; i++ {
				if _, err := c.Client(leader).Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			c.Converged()
			survivor := c.Follower()
			var lost []string
			lostIDs := map[string]raft.ServerID{}
			for _, name := range c.Names {
				if name != survivor {
					lost = append(lost, name)
					lostIDs[name] = serverID(c.Nodes[name])
				}
			}
			old := c.Nodes[survivor].OriginReport().Stream
			for _, name := range c.Names {
				c.Stop(name)
			}
			peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, survivor, c.Opts[survivor].Raft.Listen)
			gdir := filepath.Join(c.Dirs[survivor], "cluster")
			if err := os.WriteFile(filepath.Join(gdir, cluster.PeersFile), []byte(peers), 0o644); err != nil {
				t.Fatal(err)
			}

			// The first start stops at a step of the recovery's first term.
			fired := make(chan struct{})
			var once sync.Once
			hook := func(step string) error {
				if step != stopAt {
					return nil
				}
				once.Do(func() { close(fired) })
				return fmt.Errorf("stopped at %s (a crash, in a test)", step)
			}
			replica.RecoveryStepHook.Store(&hook)
			c.Start(survivor)
			select {
			case <-fired:
			case <-time.After(20 * time.Second):
				t.Fatalf("the recovery's first term never reached %s", stopAt)
			}
			sealedInto := c.Nodes[survivor].OriginReport().Stream
			c.Stop(survivor)
			replica.RecoveryStepHook.Store(nil)
			if _, err := os.Stat(filepath.Join(gdir, cluster.PeersFile)); err != nil {
				t.Fatalf("peers.json went before the recovery's commands committed: %v", err)
			}

			c.Start(survivor)
			if l := c.Leader(); l != survivor {
				t.Fatalf("%s leads", l)
			}
			nd := c.Nodes[survivor]
			switch got := nd.OriginReport().Stream; {
			case got == old:
				t.Fatal("the stream goes on after a recovery: its next indexes may mean writes the lost nodes shipped")
			case stopAt == "sealed" && got != sealedInto:
				t.Fatalf("sealed twice: the stream %s became %s at the restart", sealedInto, got)
			}
			for _, f := range []string{cluster.PeersFile, cluster.RecoveryFile} {
				if _, err := os.Stat(filepath.Join(gdir, f)); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("%s left after the recovery: %v", f, err)
				}
			}
			for name, id := range lostIDs {
				if why := removedWhy(nd, id); !strings.Contains(why, "recovered") {
					t.Fatalf("%s (%s) is not recorded as lost in the recovery: %q", name, id, why)
				}
			}
			if _, err := c.Client(survivor).Put(ctx, "after", []byte("v")); err != nil {
				t.Fatal(err)
			}

			// Both lost nodes come back with their old directories (a
			// majority of the old configuration): each is refused and told
			// why (at its start, or as soon as a member tells it), and the
			// survivor's report shows it removed. Neither takes part.
			for _, back := range lost {
				o := *c.Opts[back]
				r := *o.Raft
				o.Raft = &r
				why := ""
				nd2, err := node.Open(ctx, &o)
				if err != nil {
					why = err.Error()
				} else {
					if err := nd2.Start(); err != nil {
						t.Fatal(err)
					}
					why = awaitRemoved(nd2, 15*time.Second)
					if _, err := nd2.Get("after"); why != "" && !errors.Is(err, api.ErrRemoved) {
						t.Fatalf("the lost node %s, refused, still serves reads: %v", back, err)
					}
					select {
					case <-nd2.Fatal():
						t.Fatalf("the lost node %s stopped (a supervisor would restart it in a loop): %v", back, nd2.FatalErr())
					default:
					}
					nd2.Close()
					// What its tree holds, read with the node down.
					nodetest.Store(t, o.DataDir, func(st *store.Store) {
						if _, err := st.Get("after"); !errors.Is(err, store.ErrNotFound) {
							t.Fatalf("the lost node %s holds a write of the recovered cluster: %v", back, err)
						}
					})
				}
				if !strings.Contains(why, "recovered") {
					t.Fatalf("the lost node %s came back with its old directory and was not refused and told why: %q", back, why)
				}
			}
			rep := nd.ClusterReport(ctx)
			for _, back := range lost {
				shown := false
				for _, cn := range rep.Nodes {
					if cn.ID == back && cn.State == "removed" && strings.Contains(cn.Error, "recovered") {
						shown = true
					}
					if cn.ID == back && cn.Voter {
						t.Fatalf("the lost node is a voter again: %+v", rep.Nodes)
					}
				}
				if !shown {
					t.Fatalf("the report does not show the lost node %s as removed: %+v", back, rep.Nodes)
				}
			}
			if len(servers(nd)) != 1 {
				t.Fatalf("configuration %+v", servers(nd))
			}

			// Wiped, both lost nodes come back as new members.
			for _, name := range lost {
				c.Stop(name)
				if err := os.RemoveAll(c.Dirs[name]); err != nil {
					t.Fatal(err)
				}
				c.Start(name)
			}
			if d := c.Converged(); d.Keys != 21 {
				t.Fatalf("%+v", d)
			}
		})
	}
}

// A node lost in a recovery may hold a configuration older than the
// survivor's: here the survivor W was wiped and rejoined as a new
// incarnation while F was down (five nodes, so that three keep a quorum
// through it), so F's configuration names W's old incarnation at W's
// address. When F comes back with its old directory, the node answering at
// that address is W, a later incarnation of the member F knows there, and
// its refusal (F was lost in the recovery) must stop F: F ignored it
// before, and ran on with a log the cluster no longer counts (seen in the
// multi-node robustness run, seed 11).
func TestLostNodeRefusedByALaterIncarnationOfAMember(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 5, nil)
	l := c.Leader()
	var w, f string
	for _, name := range c.Names {
		switch {
		case name == l:
		case w == "":
			w = name
		case f == "":
			f = name
		}
	}
	ctx := context.Background()
	if _, err := c.Client(l).Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.Converged()
	fID := serverID(c.Nodes[f])
	c.Stop(f)
	oldW := serverID(c.Nodes[w])
	c.Stop(w)
	if err := os.RemoveAll(c.Dirs[w]); err != nil {
		t.Fatal(err)
	}
	c.Start(w)
	newW := serverID(c.Nodes[w])
	if newW == oldW {
		t.Fatalf("the wiped node kept its identity %s", oldW)
	}
	_, newInc := cluster.SplitServerID(newW)
	// W's new incarnation votes, and its old one is gone, before the
	// majority is lost.
	deadline := time.Now().Add(30 * time.Second)
	for {
		voter, n := false, 0
		for _, sv := range servers(c.Nodes[l]) {
			if sv.ID == w {
				n++
				voter = sv.Incarnation == newInc && sv.Voter
			}
		}
		if voter && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not a voter in place of %s: %+v", newW, oldW, servers(c.Nodes[l]))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.Client(l).Put(ctx, "k2", []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.Converged()
	// Every node but F goes; W is recovered alone.
	for _, name := range c.Names {
		c.Stop(name)
	}
	peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, newW, c.Opts[w].Raft.Listen)
	if err := os.WriteFile(filepath.Join(c.Dirs[w], "cluster", cluster.PeersFile), []byte(peers), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Start(w)
	if got := c.Leader(); got != w {
		t.Fatalf("%s leads after recovering %s", got, w)
	}
	if why := removedWhy(c.Nodes[w], fID); !strings.Contains(why, "recovered") {
		t.Fatalf("F (%s) is not recorded as lost in the recovery: %q", fID, why)
	}
	// F comes back with its old directory: it must stop, saying why.
	o := *c.Opts[f]
	r := *o.Raft
	o.Raft = &r
	// It opens and starts either way (refused at open, or at its first
	// contact): a node that exits is restarted by its supervisor in a loop.
	nd, err := node.Open(ctx, &o)
	if err == nil {
		defer nd.Close()
		err = nd.Start()
	}
	if err != nil {
		t.Fatalf("F, lost in the recovery, exited instead of staying up refusing: %v", err)
	}
	why := awaitRemoved(nd, 20*time.Second)
	if why == "" {
		t.Fatal("F, lost in the recovery, runs on with its old directory: the refusal by W's new incarnation was ignored")
	}
	if !strings.Contains(why, "recovered") {
		t.Fatalf("F was put out, but not for the recovery: %v", why)
	}
	if _, err := nd.Put(context.Background(), "k", []byte("v")); !errors.Is(err, api.ErrRemoved) || !errors.Is(err, api.ErrNotWritten) {
		t.Fatalf("F, removed, answered a write with %v", err)
	}
	expectRemovedOverHTTP(t, nd)
}

// Issue 25, finding 4, a mixed cluster: the raft port's credential moves
// from the gossip key (which the clusters of a mesh may share) to the
// cluster's own raft key in a rolling upgrade. a1 has the gossip key only
// (the older scheme), a2 and a3 the raft key and --raft-accept-gossip-key:
// the three form one cluster and take writes; a1 gets the raft key; then
// each drops the older credential in turn, writes going on; at the end a
// node holding only the gossip key (another cluster of the mesh) is not
// added.
func TestRaftKeyRollingUpgrade(t *testing.T) {
	gossipKey := bytes.Repeat([]byte{0x42}, 32)
	raftKey := bytes.Repeat([]byte{0x17}, 32)
	c := nodetest.NewCluster(t, "a", 3, func(name string, o *node.Options) {
		o.Gossip.Key = gossipKey
		if name != "a1" {
			o.Raft.Key, o.Raft.AcceptGossipKey = raftKey, true
		}
	})
	ctx := context.Background()
	write := func(round int) {
		t.Helper()
		for _, name := range c.Names {
			if c.Nodes[name] == nil {
				continue
			}
			k := fmt.Sprintf("r%d/%s", round, name)
			var err error
			for try := 0; try < 50; try++ { // an election may be under way after a restart
				if _, err = c.Client(name).Put(ctx, k, []byte("v")); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("round %d: a write through %s: %v", round, name, err)
			}
		}
	}
	c.Leader()
	write(0)
	c.Converged()
	restart := func(name string, key []byte, accept bool) {
		t.Helper()
		c.Stop(name)
		c.Opts[name].Raft.Key, c.Opts[name].Raft.AcceptGossipKey = key, accept
		c.Start(name)
		c.Leader()
	}
	restart("a1", raftKey, true)
	write(1)
	for i, name := range c.Names {
		restart(name, raftKey, false)
		write(2 + i)
	}
	d := c.Converged()
	if d.Keys != 3*5 {
		t.Fatalf("%d keys after the upgrade, want %d", d.Keys, 3*5)
	}
	// Another cluster's node with the shared gossip key claims cluster a.
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	release()
	o := nodetest.Options("a", filepath.Join(t.TempDir(), "a9"))
	o.NodeID, o.Listen = "a9", free[0]
	o.Raft = &node.RaftOptions{Listen: free[1], ElectionTimeout: 300 * time.Millisecond}
	o.Gossip = &node.GossipOptions{Bind: free[2], Profile: "local", Key: gossipKey, Join: []string{c.Opts["a1"].Gossip.Bind}}
	o.IdentityCheckWait = -1
	evil := nodetest.Open(t, o)
	defer evil.Close()
	if err := evil.Start(); err != nil {
		t.Fatal(err)
	}
	l := c.Leader()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, sv := range servers(c.Nodes[l]) {
			if sv.ID == "a9" {
				t.Fatalf("a node holding only the shared gossip key was added: %+v", sv)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	seen := false
	for _, cn := range c.Nodes[l].LocalCluster().Nodes {
		seen = seen || cn.ID == "a9"
	}
	if !seen {
		t.Fatal("the leader's gossip never saw a9: the test proved nothing")
	}
}

// compacted waits until n's raft log was compacted past index first by a
// snapshot (taken by the interval its options set).
func compacted(t *testing.T, n *node.Node, first uint64) {
	t.Helper()
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		got := n.LocalCluster().First
		return got >= first, fmt.Sprintf("the leader's log still starts at %d: nothing to catch up from but the tree", got)
	})
}

// serverID is n's raft server ID: its node ID and incarnation.
func serverID(n *node.Node) raft.ServerID {
	r := n.LocalCluster()
	return cluster.ServerID(r.Node, r.Incarnation)
}

// removedWhy is why n's log says server id may not be a member ("": it
// may), as the cluster report lists the removal records.
func removedWhy(n *node.Node, id raft.ServerID) string {
	nodeID, inc := cluster.SplitServerID(id)
	for _, r := range n.LocalCluster().Removed {
		if r.ID == nodeID || r.ID == nodeID+"."+inc {
			return r.Why
		}
	}
	return ""
}
