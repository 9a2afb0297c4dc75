package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/datadir"
	"github.com/replicator/replicator/discovery"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/hlc"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

// raftCluster is one cluster of several in-process nodes on loopback: real
// raft over the raft port, real gossip, real HTTP.
type raftCluster struct {
	t     *testing.T
	id    string
	names []string
	dirs  map[string]string
	opts  map[string]*Options
	nodes map[string]*Node
}

// newRaftCluster starts n nodes of cluster id that form by gossip;
// tweak adjusts each node's options.
func newRaftCluster(t *testing.T, id string, n int, tweak func(name string, o *Options)) *raftCluster {
	c := &raftCluster{t: t, id: id, dirs: map[string]string{}, opts: map[string]*Options{}, nodes: map[string]*Node{}}
	// Every node's three ports are held until all are chosen: released one
	// by one, the same port could come back for two of them.
	free, release, err := ports.Hold(3 * n)
	if err != nil {
		t.Fatal(err)
	}
	next := func() string {
		a := free[0]
		free = free[1:]
		return a
	}
	gossip := map[string]string{}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("%s%d", id, i)
		c.names = append(c.names, name)
		gossip[name] = next()
	}
	for _, name := range c.names {
		o := testOptions(filepath.Join(t.TempDir(), name))
		o.ClusterID, o.NodeID = id, name
		o.Listen = next() // the same address at every restart
		o.Raft = &RaftOptions{Listen: next(), BootstrapExpect: n, ElectionTimeout: 300 * time.Millisecond}
		o.Gossip = &GossipOptions{Bind: gossip[name], Profile: "local"}
		for _, other := range c.names {
			if other != name {
				o.Gossip.Join = append(o.Gossip.Join, gossip[other])
			}
		}
		o.IdentityCheckWait = -1
		if tweak != nil {
			tweak(name, o)
		}
		c.dirs[name], c.opts[name] = o.DataDir, o
	}
	release()
	for _, name := range c.names {
		c.start(name)
	}
	t.Cleanup(func() {
		for _, name := range c.names {
			c.stop(name)
		}
	})
	// The leader moves the log to the newest command encoding in the first
	// seconds (one command of its own); tests that count applied commands
	// begin after it.
	mixed := false
	for _, o := range c.opts {
		mixed = mixed || o.Testing.ReadsFormat != 0
	}
	for deadline := time.Now().Add(20 * time.Second); !mixed; time.Sleep(20 * time.Millisecond) {
		if c.nodes[c.leader()].machine.Format() == machine.ReadsFormat {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the log did not move to the newest command encoding")
		}
	}
	return c
}

func (c *raftCluster) start(name string) {
	c.t.Helper()
	o := *c.opts[name]
	r := *o.Raft
	o.Raft = &r
	nd := openNode(c.t, &o)
	if err := nd.Start(); err != nil {
		nd.Close()
		c.t.Fatal(err)
	}
	c.nodes[name] = nd
}

func (c *raftCluster) stop(name string) {
	if nd := c.nodes[name]; nd != nil {
		if err := nd.Close(); err != nil {
			c.t.Errorf("close %s: %v", name, err)
		}
		delete(c.nodes, name)
	}
}

// leader waits for a node that leads with its term begun.
func (c *raftCluster) leader() string {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, name := range c.names {
			if nd := c.nodes[name]; nd != nil && nd.rep.Ready() {
				return name
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("cluster %s elected no leader in 20s", c.id)
	return ""
}

// roles names the audit's three nodes of a cluster of three: L the leader,
// W and F the others.
func (c *raftCluster) roles() (l, w, f string) {
	l = c.leader()
	for _, name := range c.names {
		switch {
		case name == l:
		case w == "":
			w = name
		default:
			f = name
		}
	}
	return l, w, f
}

func (c *raftCluster) follower() string {
	l := c.leader()
	for _, name := range c.names {
		if name != l && c.nodes[name] != nil {
			return name
		}
	}
	c.t.Fatal("no follower running")
	return ""
}

func (c *raftCluster) client(name string) *client.Client { return client.New(c.nodes[name].URL(), nil) }

// converged waits until every running node holds the same digest, and
// returns it.
func (c *raftCluster) converged() store.Digest {
	c.t.Helper()
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var ds []store.Digest
		for _, name := range c.names {
			if nd := c.nodes[name]; nd != nil {
				if d, err := nd.Digest(); err == nil {
					ds = append(ds, d)
				}
			}
		}
		same := len(ds) == len(c.nodes)
		for _, d := range ds {
			same = same && d == ds[0]
		}
		if same && len(ds) > 0 {
			return ds[0]
		}
		last = fmt.Sprint(ds)
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("nodes of %s did not converge: %s", c.id, last)
	return store.Digest{}
}

// A follower that was down while the leader compacted its log gets the
// leader's tree (a snapshot that is a Pebble checkpoint), and so does a
// follower whose data directory was wiped; neither begins a stream.
func TestLaggingAndWipedFollowersCatchUpFromTheTree(t *testing.T) {
	c := newRaftCluster(t, "a", 3, func(_ string, o *Options) {
		o.Raft.SnapshotThreshold, o.Raft.TrailingLogs = 16, 4
	})
	leader := c.leader()
	f := c.follower()
	stream := c.nodes[leader].out.Stream()
	c.stop(f)
	ctx := context.Background()
	put := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := c.client(leader).Put(ctx, fmt.Sprintf("k%03d", i), []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(0, 100)
	if _, err := c.client(leader).Delete(ctx, "k000"); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[leader].group.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if first, _ := c.nodes[leader].group.LogBounds(); first < 50 {
		t.Fatalf("the leader's log still starts at %d: nothing to catch up from but the tree", first)
	}
	c.start(f)
	d := c.converged()
	if d.Keys != 99 || d.Tombstones != 1 {
		t.Fatalf("after catching up: %+v", d)
	}
	if got := c.nodes[f].out.Stream(); got != stream {
		t.Fatalf("the follower's stream %s, the cluster's %s", got, stream)
	}
	// Wiped: an empty data directory under the same node ID.
	c.stop(f)
	if err := os.RemoveAll(c.dirs[f]); err != nil {
		t.Fatal(err)
	}
	put(100, 150)
	if err := c.nodes[leader].group.Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.start(f)
	d = c.converged()
	if d.Keys != 149 {
		t.Fatalf("after the wiped follower caught up: %+v", d)
	}
	if got := c.nodes[f].out.Stream(); got != stream {
		t.Fatalf("the wiped follower's stream %s, the cluster's %s", got, stream)
	}
	// And it takes part: writes through it land everywhere.
	if _, err := c.client(f).Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if d := c.converged(); d.Keys != 150 {
		t.Fatalf("%+v", d)
	}
}

func TestNodeIDIsTheDirectorys(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir)
	o.NodeID = "a1"
	n := openNode(t, o)
	n.Close()
	o = testOptions(dir)
	o.NodeID = "a2"
	if _, err := Open(context.Background(), o); err == nil || !strings.Contains(err.Error(), "belongs to node a1") {
		t.Fatalf("a directory of a1 opened as a2: %v", err)
	}
	o = testOptions(dir) // no ID given: the directory's
	n = openNode(t, o)
	if n.nodeID != "a1" {
		t.Fatalf("node ID %q", n.nodeID)
	}
	n.Close()
}

// Two of three nodes are lost: the survivor cannot commit. The operator
// recovers it with peers.json naming it alone; it leads again, keeps the
// data, and seals the stream (writes the lost nodes shipped may be missing
// here, so their indexes must not be reused).
func TestRecoverAfterLosingTheMajority(t *testing.T) {
	c := newRaftCluster(t, "a", 3, nil)
	leader := c.leader()
	ctx := context.Background()
	for i := 0; i < 30; i++ {
		if _, err := c.client(leader).Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.converged()
	survivor := c.follower()
	old := c.nodes[survivor].out.Stream()
	for _, name := range c.names {
		if name != survivor {
			c.stop(name)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := c.client(survivor).Put(wctx, "lost", []byte("v"))
	cancel()
	if err == nil {
		t.Fatal("a node without a majority acknowledged a write")
	}
	c.stop(survivor)
	peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, survivor, c.opts[survivor].Raft.Listen)
	if err := os.WriteFile(filepath.Join(c.dirs[survivor], "cluster", "peers.json"), []byte(peers), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(survivor)
	if l := c.leader(); l != survivor {
		t.Fatalf("%s leads, not the survivor", l)
	}
	nd := c.nodes[survivor]
	if nd.out.Stream() == old {
		t.Fatal("the stream goes on after a recovery: its next indexes may mean writes the lost nodes shipped")
	}
	if _, err := c.client(survivor).Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	// The write refused for want of a majority had an unknown outcome: if
	// it reached the survivor's log, the recovery applied it.
	want := 31
	if _, err := nd.Get("lost"); err == nil {
		want = 32
	}
	if d, err := nd.Digest(); err != nil || d.Keys != want {
		t.Fatalf("%+v %v, want %d keys", d, err, want)
	}
	if _, err := os.Stat(nd.rep.SealFile()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the seal mark is left: %v", err)
	}
}

// The raft port needs credentials unless it serves loopback only.
func TestRaftPortNeedsCredentials(t *testing.T) {
	base := func(listen string) *Options {
		o := testOptions(t.TempDir())
		o.Raft = &RaftOptions{Listen: listen}
		o.Gossip = &GossipOptions{Bind: "127.0.0.1:7600"}
		o.EnsureDefaults()
		return o
	}
	if err := base("0.0.0.0:7500").Validate(); err == nil || !strings.Contains(err.Error(), "needs credentials") {
		t.Fatalf("a raft port on every address without credentials: %v", err)
	}
	if err := base("127.0.0.1:7500").Validate(); err != nil {
		t.Fatalf("a loopback raft port: %v", err)
	}
	o := base("0.0.0.0:7500")
	o.Gossip = &GossipOptions{Bind: "0.0.0.0:7600", Key: make([]byte, 32)}
	if err := o.Validate(); err != nil {
		t.Fatalf("with a gossip key: %v", err)
	}
	o = base("127.0.0.1:7500")
	o.APIToken = "secret"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("a loopback raft port without credentials beside an API token: %v", err)
	}
	o = base("127.0.0.1:7500")
	o.Gossip = nil
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "gossip") {
		t.Fatalf("a node of several without gossip: %v", err)
	}
	o = base("127.0.0.1:7500")
	o.Listen = "0.0.0.0:7400"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--advertise-api") {
		t.Fatalf("an API on every address without an advertised URL: %v", err)
	}
	o.Gossip.APIURL = "http://10.0.0.1:7400"
	if err := o.Validate(); err != nil {
		t.Fatalf("with --advertise-api: %v", err)
	}
}

// A removal that would leave no quorum of live voters is refused; a removed
// node is not added back while gossip still sees it, nor by hand.
func TestRemovedNodeStaysOut(t *testing.T) {
	c := newRaftCluster(t, "a", 3, nil)
	leader := c.leader()
	var victim, other string
	for _, name := range c.names {
		if name != leader {
			if victim == "" {
				victim = name
			} else {
				other = name
			}
		}
	}
	if err := c.nodes[other].RemoveNode(victim); err == nil {
		t.Fatal("a removal at a follower was made (the HTTP API forwards it; the Go API refuses)")
	}
	// other down: removing victim would leave the leader and a dead node.
	// The leader judges liveness by gossip: the removal is tried once
	// gossip says other is gone (before, it would rightly be taken, and
	// the test would remove a live voter with the third one down).
	c.stop(other)
	deadline := time.Now().Add(10 * time.Second)
	for gone := false; !gone; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the leader's gossip still sees %s alive", other)
		}
		gone = true
		for _, sv := range c.nodes[leader].group.Status().Servers {
			if sv.ID == other && sv.Alive {
				gone = false
			}
		}
	}
	var err error
	for time.Now().Before(deadline) {
		if err = c.nodes[leader].RemoveNode(victim); errors.Is(err, cluster.ErrQuorum) {
			break
		}
		time.Sleep(100 * time.Millisecond) // until gossip sees other gone
	}
	if !errors.Is(err, cluster.ErrQuorum) {
		t.Fatalf("a removal leaving no live quorum: %v", err)
	}
	c.start(other)
	leader = c.leader()
	for time.Now().Before(deadline.Add(10 * time.Second)) {
		if err = c.nodes[leader].RemoveNode(victim); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // until gossip sees other back
	}
	if err != nil {
		t.Fatalf("removing %s with both others live: %v", victim, err)
	}
	// gossip still sees the removed node alive: the leader must not add it
	// back over several reconcile periods
	time.Sleep(time.Second)
	for _, sv := range c.nodes[leader].group.Status().Servers {
		if sv.ID == victim {
			t.Fatalf("%s is back in the configuration", victim)
		}
	}
	if err := c.nodes[leader].JoinNode(victim, c.opts[victim].Raft.Listen, ""); !errors.Is(err, cluster.ErrRemoved) {
		t.Fatalf("joining a removed ID: %v", err)
	}
	r := c.nodes[leader].ClusterReport(context.Background())
	for _, cn := range r.Nodes {
		if cn.ID == victim && (cn.Voter || cn.State != "removed") {
			t.Fatalf("the report shows the removed node as %+v", cn)
		}
	}
	// The removed node, still running, learns it from the members that
	// refuse it: it stays up, and answers every read and write 503
	// removed (not stale values, not "knows no leader"), and fails
	// /readyz.
	v := c.nodes[victim]
	if why := awaitRemoved(v, 20*time.Second); why == "" {
		t.Fatalf("%s, removed, was never told (Ready: %v)", victim, v.Ready())
	}
	if _, err := v.Get("anything"); !errors.Is(err, api.ErrRemoved) {
		t.Fatalf("a read of the removed node: %v", err)
	}
	expectRemovedOverHTTP(t, v)

	// Restarted on its directory, as a supervisor would: the members
	// refuse it at open, and it stays up refusing, not exiting (an exit
	// would be restarted, and refused again, in a loop).
	c.stop(victim)
	o := *c.opts[victim]
	r2 := *o.Raft
	o.Raft = &r2
	nd, err := Open(context.Background(), &o)
	if err != nil {
		t.Fatalf("the removed node, restarted, did not open: %v", err)
	}
	defer nd.Close()
	if err := nd.Start(); err != nil {
		t.Fatalf("the removed node, restarted, did not start: %v", err)
	}
	if nd.group.Fenced() == nil {
		t.Fatal("the removed node, restarted, was not refused at open")
	}
	if why := awaitRemoved(nd, 5*time.Second); why == "" {
		t.Fatal("the removed node, restarted, does not say it was removed")
	}
	expectRemovedOverHTTP(t, nd)
	for _, sv := range c.nodes[leader].group.Status().Servers {
		if sv.ID == victim {
			t.Fatalf("%s is back in the configuration after its restart", victim)
		}
	}
}

// A node alone holding data, restarted with a raft port, goes on as the
// first of a cluster: its group of one elects itself on the network, the
// nodes started beside it are added, catch up, and the stream goes on.
func TestSingleNodeGrowsToThree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a1")
	o := testOptions(dir)
	o.NodeID = "a1"
	alone := openNode(t, o)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := alone.Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	stream := alone.out.Stream()
	if err := alone.Close(); err != nil {
		t.Fatal(err)
	}
	c := newRaftCluster(t, "a", 3, func(name string, o *Options) {
		if name == "a1" {
			o.DataDir = dir
		}
	})
	leader := c.leader()
	if leader != "a1" {
		t.Fatalf("%s leads; the node that held the data should (it is the only voter until it adds the others)", leader)
	}
	voters := func() int {
		n := 0
		for _, sv := range c.nodes["a1"].group.Status().Servers {
			if sv.Voter {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && voters() < 3 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := voters(); n != 3 {
		t.Fatalf("%d voters, want 3 (the others join as non-voters and vote once caught up)", n)
	}
	if _, err := c.client("a3").Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if d := c.converged(); d.Keys != 21 {
		t.Fatalf("%+v", d)
	}
	for _, name := range c.names {
		if got := c.nodes[name].out.Stream(); got != stream {
			t.Fatalf("%s's stream %s, the single node's was %s", name, got, stream)
		}
	}
	// The voters' addresses are the network's (the group of one's was its
	// in-memory transport's): the cluster survives its first node.
	c.stop("a1")
	if l := c.leader(); l == "a1" {
		t.Fatal("a stopped node leads")
	}
	if _, err := c.client("a2").Put(ctx, "without-a1", []byte("v")); err != nil {
		t.Fatal(err)
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
			c := newRaftCluster(t, "a", 3, nil)
			l, w, f := c.roles()
			ctx := context.Background()
			put := func(at, k string) {
				t.Helper()
				if _, err := c.client(at).Put(ctx, k, []byte("v")); err != nil {
					t.Fatalf("put %s at %s: %v", k, at, err)
				}
			}
			for i := 0; i < 10; i++ {
				put(l, fmt.Sprintf("before%d", i))
			}
			c.converged()
			backup := filepath.Join(t.TempDir(), "backup")
			if how == "restored" {
				c.stop(w)
				copyDir(t, c.dirs[w], backup)
				c.start(w)
				c.converged()
			}
			oldInc := c.nodes[w].incarnation
			c.stop(f)
			l = c.leader()
			for i := 0; i < 5; i++ {
				put(l, fmt.Sprintf("acked%d", i))
			}
			for _, name := range []string{l, w} {
				if name != "" {
					c.stop(name)
				}
			}
			if how == "identity-kept" {
				// Everything but its identity files goes (a partial wipe, or
				// identity files on a volume of their own): its raft state
				// is gone, so it is a new incarnation all the same.
				ents, _ := os.ReadDir(c.dirs[w])
				for _, e := range ents {
					if e.Name() != "NODE_ID" && e.Name() != origin.IncarnationFile {
						os.RemoveAll(filepath.Join(c.dirs[w], e.Name()))
					}
				}
			} else if err := os.RemoveAll(c.dirs[w]); err != nil {
				t.Fatal(err)
			}
			if how == "restored" {
				copyDir(t, backup, c.dirs[w])
				// A raw copy of a voter is refused: it would forget what it
				// acknowledged since the copy.
				o := *c.opts[w]
				if _, err := Open(ctx, &o); err == nil || !strings.Contains(err.Error(), "replicator restore") {
					t.Fatalf("a voter started from a raw copy: %v", err)
				}
				rep, err := datadir.Restore(c.dirs[w])
				if err != nil || !rep.Replaced || rep.Previous != oldInc || rep.Incarnation == oldInc {
					t.Fatalf("restore: %+v %v", rep, err)
				}
			}
			c.start(w)
			c.start(f)
			if got := c.nodes[w].incarnation; got == oldInc {
				t.Fatalf("%s came back %s under its old incarnation %s", w, how, got)
			}
			// Many election timeouts: F's log lacks the 5 writes, and W's
			// new life is no voter of this configuration.
			time.Sleep(3 * time.Second)
			for _, name := range []string{w, f} {
				if c.nodes[name].group.IsLeader() {
					t.Fatalf("%s was elected without the 5 acknowledged writes", name)
				}
			}
			c.start(l)
			c.leader()
			d := c.converged()
			if d.Keys != 15 {
				t.Fatalf("%d keys on every node, want 15 (10 before, 5 acknowledged): %+v", d.Keys, d)
			}
			for i := 0; i < 5; i++ {
				for _, name := range c.names {
					if _, err := c.nodes[name].Get(fmt.Sprintf("acked%d", i)); err != nil {
						t.Fatalf("%s lost acknowledged write acked%d: %v", name, i, err)
					}
				}
			}
			// W's new incarnation votes; the old one is out for good.
			ld := c.nodes[c.leader()]
			deadline := time.Now().Add(20 * time.Second)
			for {
				var ok bool
				voters := 0
				for _, sv := range ld.group.Status().Servers {
					if sv.Voter {
						voters++
					}
					if sv.ID == w && sv.Voter && sv.Incarnation == c.nodes[w].incarnation {
						ok = true
					}
				}
				if ok && voters == 3 && len(ld.group.Status().Servers) == 3 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("configuration %+v: want %s's new incarnation voting and its old one gone", ld.group.Status().Servers, w)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if why := ld.rep.RemovedServer(cluster.ServerID(w, oldInc)); why == "" {
				t.Fatalf("%s's old incarnation %s is not recorded as removed", w, oldInc)
			}
			// And the cluster takes writes at every node.
			for _, name := range c.names {
				put(name, "after-"+name)
			}
			if d := c.converged(); d.Keys != 18 {
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
			c := newRaftCluster(t, "a", 3, nil)
			leader := c.leader()
			ctx := context.Background()
			for i := 0; i < 20; i++ {
				if _, err := c.client(leader).Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			c.converged()
			survivor := c.follower()
			var lost []string
			lostIDs := map[string]raft.ServerID{}
			for _, name := range c.names {
				if name != survivor {
					lost = append(lost, name)
					lostIDs[name] = c.nodes[name].group.ID()
				}
			}
			old := c.nodes[survivor].out.Stream()
			for _, name := range c.names {
				c.stop(name)
			}
			peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, survivor, c.opts[survivor].Raft.Listen)
			gdir := filepath.Join(c.dirs[survivor], "cluster")
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
			c.start(survivor)
			select {
			case <-fired:
			case <-time.After(20 * time.Second):
				t.Fatalf("the recovery's first term never reached %s", stopAt)
			}
			sealedInto := c.nodes[survivor].out.Stream()
			c.stop(survivor)
			replica.RecoveryStepHook.Store(nil)
			if _, err := os.Stat(filepath.Join(gdir, cluster.PeersFile)); err != nil {
				t.Fatalf("peers.json went before the recovery's commands committed: %v", err)
			}

			c.start(survivor)
			if l := c.leader(); l != survivor {
				t.Fatalf("%s leads", l)
			}
			nd := c.nodes[survivor]
			switch got := nd.out.Stream(); {
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
				if why := nd.rep.RemovedServer(id); !strings.Contains(why, "recovered") {
					t.Fatalf("%s (%s) is not recorded as lost in the recovery: %q", name, id, why)
				}
			}
			if _, err := c.client(survivor).Put(ctx, "after", []byte("v")); err != nil {
				t.Fatal(err)
			}

			// Both lost nodes come back with their old directories (a
			// majority of the old configuration): each is refused and told
			// why (at its start, or as soon as a member tells it), and the
			// survivor's report shows it removed. Neither takes part.
			for _, back := range lost {
				o := *c.opts[back]
				r := *o.Raft
				o.Raft = &r
				why := ""
				nd2, err := Open(ctx, &o)
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
					if _, err := nd2.store.Get("after"); !errors.Is(err, store.ErrNotFound) {
						t.Fatalf("the lost node %s holds a write of the recovered cluster: %v", back, err)
					}
					select {
					case <-nd2.Fatal():
						t.Fatalf("the lost node %s stopped (a supervisor would restart it in a loop): %v", back, nd2.FatalErr())
					default:
					}
					nd2.Close()
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
			if len(nd.group.Status().Servers) != 1 {
				t.Fatalf("configuration %+v", nd.group.Status().Servers)
			}

			// Wiped, both lost nodes come back as new members.
			for _, name := range lost {
				c.stop(name)
				if err := os.RemoveAll(c.dirs[name]); err != nil {
					t.Fatal(err)
				}
				c.start(name)
			}
			if d := c.converged(); d.Keys != 21 {
				t.Fatalf("%+v", d)
			}
		})
	}
}

// TestTruncationOfAppliedEntriesStopsTheNode (issue 24): raft cuts only
// entries that were never committed, and a node applies only committed
// ones, so raft cutting an applied entry is proof that its assumptions
// broke. Here a voter is put back from an old copy that keeps its identity
// (a block-level snapshot of its disk, restored without replicator
// restore: nothing can tell), votes for a node whose log lacks 5
// acknowledged writes, and that node leads. When
// the old leader, which applied the 5 writes, comes back, the new leader's
// log overrides them: the old leader stops with a clear error instead of
// cutting its log and keeping a tree of another history.
func TestTruncationOfAppliedEntriesStopsTheNode(t *testing.T) {
	c := newRaftCluster(t, "a", 3, nil)
	l, w, f := c.roles()
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if _, err := c.client(l).Put(ctx, fmt.Sprintf("before%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.converged()
	backup := filepath.Join(t.TempDir(), "backup")
	c.stop(w)
	copyDir(t, c.dirs[w], backup)
	c.start(w)
	c.converged()
	c.stop(f)
	l = c.leader()
	for i := 0; i < 5; i++ {
		if _, err := c.client(l).Put(ctx, fmt.Sprintf("acked%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// Read once it stopped: a command of its own (a format raise, a
	// collection) may still apply up to then.
	ln := c.nodes[l]
	c.stop(l)
	applied := ln.rep.Applied()
	c.stop(w)
	// W's disk is put back from the copy taken before the 5 writes, by a
	// block-level snapshot that keeps its files' identity: nothing can
	// tell (origin.Refingerprint stands for that).
	if err := os.RemoveAll(c.dirs[w]); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, c.dirs[w])
	if err := origin.Refingerprint(c.dirs[w]); err != nil {
		t.Fatal(err)
	}
	c.start(w)
	c.start(f)
	deadline := time.Now().Add(20 * time.Second)
	for !c.nodes[f].rep.Ready() && !c.nodes[w].rep.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("neither F nor W, whose logs lack the 5 writes, was elected (the hazard this test needs)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.start(l)
	select {
	case <-c.nodes[l].Fatal():
	case <-time.After(20 * time.Second):
		t.Fatal("the old leader did not stop when raft cut entries it applied")
	}
	err := c.nodes[l].FatalErr()
	if !errors.Is(err, wal.ErrAppliedTruncated) {
		t.Fatalf("stopped with %v", err)
	}
	// Its tree and log are as they were: the evidence is kept.
	if got := c.nodes[l].rep.Applied(); got != applied {
		t.Fatalf("applied %d, was %d", got, applied)
	}
	for i := 0; i < 5; i++ {
		if _, err := c.nodes[l].Get(fmt.Sprintf("acked%d", i)); err != nil {
			t.Fatalf("the stopped node lost acked%d: %v", i, err)
		}
	}
	if err := c.nodes[l].Ready(); err == nil {
		t.Fatal("a stopped node says it is ready")
	}
}

// skewedClock is the system clock moved by an offset a test changes.
type skewedClock struct{ offset atomic.Int64 }

func (c *skewedClock) Now() int64 { return hlc.SystemClock{}.Now() + c.offset.Load() }

// TestRetryAtALeaderWhoseClockIsBehindIsAnsweredFromItsRecord (issue 24):
// a write under an idempotency scope applies at a leader; the leader goes,
// and the one elected next runs 2 s behind the scope's pinned stamp (more
// than the 500 ms clock offset allowed). The retry is answered from the
// first attempt's record, not refused as a pin out of the window although
// it applied.
func TestRetryAtALeaderWhoseClockIsBehindIsAnsweredFromItsRecord(t *testing.T) {
	clocks := map[string]*skewedClock{}
	c := newRaftCluster(t, "a", 3, func(name string, o *Options) {
		clocks[name] = &skewedClock{}
		o.Clock, o.MaxClockOffset = clocks[name], 500*time.Millisecond
	})
	first := c.leader()
	ctx := policy.WithKey(context.Background(), policy.KeyFromID("order-17", time.Now()))
	res, err := c.nodes[first].Put(ctx, "order/17", []byte("paid"))
	if err != nil {
		t.Fatal(err)
	}
	c.converged()
	for name, ck := range clocks {
		if name != first {
			ck.offset.Store(int64(-2 * time.Second))
		}
	}
	c.stop(first)
	next := c.leader()
	again, err := c.nodes[next].Put(ctx, "order/17", []byte("paid"))
	if err != nil {
		t.Fatalf("the retry at %s (clock 2 s behind the pin): %v", next, err)
	}
	if again.Version != res.Version || again.Replay == nil {
		t.Fatalf("the retry was not answered from the first attempt's record: %+v, first %+v", again, res)
	}
	// A new write under another scope pinned 2 s ahead is still refused:
	// the pin check stands for what did not apply.
	fresh := policy.WithKey(context.Background(), policy.KeyFromID("order-18", time.Now()))
	if _, err := c.nodes[next].Put(fresh, "order/18", []byte("paid")); !errors.Is(err, api.ErrPinOutOfWindow) {
		t.Fatalf("a new write pinned 2 s ahead of the leader's clock: %v", err)
	}
}

// A node alone put back from a copy goes through replicator restore too: it
// gets a new incarnation, renames its group of one, and goes on with its
// data.
func TestRestoredNodeAloneRenamesItsGroup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a1")
	o := testOptions(dir)
	n := openNode(t, o)
	ctx := context.Background()
	if _, err := n.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	inc := n.incarnation
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "a1-copy")
	copyDir(t, dir, copied)
	rep, err := datadir.Restore(copied)
	if err != nil || !rep.Replaced || rep.Previous != inc || rep.Servers != 1 {
		t.Fatalf("restore: %+v %v", rep, err)
	}
	n = openNode(t, testOptions(copied))
	defer n.Close()
	if n.incarnation != rep.Incarnation {
		t.Fatalf("incarnation %s, restore minted %s", n.incarnation, rep.Incarnation)
	}
	if rec, err := n.Get("k"); err != nil || string(rec.Value) != "v" {
		t.Fatalf("the restored node's data: %v %v", rec, err)
	}
	if _, err := n.Put(ctx, "after", []byte("v")); err != nil {
		t.Fatalf("a write after the restore: %v", err)
	}
	if id := n.group.ID(); id != cluster.ServerID(n.nodeID, rep.Incarnation) {
		t.Fatalf("raft knows the node as %s", id)
	}
}

// Issue 25, finding 5: three joins of unreachable addresses left the
// cluster unable to elect (each was added as a voter at once). A join now
// asks the node's raft port who it is first, and adds it as a non-voter:
// an address nobody answers at is refused, and the voters stay as they were.
func TestJoinOfUnreachableAddressesRefused(t *testing.T) {
	c := newRaftCluster(t, "a", 3, nil)
	l := c.leader()
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	release() // nobody listens there
	for i, addr := range free {
		if err := c.nodes[l].JoinNode(fmt.Sprintf("ghost%d", i), addr, ""); err == nil {
			t.Fatalf("a join of %s, where nobody answers, was accepted", addr)
		}
	}
	if n := len(c.nodes[l].group.Status().Servers); n != 3 {
		t.Fatalf("%d servers after the refused joins", n)
	}
	// Forced (the operator's stated emergency), they are added, as
	// non-voters: the voters stay the three.
	for i, addr := range free {
		if err := c.nodes[l].JoinNode(fmt.Sprintf("ghost%d", i), addr, "the node is being rebuilt"); err != nil {
			t.Fatalf("a forced join of %s: %v", addr, err)
		}
	}
	voters := 0
	for _, sv := range c.nodes[l].group.Status().Servers {
		if sv.Voter {
			voters++
		}
	}
	if voters != 3 {
		t.Fatalf("%d voters after the forced joins, want 3", voters)
	}
	// And the cluster elects and commits after its leader goes.
	c.stop(l)
	next := c.leader()
	if _, err := c.client(next).Put(context.Background(), "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// Whoever answers at an address gossip reports may claim to be a member and
// refuse the leader: only a member of the configuration, at the address the
// configuration holds for it, can make a node stop. Here a process with the
// same libraries gossips a made-up node of cluster a whose "raft port"
// answers every dial as an existing member and refuses it: the leader goes
// on leading and adds nothing.
func TestRefusalFromAnImpostorDoesNotStopTheLeader(t *testing.T) {
	c := newRaftCluster(t, "a", 3, nil)
	l, w, _ := c.roles()
	fake, err := raftconn.Listen("127.0.0.1:0", nil, raftconn.Options{Cluster: "a", ID: string(c.nodes[w].group.ID()), Loopback: true,
		Refuse: func(string) string { return "removed by an operator (an impostor says)" }})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	go func() {
		// Exits when fake closes.
		for {
			conn, err := fake.Accept()
			if err != nil {
				return
			}
			go func() { conn.Read(make([]byte, 1)); conn.Close() }() // the check answers the preamble
		}
	}()
	free, release, err := ports.Hold(1)
	if err != nil {
		t.Fatal(err)
	}
	release()
	evil, err := discovery.Start(discovery.Options{NodeName: "a-evil", Bind: free[0], Profile: "local",
		Join: []string{c.opts[l].Gossip.Bind}, Logger: quiet,
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: "evil", Inc: "0badc0de", Raft: fake.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Leave(time.Second)
	evil.JoinLoop(make(chan struct{}))
	time.Sleep(3 * time.Second) // a dozen membership rounds
	nd := c.nodes[l]
	select {
	case <-nd.Fatal():
		t.Fatalf("an impostor's refusal stopped the leader: %v", nd.FatalErr())
	default:
	}
	if err := nd.rep.Removed(); err != nil {
		t.Fatalf("an impostor's refusal put the leader out of its cluster: %v", err)
	}
	if !nd.rep.Ready() {
		t.Fatal("the leader no longer leads")
	}
	for _, sv := range nd.group.Status().Servers {
		if sv.ID == "evil" {
			t.Fatalf("the impostor was added: %+v", sv)
		}
	}
	if _, err := c.client(l).Put(context.Background(), "after", []byte("v")); err != nil {
		t.Fatal(err)
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
	c := newRaftCluster(t, "a", 5, nil)
	l := c.leader()
	var w, f string
	for _, name := range c.names {
		switch {
		case name == l:
		case w == "":
			w = name
		case f == "":
			f = name
		}
	}
	ctx := context.Background()
	if _, err := c.client(l).Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.converged()
	fID := c.nodes[f].group.ID()
	c.stop(f)
	oldW := c.nodes[w].group.ID()
	c.stop(w)
	if err := os.RemoveAll(c.dirs[w]); err != nil {
		t.Fatal(err)
	}
	c.start(w)
	newW := c.nodes[w].group.ID()
	if newW == oldW {
		t.Fatalf("the wiped node kept its identity %s", oldW)
	}
	_, newInc := cluster.SplitServerID(newW)
	// W's new incarnation votes, and its old one is gone, before the
	// majority is lost.
	deadline := time.Now().Add(30 * time.Second)
	for {
		voter, n := false, 0
		for _, sv := range c.nodes[l].group.Status().Servers {
			if sv.ID == w {
				n++
				voter = sv.Incarnation == newInc && sv.Voter
			}
		}
		if voter && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not a voter in place of %s: %+v", newW, oldW, c.nodes[l].group.Status().Servers)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.client(l).Put(ctx, "k2", []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.converged()
	// Every node but F goes; W is recovered alone.
	for _, name := range c.names {
		c.stop(name)
	}
	peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, newW, c.opts[w].Raft.Listen)
	if err := os.WriteFile(filepath.Join(c.dirs[w], "cluster", cluster.PeersFile), []byte(peers), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(w)
	if got := c.leader(); got != w {
		t.Fatalf("%s leads after recovering %s", got, w)
	}
	if why := c.nodes[w].rep.RemovedServer(fID); !strings.Contains(why, "recovered") {
		t.Fatalf("F (%s) is not recorded as lost in the recovery: %q", fID, why)
	}
	// F comes back with its old directory: it must stop, saying why.
	o := *c.opts[f]
	r := *o.Raft
	o.Raft = &r
	// It opens and starts either way (refused at open, or at its first
	// contact): a node that exits is restarted by its supervisor in a loop.
	nd, err := Open(ctx, &o)
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

// expectRemovedOverHTTP: a node its cluster put out answers reads and
// writes 503 removed and fails /readyz, and stays up (it answers, and its
// Fatal is not closed: a supervisor would restart an exiting node in a
// loop).
func expectRemovedOverHTTP(t *testing.T, n *Node) {
	t.Helper()
	for _, req := range []struct{ method, path, want string }{
		{http.MethodGet, "/v1/kv/k", `"code":"removed"`},
		{http.MethodPut, "/v1/kv/k", `"code":"removed"`},
		{http.MethodGet, "/readyz", "removed"},
	} {
		r, _ := http.NewRequest(req.method, n.URL()+req.path, strings.NewReader("v"))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatalf("%s %s: %v", req.method, req.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), req.want) {
			t.Fatalf("%s %s on a removed node: %d %s", req.method, req.path, resp.StatusCode, body)
		}
	}
	select {
	case <-n.Fatal():
		t.Fatalf("the removed node stopped: %v", n.FatalErr())
	default:
	}
}

// awaitRemoved waits for n to learn its cluster removed it, and returns why
// ("" if it did not within d).
func awaitRemoved(n *Node, d time.Duration) string {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := n.Ready(); errors.Is(err, api.ErrRemoved) {
			return err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ""
}

// Issue 25, finding 2: a gossip member without any credential advertised
// the leader's node ID with URLs of its own. Followers forwarded client
// writes there with the client's bearer token and acknowledged its fake
// answers; /admin/cluster sent it the token; a follower's not_leader
// answer named it. Now a follower forwards to the server raft names as
// leader, over the raft port, and hands out only what that server said of
// itself there: the impostor receives nothing.
func TestImpostorOfTheLeaderGetsNoRequests(t *testing.T) {
	c := newRaftCluster(t, "a", 3, func(_ string, o *Options) {
		o.APIToken = "the-token"
		o.InsecurePeers = true // the raft port without credentials, beside a token (tests only)
	})
	l, w, _ := c.roles()
	var mu sync.Mutex
	var got []string
	fake := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		io.WriteString(rw, `{"key":"k","version":"1.0@a","origin":"a"}`)
	}))
	defer fake.Close()
	free, release, err := ports.Hold(1)
	if err != nil {
		t.Fatal(err)
	}
	release()
	evil, err := discovery.Start(discovery.Options{NodeName: "a-" + l + "-evil", Bind: free[0], Profile: "local",
		Join: []string{c.opts[w].Gossip.Bind}, Logger: quiet,
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: l, Inc: c.nodes[l].incarnation,
			Raft: c.nodes[l].group.Addr(), API: fake.URL, Replicate: fake.URL}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Leave(time.Second)
	evil.JoinLoop(make(chan struct{}))
	// Until the follower's gossip holds the impostor.
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen := false
		for _, m := range c.nodes[w].gossip.SameCluster() {
			seen = seen || m.Meta.API == fake.URL
		}
		if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower's gossip never saw the impostor")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cl := client.New(c.nodes[w].URL(), &client.Options{Token: "the-token"})
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, err := cl.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if rec, err := c.nodes[l].Get(k); err != nil || string(rec.Value) != "v" {
			t.Fatalf("a write the follower acknowledged is not on the leader: %v %v", rec, err)
		}
	}
	var rep api.ClusterReport
	if _, err := cl.Do(ctx, http.MethodGet, "/admin/cluster", nil, nil, &rep); err != nil {
		t.Fatal(err)
	}
	for _, cn := range rep.Nodes {
		if cn.API == fake.URL {
			t.Fatalf("admin cluster shows the impostor's URL for %s", cn.ID)
		}
	}
	leads, leader, nodes := c.nodes[w].acceptorLeadership()()
	if leads || leader != c.nodes[l].PeerURL() {
		t.Fatalf("a follower's not_leader answer names %q, not the leader's %q", leader, c.nodes[l].PeerURL())
	}
	for _, u := range nodes {
		if u == fake.URL {
			t.Fatalf("acks name the impostor's URL: %v", nodes)
		}
	}
	// A member that cannot be asked (down) is not replaced by what gossip
	// says of it: an impostor claiming it is not handed out in acks.
	_, _, f := c.roles()
	fInc := c.nodes[f].incarnation
	c.stop(f)
	free2, release2, err := ports.Hold(1)
	if err != nil {
		t.Fatal(err)
	}
	release2()
	evil2, err := discovery.Start(discovery.Options{NodeName: "a-" + f + "-evil", Bind: free2[0], Profile: "local",
		Join: []string{c.opts[w].Gossip.Bind}, Logger: quiet,
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: f, Inc: fInc,
			Raft: c.opts[f].Raft.Listen, API: fake.URL, Replicate: fake.URL}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil2.Leave(time.Second)
	evil2.JoinLoop(make(chan struct{}))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		alive := false
		for _, m := range c.nodes[w].gossip.SameCluster() {
			alive = alive || (m.Meta.Node == f && m.Meta.API == fake.URL && m.State == api.LiveAlive)
		}
		if alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower's gossip never saw the impostor of the stopped node")
		}
	}
	time.Sleep(2500 * time.Millisecond) // two refreshes of the URLs acks hand out
	_, _, nodes = c.nodes[w].acceptorLeadership()()
	for _, u := range nodes {
		if u == fake.URL {
			t.Fatalf("acks name the impostor of a node that is down: %v", nodes)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) > 0 {
		t.Fatalf("the impostor received %d requests: %v", len(got), got)
	}
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
	c := newRaftCluster(t, "a", 3, func(name string, o *Options) {
		o.Gossip.Key = gossipKey
		if name != "a1" {
			o.Raft.Key, o.Raft.AcceptGossipKey = raftKey, true
		}
	})
	ctx := context.Background()
	write := func(round int) {
		t.Helper()
		for _, name := range c.names {
			if c.nodes[name] == nil {
				continue
			}
			k := fmt.Sprintf("r%d/%s", round, name)
			var err error
			for try := 0; try < 50; try++ { // an election may be under way after a restart
				if _, err = c.client(name).Put(ctx, k, []byte("v")); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("round %d: a write through %s: %v", round, name, err)
			}
		}
	}
	c.leader()
	write(0)
	c.converged()
	restart := func(name string, key []byte, accept bool) {
		t.Helper()
		c.stop(name)
		c.opts[name].Raft.Key, c.opts[name].Raft.AcceptGossipKey = key, accept
		c.start(name)
		c.leader()
	}
	restart("a1", raftKey, true)
	write(1)
	for i, name := range c.names {
		restart(name, raftKey, false)
		write(2 + i)
	}
	d := c.converged()
	if d.Keys != 3*5 {
		t.Fatalf("%d keys after the upgrade, want %d", d.Keys, 3*5)
	}
	// Another cluster's node with the shared gossip key claims cluster a.
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	release()
	o := testOptions(filepath.Join(t.TempDir(), "a9"))
	o.NodeID, o.Listen = "a9", free[0]
	o.Raft = &RaftOptions{Listen: free[1], ElectionTimeout: 300 * time.Millisecond}
	o.Gossip = &GossipOptions{Bind: free[2], Profile: "local", Key: gossipKey, Join: []string{c.opts["a1"].Gossip.Bind}}
	o.IdentityCheckWait = -1
	evil := openNode(t, o)
	defer evil.Close()
	if err := evil.Start(); err != nil {
		t.Fatal(err)
	}
	l := c.leader()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, sv := range c.nodes[l].group.Status().Servers {
			if sv.ID == "a9" {
				t.Fatalf("a node holding only the shared gossip key was added: %+v", sv)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	seen := false
	for _, m := range c.nodes[l].gossip.SameCluster() {
		seen = seen || m.Meta.Node == "a9"
	}
	if !seen {
		t.Fatal("the leader's gossip never saw a9: the test proved nothing")
	}
}

// A membership change sent to a follower reaches the leader over the raft
// port without the caller's token; the leader logs whom the follower
// verified (X-Replicator-Caller, trusted on the raft port only) and which
// node forwarded it. A caller's own X-Replicator-Caller on the API is not
// believed.
func TestForwardedChangeNamesItsCaller(t *testing.T) {
	logs := map[string]*syncBuffer{}
	c := newRaftCluster(t, "a", 3, func(name string, o *Options) {
		logs[name] = &syncBuffer{}
		o.Logger = slog.New(slog.NewTextHandler(logs[name], nil))
		o.APIToken = "the-token"
		o.InsecurePeers = true // the raft port without credentials, beside a token (tests only)
	})
	l, w, _ := c.roles()
	cl := client.New(c.nodes[w].URL(), &client.Options{Token: "the-token"})
	free, release, err := ports.Hold(1)
	if err != nil {
		t.Fatal(err)
	}
	release()
	body := fmt.Appendf(nil, `{"id": "ghost", "raft": %q, "force": "a drill"}`, free[0])
	if _, err := cl.Do(context.Background(), http.MethodPost, "/admin/cluster/join", body,
		http.Header{"Content-Type": {"application/json"}, forward.HeaderCaller: {"certificate CN=admin (forged)"}}, nil); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`caller="admin token, forwarded by %s"`, c.nodes[w].group.ID())
	if got := logs[l].String(); !strings.Contains(got, want) {
		t.Fatalf("the leader's log does not name the caller as %s:\n%s", want, tail(got, 5))
	}
	if strings.Contains(logs[l].String(), "forged") {
		t.Fatal("the caller's own X-Replicator-Caller reached the leader's log")
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
