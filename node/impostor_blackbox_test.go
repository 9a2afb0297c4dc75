package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/discovery"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// Issue 25, finding 2: a gossip member without any credential advertised
// the leader's node ID with URLs of its own. Followers forwarded client
// writes there with the client's bearer token and acknowledged its fake
// answers; /admin/cluster sent it the token; a follower's not_leader
// answer named it. Now a follower forwards to the server raft names as
// leader, over the raft port, and hands out only what that server said of
// itself there: the impostor receives nothing.
func TestImpostorOfTheLeaderGetsNoRequests(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, func(_ string, o *node.Options) {
		o.APIToken = "the-token"
		o.InsecurePeers = true // the raft port without credentials, beside a token (tests only)
		// A peer cluster p, known by its secret: what a follower tells a
		// peer of its leader is what p reads in its refusals.
		o.Peers = []node.Peer{{Name: "p", Secret: "s"}}
	})
	l, w, _ := c.Roles()
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
		Join: []string{c.Opts[w].Gossip.Bind}, Logger: nodetest.Logger(),
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: l, Inc: c.Nodes[l].LocalCluster().Incarnation,
			Raft: c.Opts[l].Raft.Listen, API: fake.URL, Replicate: fake.URL}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Leave(time.Second)
	evil.JoinLoop(make(chan struct{}))
	// Until the impostor and the follower gossip with each other (a join
	// is a push-pull of both views).
	gossipsWith(t, evil, w)
	cl := client.New(c.Nodes[w].URL(), &client.Options{Token: "the-token"})
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		// A leader with a short lease may step down for a moment on a
		// loaded machine (CI under -race): the follower then answers "not
		// written, no leader is known", which is safe to send again.
		_, err := cl.Put(ctx, k, []byte("v"))
		for end := time.Now().Add(10 * time.Second); err != nil && !client.MayHaveWritten(err) && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond)
			_, err = cl.Put(ctx, k, []byte("v"))
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec, err := c.Nodes[l].Get(k); err != nil || string(rec.Value) != "v" {
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
	leader, nodes := notLeader(t, c.Nodes[w])
	if leader != c.Nodes[l].PeerURL() {
		t.Fatalf("a follower's not_leader answer names %q, not the leader's %q", leader, c.Nodes[l].PeerURL())
	}
	for _, u := range nodes {
		if u == fake.URL {
			t.Fatalf("acks name the impostor's URL: %v", nodes)
		}
	}
	// A member that cannot be asked (down) is not replaced by what gossip
	// says of it: an impostor claiming it is not handed out in acks.
	_, _, f := c.Roles()
	fInc := c.Nodes[f].LocalCluster().Incarnation
	c.Stop(f)
	free2, release2, err := ports.Hold(1)
	if err != nil {
		t.Fatal(err)
	}
	release2()
	evil2, err := discovery.Start(discovery.Options{NodeName: "a-" + f + "-evil", Bind: free2[0], Profile: "local",
		Join: []string{c.Opts[w].Gossip.Bind}, Logger: nodetest.Logger(),
		Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: "a", Node: f, Inc: fInc,
			Raft: c.Opts[f].Raft.Listen, API: fake.URL, Replicate: fake.URL}})
	if err != nil {
		t.Fatal(err)
	}
	defer evil2.Leave(time.Second)
	evil2.JoinLoop(make(chan struct{}))
	gossipsWith(t, evil2, w)
	time.Sleep(2500 * time.Millisecond) // two refreshes of the URLs acks hand out
	_, nodes = notLeader(t, c.Nodes[w])
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

// gossipsWith waits until d's gossip sees node name alive: memberlist's
// join exchanged both views, so name's gossip holds d too.
func gossipsWith(t *testing.T, d *discovery.Discovery, name string) {
	t.Helper()
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		for _, m := range d.Members() {
			if m.Meta.Node == name && m.State == api.LiveAlive {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s never gossiped with %s: %+v", d.Meta().Node, name, d.Members())
	})
}

// notLeader is what follower n answers a peer (p, with its secret) that
// posts to it: the leader's replicate URL it names, and every node's.
func notLeader(t *testing.T, n *node.Node) (leader string, nodes []string) {
	t.Helper()
	status, body := nodetest.SendBatch(t, n, "p", "s")
	var ans struct {
		Error struct {
			Code   string   `json:"code"`
			Leader string   `json:"leader"`
			Nodes  []string `json:"nodes"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || status != http.StatusServiceUnavailable || ans.Error.Code != "not_leader" {
		t.Fatalf("a follower answered a peer's batch %d %s", status, body)
	}
	return ans.Error.Leader, ans.Error.Nodes
}
