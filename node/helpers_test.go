package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replicator/replicator/client"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
)

// The white-box tests of package node (raft roles and partitions, the
// replica's migration and format raise, benchmarks) share these helpers;
// the scenario tests are black-box tests in package node_test, through
// internal/nodetest.

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Pebble's and net/http's long-lived helpers are not ours.
		goleak.IgnoreAnyFunction("github.com/cockroachdb/pebble/v2/internal/cache.(*shard).releaseLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		// Pebble leaves its disk-health ticker behind when Open fails on
		// a held lock (TestFailedStartClaimsNothing): Pebble's, not ours.
		goleak.IgnoreAnyFunction("github.com/cockroachdb/pebble/v2/vfs.(*diskHealthCheckingFS).startTickerLocked.func1"),
		// memberlist's Shutdown does not wait for a probe in flight; it ends
		// at its probe timeout.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}

var quiet = slog.New(slog.NewTextHandler(testLogOut(), &slog.HandlerOptions{Level: slog.LevelDebug}))

func testLogOut() io.Writer {
	if os.Getenv("NODE_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}

func testOptions(dir string) *Options {
	return &Options{ClusterID: "a", DataDir: dir, Listen: "127.0.0.1:0", Logger: quiet}
}

func openNode(t testing.TB, o *Options) *Node {
	t.Helper()
	n, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func startNode(t *testing.T, o *Options) *Node {
	n := openNode(t, o)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func do(t *testing.T, method, url string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

func waitFor(t testing.TB, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	why := ""
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("not reached in %s: %s", d, why)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

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

func link(t testing.TB, n *Node, peer string) client.LinkStatus {
	t.Helper()
	for _, l := range n.PeerStatus() {
		if l.Peer == peer {
			return l
		}
	}
	t.Fatalf("%s has no link to %s", n.ClusterID(), peer)
	return client.LinkStatus{}
}

func putN(t testing.TB, n *Node, prefix string, count int) {
	t.Helper()
	for i := 0; i < count; i++ {
		if _, err := n.Put(context.Background(), fmt.Sprintf("%s%03d", prefix, i), []byte(prefix)); err != nil {
			t.Fatal(err)
		}
	}
}
