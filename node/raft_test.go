package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/datadir"
	"github.com/replicator/replicator/discovery"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
)

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
