package e2e

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
)

// gossipMesh prepares clusters that know each other only by secret and
// find each other through gossip; each joins the one seed given.
func gossipMesh(t *testing.T, keyFile string, names []string, seedOf map[string]string) (*mesh, map[string]string) {
	m := &mesh{t: t, nodes: map[string]*proc{}, names: names}
	gossip := map[string]string{}
	for _, n := range names {
		gossip[n] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	}
	for _, n := range names {
		p := newProc(t, n, n, "--gossip-bind", gossip[n], "--gossip-profile", "local", "--gossip-key-file", keyFile)
		if s := seedOf[n]; s != "" {
			p.args = append(p.args, "--join", gossip[s])
		}
		for _, o := range names {
			if o != n {
				p.args = append(p.args, "--peer-secret", o+"=secret-"+pair(n, o))
			}
		}
		m.nodes[n] = p
	}
	return m, gossip
}

func writeKey(t *testing.T, fill byte) string {
	key := make([]byte, 32)
	for i := range key {
		key[i] = fill + byte(i)
	}
	path := filepath.Join(t.TempDir(), "gossip.key")
	os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
	return path
}

func memberState(t *testing.T, p *proc, cluster string) string {
	for _, m := range peersReport(t, p).Members {
		if m.Meta.Cluster == cluster {
			return m.State
		}
	}
	return ""
}

// TestGossipDiscovery: three clusters that each know only one gossip seed
// find each other, replicate in a full mesh and converge; a node without
// the gossip key never appears; a killed node shows dead, its backlog kept;
// a node that stops gracefully shows left.
func TestGossipDiscovery(t *testing.T) {
	s := seed(t)
	key := writeKey(t, 1)
	m, gossip := gossipMesh(t, key, []string{"a", "b", "c"}, map[string]string{"b": "a", "c": "b"})
	m.start()
	// An intruder with another key joins a's gossip port.
	intruder := newProc(t, "x", "x", "--gossip-bind", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--gossip-profile", "local",
		"--gossip-key-file", writeKey(t, 99), "--join", gossip["a"], "--peer-secret", "a=whatever")
	intruder.startReady()

	eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range m.names {
			links := peersReport(t, m.nodes[n]).Links
			if len(links) != 2 {
				return false, fmt.Sprintf("%s has %d links", n, len(links))
			}
		}
		return true, ""
	})
	writes := workload(t, m, s, 900, 100, true)
	m.converge(60 * time.Second)
	for _, n := range m.names {
		checkHighestStampWins(t, m.nodes[n], writes)
		for _, mem := range peersReport(t, m.nodes[n]).Members {
			if mem.Meta.Cluster == "x" || mem.Node == "" {
				t.Fatalf("%s sees the intruder without the gossip key: %+v", n, mem)
			}
		}
	}

	// c dies: the others see it dead, and keep its backlog.
	m.nodes["c"].kill()
	eventually(t, 30*time.Second, func() (bool, string) {
		st := memberState(t, m.nodes["a"], "c")
		return st == api.LiveDead, "a sees c as " + st
	})
	if _, err := m.nodes["a"].client().Put(bg(), "while-c-is-dead", []byte("v")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		for _, l := range peersReport(t, m.nodes["a"]).Links {
			if l.Peer == "c" {
				return l.State == "dead" && l.EntriesBehind > 0, fmt.Sprintf("link to c: %s, %d behind", l.State, l.EntriesBehind)
			}
		}
		return false, "no link to c"
	})
	w := walLast(t, m.nodes["a"])
	if w.First > w.Last {
		t.Fatalf("a dropped the WAL c has not acknowledged: [%d, %d]", w.First, w.Last)
	}

	// b leaves gracefully.
	m.nodes["b"].stop()
	eventually(t, 30*time.Second, func() (bool, string) {
		st := memberState(t, m.nodes["a"], "b")
		return st == api.LiveLeft, "a sees b as " + st
	})

	// c returns and catches up.
	m.nodes["c"].startReady()
	eventually(t, 60*time.Second, func() (bool, string) {
		v, err := m.nodes["c"].client().Get(bg(), "while-c-is-dead")
		return err == nil && string(v.Value) == "v", fmt.Sprint(err)
	})
}
