package node

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/hlc"
)

// switchboard is the PeerTransport of in-process meshes: it lets the test
// cut any directed link.
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

type testMesh struct {
	t     testing.TB
	nodes map[string]*Node
	opts  map[string]*Options
	addrs map[string]string
	sb    *switchboard
}

// newTestMesh opens a full mesh of in-process nodes sharing one manual
// physical clock.
func newTestMesh(t testing.TB, pc hlc.PhysicalClock, tweak func(*Options), names ...string) *testMesh {
	m := &testMesh{t: t, nodes: map[string]*Node{}, opts: map[string]*Options{}, addrs: map[string]string{},
		sb: &switchboard{blocked: map[string]bool{}, next: &http.Transport{}}}
	lns := map[string]net.Listener{}
	for _, n := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[n], m.addrs[n] = ln, ln.Addr().String()
	}
	for _, n := range names {
		o := testOptions(t.TempDir())
		o.ClusterID = n
		o.Listener = lns[n]
		o.Clock = pc
		o.BatchLinger = -1
		o.PeerTransport = boardTransport{from: n, sb: m.sb}
		for _, p := range names {
			if p != n {
				o.Peers = append(o.Peers, Peer{Name: p, URL: "http://" + m.addrs[p], Secret: "s"})
			}
		}
		if tweak != nil {
			tweak(o)
		}
		m.opts[n] = o
		m.startNode(n, o)
	}
	return m
}

func (m *testMesh) startNode(name string, o *Options) {
	m.t.Helper()
	nd := openNode(m.t, o)
	if err := nd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.nodes[name] = nd
	m.t.Cleanup(func() { nd.Close() })
}

// restart closes a node, lets between act on its data directory (back it
// up, restore it, wipe it), and opens it again on the same address.
func (m *testMesh) restart(name string, between func(dir string)) {
	m.t.Helper()
	if err := m.nodes[name].Close(); err != nil {
		m.t.Fatal(err)
	}
	o := *m.opts[name]
	if between != nil {
		between(o.DataDir)
	}
	ln, err := net.Listen("tcp", m.addrs[name])
	if err != nil {
		m.t.Fatal(err)
	}
	o.Listener = ln
	m.startNode(name, &o)
}

// copyDir copies a data directory (a backup taken while the node is down).
func copyDir(t testing.TB, from, to string) {
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

// converged waits until every link shipped everything and every digest
// (and counter) agrees.
func (m *testMesh) converged(d time.Duration) {
	m.t.Helper()
	deadline := time.Now().Add(d)
	why := ""
	for time.Now().Before(deadline) {
		why = ""
		var first string
		for name, n := range m.nodes {
			for _, l := range n.PeerStatus() {
				if l.EntriesBehind > 0 || l.NeedsReseed || l.State == "reseeding" || l.ReseedOwed || l.Conflict != "" {
					why += fmt.Sprintf("%s -> %s: %s, %d behind (%s); ", name, l.Peer, l.State, l.EntriesBehind, l.LastError)
				}
			}
			if r := n.rejoin.Report(); len(r.Phases) > 0 || len(r.Requests) > 0 {
				why += fmt.Sprintf("%s: rejoin %+v; ", name, r)
			}
			dg, err := n.Digest()
			if err != nil {
				m.t.Fatal(err)
			}
			if first == "" {
				first = dg.Hash
			} else if dg.Hash != first {
				why += "digests differ:"
				for nm, nd := range m.nodes {
					d, _ := nd.Digest()
					why += fmt.Sprintf(" %s %+v streams %+v rejoin %+v;", nm, d, nd.PeersReport().Streams, nd.rejoin.Report())
				}
			}
		}
		if why == "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	m.t.Fatalf("mesh did not converge in %s: %s", d, why)
}

func (m *testMesh) cut(from, to string, cut bool) {
	m.sb.mu.Lock()
	m.sb.blocked[from+"->"+m.addrs[to]] = cut
	m.sb.mu.Unlock()
}

// settle waits until every link that is not cut has shipped everything.
func (m *testMesh) settle() {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		done := true
		for name, n := range m.nodes {
			for _, l := range n.PeerStatus() {
				m.sb.mu.Lock()
				cut := m.sb.blocked[name+"->"+m.addrs[l.Peer]]
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
