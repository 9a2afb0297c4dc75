package node_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/replicator/replicator/internal/nodetest"
)

// Black-box tests of a cluster of several nodes: through the exported API,
// the HTTP surface and the shared harness (internal/nodetest) only.

func TestClusterOfThreeNodes(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, nil)
	leader := c.Leader()
	f := c.Follower()
	stream := c.Nodes[leader].OriginReport().Stream
	// A write at a follower is proposed to the leader, and the follower
	// answers once it applied it: it reads its own write at once.
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, err := c.Client(f).Put(ctx, k, []byte("v")); err != nil {
			t.Fatalf("put at follower %s: %v", f, err)
		}
		if _, err := c.Nodes[f].Get(k); err != nil {
			t.Fatalf("follower %s does not read its own write %s: %v", f, k, err)
		}
	}
	if _, err := c.Client(f).Increment(ctx, "hits", 5); err != nil {
		t.Fatal(err)
	}
	// A consistent read at a follower goes to the leader.
	resp, err := http.Get(c.Nodes[f].URL() + "/v1/counters/hits?consistent=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("consistent read at a follower: %s", resp.Status)
	}
	d := c.Converged()
	if d.Keys != 50 || d.Counters != 1 {
		t.Fatalf("%+v, want 50 keys and a counter", d)
	}
	for _, name := range c.Names {
		if got := c.Nodes[name].OriginReport().Stream; got != stream {
			t.Fatalf("%s's stream is %s, the leader's %s: one stream per cluster", name, got, stream)
		}
	}
	// The Go API at a follower proposes to the leader (a typed proposal)
	// and answers once the follower applied the write.
	if res, err := c.Nodes[f].Put(ctx, "direct", []byte("v")); err != nil || res.Origin != c.Nodes[f].ClusterID() {
		t.Fatalf("a write at a follower through the Go API: %+v %v", res, err)
	} else if r, err := c.Nodes[f].Get("direct"); err != nil || r.Stamp.String() != res.Version {
		t.Fatalf("the follower does not read its own write %s: %v %v", res.Version, r.Stamp, err)
	}
	// The report lists the three nodes, one leader, all applied.
	r := c.Nodes[f].ClusterReport(ctx)
	leaders := 0
	for _, cn := range r.Nodes {
		if cn.State == "unreachable" {
			t.Fatalf("node %s unreachable in the report: %+v", cn.ID, cn)
		}
		if cn.Leader {
			leaders++
		}
	}
	if len(r.Nodes) != 3 || leaders != 1 || r.Leader != leader || r.Mode != "raft" {
		t.Fatalf("cluster report %+v", r)
	}
}

// The leader stops: another is elected, writes resume on the same stream,
// and the old leader rejoins as a follower and catches up.
func TestLeaderFailover(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, nil)
	old := c.Leader()
	stream := c.Nodes[old].OriginReport().Stream
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := c.Client(old).Put(ctx, fmt.Sprintf("before%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.Stop(old)
	next := c.Leader()
	if next == old {
		t.Fatal("the stopped node still leads")
	}
	for i := 0; i < 20; i++ {
		if _, err := c.Client(next).Put(ctx, fmt.Sprintf("after%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Nodes[next].OriginReport().Stream; got != stream {
		t.Fatalf("a new leader began stream %s; the cluster's is %s", got, stream)
	}
	c.Start(old)
	if d := c.Converged(); d.Keys != 40 {
		t.Fatalf("%+v", d)
	}
	if last := c.Nodes[old].WALReport().Last; last != 40 {
		t.Fatalf("the stream holds %d entries on the old leader, want 40", last)
	}
}
