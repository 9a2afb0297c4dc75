package groups

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/internal/raftfsm"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
)

// mesh is three in-process nodes of one cluster of three groups: group 0
// a raft group over each node's port (its state machine a recorder: this
// package holds the groups after it), groups 1 and 2 this package's Sets.
type mesh struct {
	// dir holds the nodes' directories: made before the nodes stop at the
	// test's end (cleanups run last first), so it is removed after.
	dir   string
	t     *testing.T
	mu    sync.Mutex
	nodes map[string]*mnode
}

type mnode struct {
	id, addr, dir string
	g0            *cluster.Group
	set           *Set
}

func (m *mesh) Members() []cluster.Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []cluster.Member
	for _, n := range m.nodes {
		mb := cluster.Member{ID: n.id, Incarnation: "0000000a", RaftAddr: n.addr, Alive: n.g0 != nil}
		if n.g0 != nil {
			mb.Fresh = n.g0.Fresh()
		}
		out = append(out, mb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// applied is node id's applied index in group g.
func (m *mesh) applied(g int) func(raft.ServerID, string) (uint64, error) {
	return func(id raft.ServerID, _ string) (uint64, error) {
		node, _ := cluster.SplitServerID(id)
		m.mu.Lock()
		defer m.mu.Unlock()
		n := m.nodes[node]
		if n == nil || n.set == nil {
			return 0, fmt.Errorf("%s is not running", id)
		}
		return n.set.Group(g).Rep.Applied(), nil
	}
}

// formWith are group 0's voters once each runs and holds no state of
// group g (what gossip's per-group freshness will say of them).
func (m *mesh) formWith(g int) func() []raft.Server {
	return func() []raft.Server {
		m.mu.Lock()
		var g0s []*cluster.Group
		for _, n := range m.nodes {
			if n.g0 != nil {
				g0s = append(g0s, n.g0)
			}
		}
		m.mu.Unlock()
		var servers []raft.Server
		for _, g0 := range g0s {
			if !g0.IsLeader() {
				continue
			}
			for _, sv := range g0.Status().Servers { // Status asks the view: not under m.mu
				servers = append(servers, raft.Server{ID: raft.ServerID(cluster.ServerID(sv.ID, sv.Incarnation)), Address: raft.ServerAddress(sv.Raft)})
			}
		}
		if len(servers) < 3 {
			return nil
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, sv := range servers {
			node, _ := cluster.SplitServerID(sv.ID)
			n := m.nodes[node]
			if n == nil || n.set == nil || n.set.Group(g).Rep.Group() == nil || !n.set.Group(g).Rep.Group().Fresh() {
				return nil
			}
		}
		return servers
	}
}

var gossipKey = bytes.Repeat([]byte{7}, 32)

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (m *mesh) start(id string) *mnode {
	m.t.Helper()
	n := &mnode{id: id, addr: freeAddr(m.t), dir: filepath.Join(m.dir, id)}
	desc := fmt.Sprintf(`{"commands":%d}`, machine.ReadsFormat)
	g0, err := cluster.Open(&cluster.Options{Cluster: "a", Node: id, Incarnation: "0000000a", Dir: filepath.Join(n.dir, "cluster"),
		Listen: n.addr, Conn: raftconn.Options{GossipKey: gossipKey}, BootstrapExpect: 3, FSM: &raftfsm.Recorder{}, Members: m,
		Describe: func() string { return desc }, Reconcile: 50 * time.Millisecond,
		HeartbeatTimeout: 500 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond, LeaderLeaseTimeout: 250 * time.Millisecond,
		Logger: quiet})
	if err != nil {
		m.t.Fatal(err)
	}
	n.g0 = g0
	m.mu.Lock()
	m.nodes[id] = n
	m.mu.Unlock()
	d := aloneDeps(m.t, n.dir, 3)
	d.Replica.NodeID = id
	d.Replica.Describe = func() string { return desc }
	d.Replica.Reads = func(raft.ServerID) (int, bool) { return machine.ReadsFormat, true }
	d.Replica.Raft = &replica.Raft{Listen: n.addr, BootstrapExpect: 3, ElectionTimeout: time.Second, Members: m}
	d.Port = g0.Port
	d.Removed = func(raft.ServerID) string { return "" }
	d.MemberApplied = m.applied
	d.FormWith = m.formWith
	set, err := Open(d)
	if err != nil {
		m.t.Fatal(err)
	}
	set.Run()
	m.mu.Lock()
	n.set = set
	m.mu.Unlock()
	return n
}

// stop closes a node: its groups, then group 0 (which holds the port).
func (m *mesh) stop(n *mnode) {
	m.mu.Lock()
	set, g0 := n.set, n.g0
	n.set, n.g0 = nil, nil
	m.mu.Unlock()
	if set != nil {
		set.Close()
	}
	if g0 != nil {
		g0.Close()
	}
}

// leader is the node that leads group g, ready to write (nil: none).
func (m *mesh) leader(g int) *mnode {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.nodes {
		if n.set != nil && n.set.Group(g).Rep.Ready() {
			return n
		}
	}
	return nil
}

// write sets key at the leader of its group, trying again while it has
// none.
func (m *mesh) write(g int, key string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if l := m.leader(g); l != nil {
			_, err = l.set.Group(g).Sub.Submit(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: []byte(key)}})()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %d: %q not written: %v", g, key, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGroupsOfAClusterOfThree: three nodes hold groups 1 and 2 of a
// cluster of three groups over each node's one raft port. Each group
// forms, elects and takes writes of its slots' keys at its leader; every
// node's store of a group ends with the group's keys and no other; the
// leaders spread (cluster.SpreadMove) so that groups 1 and 2 are led by two
// nodes; the node leading group 1 goes, group 1 elects another and takes
// writes again, and group 2's writes meanwhile all succeed at once.
func TestGroupsOfAClusterOfThree(t *testing.T) {
	m := &mesh{dir: t.TempDir(), t: t, nodes: map[string]*mnode{}}
	t.Cleanup(func() {
		for _, n := range m.nodes {
			m.stop(n)
		}
	})
	for _, id := range []string{"n1", "n2", "n3"} {
		m.start(id)
	}
	keys := map[int][]string{}
	for i := 0; len(keys[1]) < 20 || len(keys[2]) < 20; i++ {
		k := fmt.Sprintf("key-%d", i)
		if g := m.nodes["n1"].set.Of(k); g > 0 {
			keys[g] = append(keys[g], k)
		}
	}
	for g := 1; g <= 2; g++ {
		for _, k := range keys[g][:10] {
			if err := m.write(g, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	// groups 1 and 2 led by two nodes
	nodes := []string{"n1", "n2", "n3"}
	deadline := time.Now().Add(20 * time.Second)
	for {
		l1, l2 := m.leader(1), m.leader(2)
		if l1 != nil && l2 != nil && l1 != l2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("groups 1 and 2 are still led by one node")
		}
		if l1 != nil && l2 != nil {
			if g, to, ok := cluster.SpreadMove([]string{"", l1.id, l2.id}, nodes); ok {
				_ = m.leader(g).set.Group(g).Rep.Group().TransferLeadershipTo(cluster.ServerID(to, "0000000a"))
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	gone := m.leader(1)
	other := m.leader(2)
	m.stop(gone)
	failures := 0
	for i := 0; m.leader(1) == nil || i < 10; i++ {
		if i > 500 {
			t.Fatal("group 1 elected no leader after its leader went")
		}
		k := keys[2][10+i%10]
		if _, err := other.set.Group(2).Sub.Submit(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: k, Value: []byte(k)}})(); err != nil {
			failures++
			t.Logf("group 2's write %q failed while group 1 elected: %v", k, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if failures > 0 {
		t.Fatalf("%d of group 2's writes failed while group 1 elected", failures)
	}
	for _, k := range keys[1][10:] {
		if err := m.write(1, k); err != nil {
			t.Fatal(err)
		}
	}
	// every running node ends with each group's keys, and no other's
	for _, n := range m.nodes {
		if n.set == nil {
			continue
		}
		for g := 1; g <= 2; g++ {
			want := keys[g]
			if g == 2 {
				want = keys[2][:20]
			}
			st := n.set.Group(g).Store
			deadline := time.Now().Add(20 * time.Second)
			for _, k := range want {
				for {
					_, err := st.Get(k)
					if err == nil {
						break
					}
					if !errors.Is(err, store.ErrNotFound) || time.Now().After(deadline) {
						t.Fatalf("%s's group %d lacks %q: %v", n.id, g, k, err)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			for _, k := range keys[3-g] {
				if _, err := st.Get(k); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s's group %d holds %q of group %d", n.id, g, k, 3-g)
				}
			}
		}
	}
}
