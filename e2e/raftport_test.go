package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/discovery"
)

// Issue 25, finding 3: with an API token, a loopback raft port without
// credentials let any local process without the token join the cluster,
// read every write and depose the leader. Such a node now refuses to start
// and says why; without a token (the demo, the README's loopback recipe)
// the loopback port stays.
func TestLoopbackRaftPortRefusedBesideAnAPIToken(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	raft := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := newProc(t, "a1", "a", "--node-id", "a1", "--raft-listen", raft, "--gossip-bind", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--api-token-file", token)
	mark := p.logMark()
	p.start()
	if !p.waitExit(20 * time.Second) {
		t.Fatal("a node with an API token and a loopback raft port without credentials started")
	}
	if log := p.logSince(mark); !strings.Contains(log, "raft port needs credentials") {
		t.Fatalf("it did not say why: %s", tail(log, 5))
	}
	if c, err := net.DialTimeout("tcp", raft, time.Second); err == nil {
		c.Close()
		t.Fatal("its raft port listens")
	}
}

// Issue 25, finding 7: the raft port held every connection opened to it
// (600 idle ones, for ever). It holds at most --max-connections; the rest
// are closed at once, and the node goes on serving.
func TestRaftPortConnectionsBounded(t *testing.T) {
	raft := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := newProc(t, "a1", "a", "--node-id", "a1", "--raft-listen", raft, "--gossip-bind", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--bootstrap-expect", "1", "--max-connections", "20")
	p.startReady()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 100; i++ {
		c, err := net.DialTimeout("tcp", raft, time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	// A connection the port closed reads EOF; one it holds times out a
	// read. Polled until the port closed all but 20 (a loaded machine may
	// take its time).
	closed := map[int]bool{}
	open := len(conns)
	// (Within 5 s: idle connections past the 10 s handshake timeout would
	// be closed even without the bound.)
	for deadline := time.Now().Add(5 * time.Second); open > 20 && time.Now().Before(deadline); {
		for i, c := range conns {
			if closed[i] {
				continue
			}
			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				closed[i] = true
			}
		}
		open = len(conns) - len(closed)
	}
	if open > 20 {
		t.Fatalf("%d of 100 idle connections held by a raft port bounded at 20", open)
	}
	if _, err := p.client().Put(bg(), "still", []byte("serving")); err != nil {
		t.Fatalf("the node after the flood: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Issue 25, finding 2, with real processes: a gossip member without any
// credential (gossip has no key here) advertises the leader's node ID with
// URLs of its own. Followers used to forward client writes there with the
// client's bearer token and acknowledge its fake answers, and /admin/cluster
// sent it the token. Now followers forward over the raft port to the server
// raft names as leader: every acknowledged write is on the leader, and the
// impostor receives no request at all.
func TestGossipImpostorOfTheLeaderGetsNoRequests(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := newRaftMesh(t, []string{"a"}, 3, "--api-token-file", tok, "--insecure-peers")
	for _, n := range m.nodes {
		n.token = "s3cret"
	}
	m.start()
	l := m.waitLeader("a", 30*time.Second)
	var lr api.ClusterReport
	if _, err := l.client().Do(bg(), http.MethodGet, "/admin/cluster?local=1", nil, nil, &lr); err != nil {
		t.Fatal(err)
	}
	var follower *rnode
	for _, n := range m.members("a") {
		if n != l {
			follower = n
		}
	}
	var mu sync.Mutex
	var got []string
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"key":"k","version":"1.0@a","origin":"a"}`)
	}))
	defer fake.Close()
	evil, err := discovery.Start(discovery.Options{NodeName: "a-" + l.id + "-evil",
		Bind: fmt.Sprintf("127.0.0.1:%d", freePort(t)), Profile: "local", Join: []string{follower.gossip},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: l.id, Inc: lr.Incarnation, Raft: l.raft,
			API: fake.URL, Replicate: fake.URL}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Leave(time.Second)
	evil.JoinLoop(make(chan struct{}))
	// Until the follower's gossip lists the impostor.
	eventually(t, 15*time.Second, func() (bool, string) {
		var peers struct {
			Members []struct {
				Node string `json:"node"`
			} `json:"members"`
		}
		follower.client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &peers)
		for _, mb := range peers.Members {
			if strings.HasSuffix(mb.Node, "-evil") {
				return true, ""
			}
		}
		return false, "the follower's gossip does not list the impostor"
	})
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, err := follower.client().Put(bg(), k, []byte("v")); err != nil {
			t.Fatal(err)
		}
		it, err := l.client().Get(bg(), k)
		if err != nil || string(it.Value) != "v" {
			t.Fatalf("a write the follower acknowledged is not on the leader: %+v %v", it, err)
		}
	}
	var rep api.ClusterReport
	if _, err := follower.client().Do(bg(), http.MethodGet, "/admin/cluster", nil, nil, &rep); err != nil {
		t.Fatal(err)
	}
	for _, cn := range rep.Nodes {
		if cn.API == fake.URL {
			t.Fatalf("admin cluster shows the impostor's URL for %s", cn.ID)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) > 0 {
		t.Fatalf("the impostor received %d requests: %v", len(got), got[:min(5, len(got))])
	}
}

// Issue 25, findings 1 and 5, with real processes. Forged gossip members
// describing made-up nodes of cluster a (no gossip key, as documented for a
// closed network) made the leader add three voters it never reached: six
// voters, three alive, no leader ever again. And three `admin cluster join`s
// of addresses nobody answers at did the same. Now the leader adds a node
// only once its raft port said who it is, and only as a non-voter: the
// made-up members and the joins change no voter, and the cluster elects a
// new leader when its leader is killed.
func TestForgedMembersAndJoinsDoNotTakeTheQuorum(t *testing.T) {
	m := newRaftMesh(t, []string{"a"}, 3)
	m.start()
	l := m.waitLeader("a", 30*time.Second)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 3; i++ {
		ghost := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nobody listens
		d, err := discovery.Start(discovery.Options{NodeName: fmt.Sprintf("a-ghost%d", i),
			Bind: fmt.Sprintf("127.0.0.1:%d", freePort(t)), Profile: "local", Join: []string{l.gossip}, Logger: quiet,
			Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: fmt.Sprintf("ghost%d", i), Inc: "0badc0de",
				Raft: ghost, API: "http://" + ghost, Replicate: "http://" + ghost}})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Leave(time.Second)
		d.JoinLoop(make(chan struct{}))
		// The operator's join of an address nobody answers at.
		body := fmt.Appendf(nil, `{"id": "joined%d", "raft": %q}`, i, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		if _, err := l.client().Do(bg(), http.MethodPost, "/admin/cluster/join", body, http.Header{"Content-Type": {"application/json"}}, nil); err == nil {
			t.Fatalf("a join of an address nobody answers at was accepted")
		}
	}
	// A dozen membership rounds.
	time.Sleep(3 * time.Second)
	r, err := localCluster(l)
	if err != nil {
		t.Fatal(err)
	}
	voters, ghosts := 0, 0
	for _, cn := range r.Nodes {
		if cn.Voter {
			voters++
		}
		if strings.HasPrefix(cn.ID, "ghost") && cn.State == "not a member" {
			ghosts++
		}
	}
	if voters != 3 {
		t.Fatalf("%d voters after the forged members and joins, want 3: %+v", voters, r.Nodes)
	}
	if ghosts != 3 {
		t.Fatalf("admin cluster shows %d of the 3 made-up members as not members (the leader's gossip must see them, or the test proved nothing): %+v", ghosts, r.Nodes)
	}
	m.setDown(l.id, true)
	l.kill()
	next := m.waitLeader("a", 30*time.Second)
	if _, err := next.client().Put(bg(), "after", []byte("v")); err != nil {
		t.Fatalf("a write after the leader was killed: %v", err)
	}
}

// Issue 25, finding 4, with real processes: a cluster moves its raft port
// from the gossip key (which the clusters of a mesh may share: whoever
// holds it could join any of them) to a raft key of its own, in a rolling
// upgrade. a1 starts with the gossip key only (the older scheme), a2 and a3
// with the raft key and --raft-accept-gossip-key: they form one cluster and
// take writes at every node. Then each node in turn is restarted with the
// raft key alone (a1 first through the accepting step), writes going on;
// at the end, a node holding only the shared gossip key is never added.
func TestRaftKeyRollingUpgradeOfAMixedCluster(t *testing.T) {
	gossipKey, raftKey := writeKey(t, 41), writeKey(t, 42)
	m := &rmesh{t: t, clusters: []string{"a"}, nodes: map[string]*rnode{}, removed: map[string]bool{}, down: map[string]bool{}}
	m.prepare("a", "a1", 3, "--gossip-key-file", gossipKey)
	for _, id := range []string{"a2", "a3"} {
		m.prepare("a", id, 3, "--gossip-key-file", gossipKey, "--raft-key-file", raftKey, "--raft-accept-gossip-key")
	}
	m.start()
	round := 0
	write := func() {
		t.Helper()
		round++
		for _, n := range m.members("a") {
			k := fmt.Sprintf("r%d/%s", round, n.id)
			eventually(t, 20*time.Second, func() (bool, string) {
				if _, err := n.client().Put(bg(), k, []byte("v")); err != nil {
					return false, fmt.Sprintf("a write through %s: %v", n.id, err)
				}
				return true, ""
			})
		}
	}
	write()
	restart := func(n *rnode, args ...string) {
		t.Helper()
		n.stop()
		var kept []string
		for i := 0; i < len(n.args); i++ {
			switch n.args[i] {
			case "--raft-key-file":
				i++
				continue
			case "--raft-accept-gossip-key":
				continue
			}
			kept = append(kept, n.args[i])
		}
		n.args = append(kept, args...)
		n.startReady()
		m.waitLeader("a", 30*time.Second)
		write()
	}
	restart(m.nodes["a1"], "--raft-key-file", raftKey, "--raft-accept-gossip-key")
	for _, id := range []string{"a1", "a2", "a3"} {
		restart(m.nodes[id], "--raft-key-file", raftKey)
	}
	var leaderDigest api.DigestReport
	eventually(t, 20*time.Second, func() (bool, string) {
		var ds []api.DigestReport
		for _, n := range m.members("a") {
			d, err := digestOf(n.proc)
			if err != nil {
				return false, err.Error()
			}
			ds = append(ds, d)
		}
		for _, d := range ds[1:] {
			if d.Digest != ds[0].Digest {
				return false, "digests differ"
			}
		}
		leaderDigest = ds[0]
		return ds[0].Keys == 3*round, fmt.Sprintf("%d keys, want %d", ds[0].Keys, 3*round)
	})
	// Another cluster's node holding the shared gossip key, claiming a.
	evil := m.prepare("a", "a9", 3, "--gossip-key-file", gossipKey)
	for _, n := range m.members("a") {
		if n.id != "a9" {
			evil.args = append(evil.args, "--join", n.gossip)
		}
	}
	evil.start()
	time.Sleep(5 * time.Second) // a score of membership rounds
	l := m.waitLeader("a", 10*time.Second)
	r, err := localCluster(l)
	if err != nil {
		t.Fatal(err)
	}
	seen := false
	for _, cn := range r.Nodes {
		if cn.ID == "a9" {
			seen = true
			if cn.State != "not a member" {
				t.Fatalf("a node holding only the shared gossip key is in the configuration: %+v", cn)
			}
		}
	}
	if !seen {
		t.Fatalf("the leader's gossip never saw a9: the test proved nothing (%+v)", r.Nodes)
	}
	t.Logf("upgraded in %d rounds of writes; %d keys on every node", round, leaderDigest.Keys)
}
