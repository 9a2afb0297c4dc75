package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/datadir"
	"github.com/replicator/replicator/discovery"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/hlc"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/wal"
)

func TestNodeIDIsTheDirectorys(t *testing.T) {
	dir := t.TempDir()
	o := opts(dir)
	o.NodeID = "a1"
	n := nodetest.Open(t, o)
	n.Close()
	o = opts(dir)
	o.NodeID = "a2"
	if _, err := node.Open(context.Background(), o); err == nil || !strings.Contains(err.Error(), "belongs to node a1") {
		t.Fatalf("a directory of a1 opened as a2: %v", err)
	}
	o = opts(dir) // no ID given: the directory's
	n = nodetest.Open(t, o)
	if n.LocalCluster().Node != "a1" {
		t.Fatalf("node ID %q", n.LocalCluster().Node)
	}
	n.Close()
}

// Two of three nodes are lost: the survivor cannot commit. The operator
// recovers it with peers.json naming it alone; it leads again, keeps the
// data, and seals the stream (writes the lost nodes shipped may be missing
// here, so their indexes must not be reused).
func TestRecoverAfterLosingTheMajority(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, nil)
	leader := c.Leader()
	ctx := context.Background()
	for i := 0; i < 30; i++ {
		if _, err := c.Client(leader).Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.Converged()
	survivor := c.Follower()
	old := c.Nodes[survivor].OriginReport().Stream
	for _, name := range c.Names {
		if name != survivor {
			c.Stop(name)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := c.Client(survivor).Put(wctx, "lost", []byte("v"))
	cancel()
	if err == nil {
		t.Fatal("a node without a majority acknowledged a write")
	}
	c.Stop(survivor)
	peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, survivor, c.Opts[survivor].Raft.Listen)
	if err := os.WriteFile(filepath.Join(c.Dirs[survivor], "cluster", "peers.json"), []byte(peers), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Start(survivor)
	if l := c.Leader(); l != survivor {
		t.Fatalf("%s leads, not the survivor", l)
	}
	nd := c.Nodes[survivor]
	if nd.OriginReport().Stream == old {
		t.Fatal("the stream goes on after a recovery: its next indexes may mean writes the lost nodes shipped")
	}
	if _, err := c.Client(survivor).Put(ctx, "after", []byte("v")); err != nil {
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
	if _, err := os.Stat(filepath.Join(c.Dirs[survivor], "cluster", "SEAL")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the seal mark is left: %v", err)
	}
}

// The raft port needs credentials unless it serves loopback only.
func TestRaftPortNeedsCredentials(t *testing.T) {
	base := func(listen string) *node.Options {
		o := opts(t.TempDir())
		o.Raft = &node.RaftOptions{Listen: listen}
		o.Gossip = &node.GossipOptions{Bind: "127.0.0.1:7600"}
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
	o.Gossip = &node.GossipOptions{Bind: "0.0.0.0:7600", Key: make([]byte, 32)}
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
	c := nodetest.NewCluster(t, "a", 3, nil)
	leader := c.Leader()
	var victim, other string
	for _, name := range c.Names {
		if name != leader {
			if victim == "" {
				victim = name
			} else {
				other = name
			}
		}
	}
	if err := c.Nodes[other].RemoveNode(victim); err == nil {
		t.Fatal("a removal at a follower was made (the HTTP API forwards it; the Go API refuses)")
	}
	// other down: removing victim would leave the leader and a dead node.
	// The leader judges liveness by gossip: the removal is tried once
	// gossip says other is gone (before, it would rightly be taken, and
	// the test would remove a live voter with the third one down).
	c.Stop(other)
	deadline := time.Now().Add(10 * time.Second)
	for gone := false; !gone; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the leader's gossip still sees %s alive", other)
		}
		gone = true
		for _, sv := range servers(c.Nodes[leader]) {
			if sv.ID == other && sv.Gossip == api.LiveAlive {
				gone = false
			}
		}
	}
	var err error
	for time.Now().Before(deadline) {
		if err = c.Nodes[leader].RemoveNode(victim); errors.Is(err, cluster.ErrQuorum) {
			break
		}
		time.Sleep(100 * time.Millisecond) // until gossip sees other gone
	}
	if !errors.Is(err, cluster.ErrQuorum) {
		t.Fatalf("a removal leaving no live quorum: %v", err)
	}
	c.Start(other)
	leader = c.Leader()
	for time.Now().Before(deadline.Add(10 * time.Second)) {
		if err = c.Nodes[leader].RemoveNode(victim); err == nil {
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
	for _, sv := range servers(c.Nodes[leader]) {
		if sv.ID == victim {
			t.Fatalf("%s is back in the configuration", victim)
		}
	}
	if err := c.Nodes[leader].JoinNode(victim, c.Opts[victim].Raft.Listen, ""); !errors.Is(err, cluster.ErrRemoved) {
		t.Fatalf("joining a removed ID: %v", err)
	}
	r := c.Nodes[leader].ClusterReport(context.Background())
	for _, cn := range r.Nodes {
		if cn.ID == victim && (cn.Voter || cn.State != "removed") {
			t.Fatalf("the report shows the removed node as %+v", cn)
		}
	}
	// The removed node, still running, learns it from the members that
	// refuse it: it stays up, and answers every read and write 503
	// removed (not stale values, not "knows no leader"), and fails
	// /readyz.
	v := c.Nodes[victim]
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
	c.Stop(victim)
	o := *c.Opts[victim]
	r2 := *o.Raft
	o.Raft = &r2
	nd, err := node.Open(context.Background(), &o)
	if err != nil {
		t.Fatalf("the removed node, restarted, did not open: %v", err)
	}
	defer nd.Close()
	if err := nd.Start(); err != nil {
		t.Fatalf("the removed node, restarted, did not start: %v", err)
	}
	if err := nd.Ready(); !errors.Is(err, api.ErrRemoved) {
		t.Fatalf("the removed node, restarted, was not refused at open: %v", err)
	}
	if why := awaitRemoved(nd, 5*time.Second); why == "" {
		t.Fatal("the removed node, restarted, does not say it was removed")
	}
	expectRemovedOverHTTP(t, nd)
	for _, sv := range servers(c.Nodes[leader]) {
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
	o := opts(dir)
	o.NodeID = "a1"
	alone := nodetest.Open(t, o)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := alone.Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	stream := alone.OriginReport().Stream
	if err := alone.Close(); err != nil {
		t.Fatal(err)
	}
	c := nodetest.NewCluster(t, "a", 3, func(name string, o *node.Options) {
		if name == "a1" {
			o.DataDir = dir
		}
	})
	leader := c.Leader()
	if leader != "a1" {
		t.Fatalf("%s leads; the node that held the data should (it is the only voter until it adds the others)", leader)
	}
	voters := func() int {
		n := 0
		for _, sv := range servers(c.Nodes["a1"]) {
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
	if _, err := c.Client("a3").Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if d := c.Converged(); d.Keys != 21 {
		t.Fatalf("%+v", d)
	}
	for _, name := range c.Names {
		if got := c.Nodes[name].OriginReport().Stream; got != stream {
			t.Fatalf("%s's stream %s, the single node's was %s", name, got, stream)
		}
	}
	// The voters' addresses are the network's (the group of one's was its
	// in-memory transport's): the cluster survives its first node.
	c.Stop("a1")
	if l := c.Leader(); l == "a1" {
		t.Fatal("a stopped node leads")
	}
	if _, err := c.Client("a2").Put(ctx, "without-a1", []byte("v")); err != nil {
		t.Fatal(err)
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
	c := nodetest.NewCluster(t, "a", 3, nil)
	l, w, f := c.Roles()
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if _, err := c.Client(l).Put(ctx, fmt.Sprintf("before%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.Converged()
	backup := filepath.Join(t.TempDir(), "backup")
	c.Stop(w)
	nodetest.CopyDir(t, c.Dirs[w], backup)
	c.Start(w)
	c.Converged()
	c.Stop(f)
	l = c.Leader()
	for i := 0; i < 5; i++ {
		if _, err := c.Client(l).Put(ctx, fmt.Sprintf("acked%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// Read once it stopped: a command of its own (a format raise, a
	// collection) may still apply up to then.
	ln := c.Nodes[l]
	c.Stop(l)
	applied := ln.LocalCluster().Applied
	c.Stop(w)
	// W's disk is put back from the copy taken before the 5 writes, by a
	// block-level snapshot that keeps its files' identity: nothing can
	// tell (origin.Refingerprint stands for that).
	if err := os.RemoveAll(c.Dirs[w]); err != nil {
		t.Fatal(err)
	}
	nodetest.CopyDir(t, backup, c.Dirs[w])
	if err := origin.Refingerprint(c.Dirs[w]); err != nil {
		t.Fatal(err)
	}
	c.Start(w)
	c.Start(f)
	deadline := time.Now().Add(20 * time.Second)
	for !(c.Nodes[f].LocalCluster().State == "leader") && !(c.Nodes[w].LocalCluster().State == "leader") {
		if time.Now().After(deadline) {
			t.Fatal("neither F nor W, whose logs lack the 5 writes, was elected (the hazard this test needs)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A write of the new term committed before the old leader returns: its
	// log (the 5 writes of an older term) is then not the more up to date,
	// so it cannot win an election of its own on a loaded machine (a CI
	// run saw it lead again, and nothing was cut).
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		for _, n := range []string{f, w} {
			if c.Nodes[n].LocalCluster().State == "leader" {
				_, err := c.Client(n).Put(ctx, "new-term", []byte("v"))
				return err == nil, fmt.Sprintf("a write at the new leader %s: %v", n, err)
			}
		}
		return false, "no leader among F and W"
	})
	c.Start(l)
	select {
	case <-c.Nodes[l].Fatal():
	case <-time.After(20 * time.Second):
		t.Fatal("the old leader did not stop when raft cut entries it applied")
	}
	err := c.Nodes[l].FatalErr()
	if !errors.Is(err, wal.ErrAppliedTruncated) {
		t.Fatalf("stopped with %v", err)
	}
	// Its tree and log are as they were: the evidence is kept.
	if got := c.Nodes[l].LocalCluster().Applied; got != applied {
		t.Fatalf("applied %d, was %d", got, applied)
	}
	for i := 0; i < 5; i++ {
		if _, err := c.Nodes[l].Get(fmt.Sprintf("acked%d", i)); err != nil {
			t.Fatalf("the stopped node lost acked%d: %v", i, err)
		}
	}
	if err := c.Nodes[l].Ready(); err == nil {
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
	c := nodetest.NewCluster(t, "a", 3, func(name string, o *node.Options) {
		clocks[name] = &skewedClock{}
		o.Clock, o.MaxClockOffset = clocks[name], 500*time.Millisecond
	})
	first := c.Leader()
	ctx := policy.WithKey(context.Background(), policy.KeyFromID("order-17", time.Now()))
	res, err := c.Nodes[first].Put(ctx, "order/17", []byte("paid"))
	if err != nil {
		t.Fatal(err)
	}
	c.Converged()
	for name, ck := range clocks {
		if name != first {
			ck.offset.Store(int64(-2 * time.Second))
		}
	}
	c.Stop(first)
	next := c.Leader()
	again, err := c.Nodes[next].Put(ctx, "order/17", []byte("paid"))
	if err != nil {
		t.Fatalf("the retry at %s (clock 2 s behind the pin): %v", next, err)
	}
	if again.Version != res.Version || again.Replay == nil {
		t.Fatalf("the retry was not answered from the first attempt's record: %+v, first %+v", again, res)
	}
	// A new write under another scope pinned 2 s ahead is still refused:
	// the pin check stands for what did not apply.
	fresh := policy.WithKey(context.Background(), policy.KeyFromID("order-18", time.Now()))
	if _, err := c.Nodes[next].Put(fresh, "order/18", []byte("paid")); !errors.Is(err, api.ErrPinOutOfWindow) {
		t.Fatalf("a new write pinned 2 s ahead of the leader's clock: %v", err)
	}
}

// A node alone put back from a copy goes through replicator restore too: it
// gets a new incarnation, renames its group of one, and goes on with its
// data.
func TestRestoredNodeAloneRenamesItsGroup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a1")
	o := opts(dir)
	n := nodetest.Open(t, o)
	ctx := context.Background()
	if _, err := n.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	inc := n.LocalCluster().Incarnation
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "a1-copy")
	nodetest.CopyDir(t, dir, copied)
	rep, err := datadir.Restore(copied)
	if err != nil || !rep.Replaced || rep.Previous != inc || rep.Servers != 1 {
		t.Fatalf("restore: %+v %v", rep, err)
	}
	n = nodetest.Open(t, opts(copied))
	defer n.Close()
	if n.LocalCluster().Incarnation != rep.Incarnation {
		t.Fatalf("incarnation %s, restore minted %s", n.LocalCluster().Incarnation, rep.Incarnation)
	}
	if rec, err := n.Get("k"); err != nil || string(rec.Value) != "v" {
		t.Fatalf("the restored node's data: %v %v", rec, err)
	}
	if _, err := n.Put(ctx, "after", []byte("v")); err != nil {
		t.Fatalf("a write after the restore: %v", err)
	}
	if id := cluster.ServerID(n.LocalCluster().Node, n.LocalCluster().Incarnation); id != cluster.ServerID(n.LocalCluster().Node, rep.Incarnation) {
		t.Fatalf("raft knows the node as %s", id)
	}
}

// Issue 25, finding 5: three joins of unreachable addresses left the
// cluster unable to elect (each was added as a voter at once). A join now
// asks the node's raft port who it is first, and adds it as a non-voter:
// an address nobody answers at is refused, and the voters stay as they were.
func TestJoinOfUnreachableAddressesRefused(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, nil)
	l := c.Leader()
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	release() // nobody listens there
	for i, addr := range free {
		if err := c.Nodes[l].JoinNode(fmt.Sprintf("ghost%d", i), addr, ""); err == nil {
			t.Fatalf("a join of %s, where nobody answers, was accepted", addr)
		}
	}
	if n := len(servers(c.Nodes[l])); n != 3 {
		t.Fatalf("%d servers after the refused joins", n)
	}
	// Forced (the operator's stated emergency), they are added, as
	// non-voters: the voters stay the three.
	for i, addr := range free {
		if err := c.Nodes[l].JoinNode(fmt.Sprintf("ghost%d", i), addr, "the node is being rebuilt"); err != nil {
			t.Fatalf("a forced join of %s: %v", addr, err)
		}
	}
	voters := 0
	for _, sv := range servers(c.Nodes[l]) {
		if sv.Voter {
			voters++
		}
	}
	if voters != 3 {
		t.Fatalf("%d voters after the forced joins, want 3", voters)
	}
	// And the cluster elects and commits after its leader goes.
	c.Stop(l)
	next := c.Leader()
	if _, err := c.Client(next).Put(context.Background(), "after", []byte("v")); err != nil {
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
	c := nodetest.NewCluster(t, "a", 3, nil)
	l, w, _ := c.Roles()
	fake, err := raftconn.Listen("127.0.0.1:0", nil, raftconn.Options{Cluster: "a", ID: string(cluster.ServerID(c.Nodes[w].LocalCluster().Node, c.Nodes[w].LocalCluster().Incarnation)), Loopback: true,
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
		Join: []string{c.Opts[l].Gossip.Bind}, Logger: nodetest.Logger(),
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: "evil", Inc: "0badc0de", Raft: fake.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Leave(time.Second)
	evil.JoinLoop(make(chan struct{}))
	time.Sleep(3 * time.Second) // a dozen membership rounds
	nd := c.Nodes[l]
	select {
	case <-nd.Fatal():
		t.Fatalf("an impostor's refusal stopped the leader: %v", nd.FatalErr())
	default:
	}
	if err := nd.Ready(); errors.Is(err, api.ErrRemoved) {
		t.Fatalf("an impostor's refusal put the leader out of its cluster: %v", err)
	}
	if !(nd.LocalCluster().State == "leader") {
		t.Fatal("the leader no longer leads")
	}
	for _, sv := range servers(nd) {
		if sv.ID == "evil" {
			t.Fatalf("the impostor was added: %+v", sv)
		}
	}
	if _, err := c.Client(l).Put(context.Background(), "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// expectRemovedOverHTTP: a node its cluster put out answers reads and
// writes 503 removed and fails /readyz, and stays up (it answers, and its
// Fatal is not closed: a supervisor would restart an exiting node in a
// loop).
func expectRemovedOverHTTP(t *testing.T, n *node.Node) {
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
func awaitRemoved(n *node.Node, d time.Duration) string {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := n.Ready(); errors.Is(err, api.ErrRemoved) {
			return err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ""
}

// A membership change sent to a follower reaches the leader over the raft
// port without the caller's token; the leader logs whom the follower
// verified (X-Replicator-Caller, trusted on the raft port only) and which
// node forwarded it. A caller's own X-Replicator-Caller on the API is not
// believed.
func TestForwardedChangeNamesItsCaller(t *testing.T) {
	logs := map[string]*nodetest.SyncBuffer{}
	c := nodetest.NewCluster(t, "a", 3, func(name string, o *node.Options) {
		logs[name] = &nodetest.SyncBuffer{}
		o.Logger = slog.New(slog.NewTextHandler(logs[name], nil))
		o.APIToken = "the-token"
		o.InsecurePeers = true // the raft port without credentials, beside a token (tests only)
	})
	l, w, _ := c.Roles()
	cl := client.New(c.Nodes[w].URL(), &client.Options{Token: "the-token"})
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
	want := fmt.Sprintf(`caller="admin token, forwarded by %s"`, cluster.ServerID(c.Nodes[w].LocalCluster().Node, c.Nodes[w].LocalCluster().Incarnation))
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

// servers are the raft configuration's servers as n reports them (its
// cluster report also lists the nodes gossip sees that the configuration
// does not hold).
func servers(n *node.Node) []api.ClusterNode {
	var out []api.ClusterNode
	for _, cn := range n.LocalCluster().Nodes {
		if cn.State != "not a member" && cn.State != "removed" {
			out = append(out, cn)
		}
	}
	return out
}
