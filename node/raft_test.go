package node

import (
	"context"
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
)

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
