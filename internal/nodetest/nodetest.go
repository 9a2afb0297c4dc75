// Package nodetest is the in-process harness node's black-box tests share:
// a node, or a cluster of several on loopback (real Pebble on disk, real
// raft over the raft port, real gossip, real HTTP), seen only through
// package node's exported API and its HTTP surface. A test built on it
// states what an operator or a client sees; one that must reach into a
// part (a cut network inside the process, a log's internals) stays in
// package node.
package nodetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/treeforge"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Logger discards what nodes log, unless NODE_TEST_LOG is set.
func Logger() *slog.Logger {
	var out io.Writer = io.Discard
	if os.Getenv("NODE_TEST_LOG") != "" {
		out = os.Stderr
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Options are a node of cluster id in dir, on a loopback port of the
// kernel's choosing.
func Options(id, dir string) *node.Options {
	return &node.Options{ClusterID: id, DataDir: dir, Listen: "127.0.0.1:0", Logger: Logger()}
}

// Start opens and starts a node of o, closed when the test ends.
func Start(t testing.TB, o *node.Options) *node.Node {
	t.Helper()
	n, err := node.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		n.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// Cluster is one cluster of several in-process nodes that formed by gossip.
type Cluster struct {
	t     testing.TB
	ID    string
	Names []string
	Dirs  map[string]string
	Opts  map[string]*node.Options
	Nodes map[string]*node.Node // the running ones
}

// NewCluster starts n nodes of cluster id (named id1, id2, ...); tweak
// adjusts each node's options. Every node keeps its addresses across its
// restarts.
func NewCluster(t testing.TB, id string, n int, tweak func(name string, o *node.Options)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, ID: id, Dirs: map[string]string{}, Opts: map[string]*node.Options{}, Nodes: map[string]*node.Node{}}
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
		c.Names = append(c.Names, name)
		gossip[name] = next()
	}
	for _, name := range c.Names {
		o := Options(id, filepath.Join(t.TempDir(), name))
		o.NodeID = name
		o.Listen = next()
		o.Raft = &node.RaftOptions{Listen: next(), BootstrapExpect: n, ElectionTimeout: 300 * time.Millisecond}
		o.Gossip = &node.GossipOptions{Bind: gossip[name], Profile: "local"}
		for _, other := range c.Names {
			if other != name {
				o.Gossip.Join = append(o.Gossip.Join, gossip[other])
			}
		}
		o.IdentityCheckWait = -1
		if tweak != nil {
			tweak(name, o)
		}
		c.Dirs[name], c.Opts[name] = o.DataDir, o
	}
	release()
	for _, name := range c.Names {
		c.Start(name)
	}
	t.Cleanup(func() {
		for _, name := range c.Names {
			c.Stop(name)
		}
	})
	// The leader moves the log to the newest command encoding in the first
	// seconds (one command of its own): tests that count applied commands
	// begin after it (unless a node is told to read an older one).
	mixed := false
	for _, o := range c.Opts {
		mixed = mixed || o.Testing.ReadsFormat != 0
	}
	for deadline := time.Now().Add(20 * time.Second); !mixed; time.Sleep(20 * time.Millisecond) {
		if c.Nodes[c.Leader()].LocalCluster().Format == machine.ReadsFormat {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the log did not move to the newest command encoding")
		}
	}
	return c
}

// Start starts (or restarts) a node of the cluster.
func (c *Cluster) Start(name string) {
	c.t.Helper()
	o := *c.Opts[name]
	r := *o.Raft
	o.Raft = &r
	n, err := node.Open(context.Background(), &o)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		n.Close()
		c.t.Fatal(err)
	}
	c.Nodes[name] = n
}

// Stop closes a node of the cluster (gracefully: it hands leadership over).
func (c *Cluster) Stop(name string) {
	if n := c.Nodes[name]; n != nil {
		if err := n.Close(); err != nil {
			c.t.Errorf("close %s: %v", name, err)
		}
		delete(c.Nodes, name)
	}
}

// Leader waits for a node that leads with its term begun, as the node
// itself reports (GET /admin/cluster?local=1's state).
func (c *Cluster) Leader() string {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, name := range c.Names {
			if n := c.Nodes[name]; n != nil && n.LocalCluster().State == "leader" {
				return name
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("cluster %s elected no leader in 20s", c.ID)
	return ""
}

// Follower is a running node that does not lead.
func (c *Cluster) Follower() string {
	c.t.Helper()
	l := c.Leader()
	for _, name := range c.Names {
		if name != l && c.Nodes[name] != nil {
			return name
		}
	}
	c.t.Fatal("no follower running")
	return ""
}

// Roles names the leader and two followers (w, the one a test writes
// through, and f; "" when fewer run).
func (c *Cluster) Roles() (l, w, f string) {
	c.t.Helper()
	l = c.Leader()
	for _, name := range c.Names {
		switch {
		case name == l || c.Nodes[name] == nil:
		case w == "":
			w = name
		case f == "":
			f = name
		}
	}
	return l, w, f
}

// Client is an HTTP client of a node.
func (c *Cluster) Client(name string) *client.Client { return client.New(c.Nodes[name].URL(), nil) }

// Converged waits until every running node holds the same digest, and
// returns it.
func (c *Cluster) Converged() store.Digest {
	c.t.Helper()
	var last []string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var ds []store.Digest
		last = last[:0]
		for _, name := range c.Names {
			if n := c.Nodes[name]; n != nil {
				d, err := n.Digest()
				if err == nil {
					ds = append(ds, d)
				}
				last = append(last, fmt.Sprintf("%s %+v %v", name, d, err))
			}
		}
		same := len(ds) == len(c.Nodes) && len(ds) > 0
		for _, d := range ds {
			same = same && d == ds[0]
		}
		if same {
			return ds[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("nodes of %s did not converge: %s", c.ID, strings.Join(last, "; "))
	return store.Digest{}
}

// Mesh is a full mesh of single-node clusters in process, each named for
// its cluster, linked to every other with one secret; its links go through
// a switchboard the test cuts.
type Mesh struct {
	t     testing.TB
	Nodes map[string]*node.Node
	Opts  map[string]*node.Options
	Addrs map[string]string
	sb    *switchboard
}

// NewMesh opens the mesh of names, every node on the physical clock pc
// (nil: the system's); tweak adjusts each node's options.
func NewMesh(t testing.TB, pc hlc.PhysicalClock, tweak func(*node.Options), names ...string) *Mesh {
	t.Helper()
	m := &Mesh{t: t, Nodes: map[string]*node.Node{}, Opts: map[string]*node.Options{}, Addrs: map[string]string{},
		sb: &switchboard{blocked: map[string]bool{}, next: &http.Transport{}}}
	lns := map[string]net.Listener{}
	for _, n := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[n], m.Addrs[n] = ln, ln.Addr().String()
	}
	for _, n := range names {
		o := Options(n, t.TempDir())
		o.Listener = lns[n]
		if pc != nil {
			o.Clock = pc
		}
		o.BatchLinger = -1
		o.PeerTransport = boardTransport{from: n, sb: m.sb}
		for _, p := range names {
			if p != n {
				o.Peers = append(o.Peers, node.Peer{Name: p, URL: "http://" + m.Addrs[p], Secret: "s"})
			}
		}
		if tweak != nil {
			tweak(o)
		}
		m.Opts[n] = o
		m.Nodes[n] = Start(t, o)
	}
	return m
}

// Restart closes a node, lets between act on its data directory (back it
// up, restore it, wipe it), and opens it again on the same address.
func (m *Mesh) Restart(name string, between func(dir string)) {
	m.t.Helper()
	if err := m.Nodes[name].Close(); err != nil {
		m.t.Fatal(err)
	}
	o := *m.Opts[name]
	if between != nil {
		between(o.DataDir)
	}
	ln, err := net.Listen("tcp", m.Addrs[name])
	if err != nil {
		m.t.Fatal(err)
	}
	o.Listener = ln
	m.Nodes[name] = Start(m.t, &o)
}

// Cut cuts (or mends) the link from one node to another.
func (m *Mesh) Cut(from, to string, cut bool) {
	m.sb.mu.Lock()
	m.sb.blocked[from+"->"+m.Addrs[to]] = cut
	m.sb.mu.Unlock()
}

// Settle waits until every link that is not cut has shipped everything.
func (m *Mesh) Settle() {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		done := true
		for name, n := range m.Nodes {
			for _, l := range n.PeerStatus() {
				m.sb.mu.Lock()
				cut := m.sb.blocked[name+"->"+m.Addrs[l.Peer]]
				m.sb.mu.Unlock()
				if !cut && l.EntriesBehind > 0 {
					done = false
				}
			}
		}
		if done {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.t.Fatal("links did not settle")
}

// Converged waits until every link shipped everything, no rejoin runs, and
// every digest agrees.
func (m *Mesh) Converged(d time.Duration) {
	m.t.Helper()
	deadline := time.Now().Add(d)
	why := ""
	for time.Now().Before(deadline) {
		why = ""
		var first string
		for name, n := range m.Nodes {
			for _, l := range n.PeerStatus() {
				if l.EntriesBehind > 0 || l.NeedsReseed || l.State == "reseeding" || l.ReseedOwed || l.Conflict != "" {
					why += fmt.Sprintf("%s -> %s: %s, %d behind (%s); ", name, l.Peer, l.State, l.EntriesBehind, l.LastError)
				}
			}
			if r := n.PeersReport().Rejoin; len(r.Phases) > 0 || len(r.Requests) > 0 {
				why += fmt.Sprintf("%s: rejoin %+v; ", name, r)
			}
			dg, err := n.Digest()
			if err != nil {
				m.t.Fatal(err)
			}
			if first == "" {
				first = dg.Hash
			} else if dg.Hash != first {
				why += "digests differ;"
			}
		}
		if why == "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	m.t.Fatalf("mesh did not converge in %s: %s", d, why)
}

// switchboard is the PeerTransport of a mesh: it lets the test cut any
// directed link.
type switchboard struct {
	mu      sync.Mutex
	blocked map[string]bool // "from->host:port"
	next    http.RoundTripper
}

type boardTransport struct {
	from string
	sb   *switchboard
}

func (t boardTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.sb.mu.Lock()
	blocked := t.sb.blocked[t.from+"->"+r.URL.Host]
	t.sb.mu.Unlock()
	if blocked {
		return nil, errors.New("switchboard: link cut")
	}
	return t.sb.next.RoundTrip(r)
}

// WaitFor polls cond until it holds, failing the test with its last
// explanation after d.
func WaitFor(t testing.TB, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Open opens a node of o without starting it; the test closes it (Close is
// idempotent: the harness closes it again at the end).
func Open(t testing.TB, o *node.Options) *node.Node {
	t.Helper()
	n, err := node.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// Do sends one request and reads its whole answer.
func Do(t testing.TB, method, url string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
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

// Link is n's report of its link to peer.
func Link(t testing.TB, n *node.Node, peer string) api.LinkStatus {
	t.Helper()
	for _, l := range n.PeerStatus() {
		if l.Peer == peer {
			return l
		}
	}
	t.Fatalf("%s has no link to %s", n.ClusterID(), peer)
	return api.LinkStatus{}
}

// SyncBuffer is a bytes.Buffer safe for a logger and a test at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// PutN writes count keys prefix000, prefix001, ... at n, each acknowledged.
func PutN(t testing.TB, n *node.Node, prefix string, count int) {
	t.Helper()
	for i := 0; i < count; i++ {
		if _, err := n.Put(context.Background(), fmt.Sprintf("%s%03d", prefix, i), []byte(prefix)); err != nil {
			t.Fatal(err)
		}
	}
}

// GrepLines keeps the lines of b that hold one of words (a metrics page,
// a log), for a failure's message.
func GrepLines(b []byte, words ...string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// SendBatch posts entries to n's replicate endpoint as peer cluster from,
// holding its link secret, the way a peer's shipper does; it returns the
// answer's status and body.
func SendBatch(t testing.TB, n *node.Node, from, secret string, entries ...entry.Entry) (int, []byte) {
	t.Helper()
	var stream entry.StreamID
	if len(entries) > 0 {
		stream = entries[0].Stream
	}
	body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: from, Stream: stream}, Entries: entries})
	status, b, err := treeforge.Post(context.Background(), nil, n.PeerURL()+wire.PathReplicate, from, secret, body)
	if err != nil {
		t.Fatal(err)
	}
	return status, b
}

// CopyDir copies a data directory (a backup taken while the node is down).
func CopyDir(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Beneath edits the tree of a stopped node's data directory dir with fn, in
// one batch, the way a hand edit, a restore or a fault below the node
// would: nothing of it reaches the node's stream, so its peers never hear
// of it. Use it from Mesh.Restart's between or between Cluster.Stop and
// Start.
func Beneath(t testing.TB, dir string, fn func(b *store.Batch)) {
	t.Helper()
	Store(t, dir, func(st *store.Store) {
		b := st.NewBatch()
		defer b.Close()
		fn(b)
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
	})
}

// Diverge writes (or, with del, deletes) keys in the tree of cluster's
// stopped node at dir, stamped at wall and authored by cluster, with the
// kept hashes updated: a divergence beneath replication that a comparison
// must find and a repair mend.
func Diverge(t testing.TB, dir, cluster string, wall int64, keys []string, value []byte, del bool) {
	t.Helper()
	Beneath(t, dir, func(b *store.Batch) {
		for _, k := range keys {
			w := store.Write{Key: k, Value: value, Tombstone: del, Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: wall}, Origin: cluster}}
			if _, err := b.Merge(w); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Store opens the tree of a stopped node's data directory for fn to read
// or write below the node (WriteBeneath: bit rot).
func Store(t testing.TB, dir string, fn func(st *store.Store)) {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "store"), &store.Options{Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fn(st)
}
