package raftconn

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftfsm"
)

// groupNode is a node of a cluster of several raft groups: one port, one
// raft instance per group over it.
type groupNode struct {
	id    raft.ServerID
	l     *Layer
	fsms  []*raftfsm.Recorder
	rafts []*raft.Raft
	trans []Transport
}

func startGroupNode(t *testing.T, id raft.ServerID, groups int) *groupNode {
	t.Helper()
	l, err := Listen("127.0.0.1:0", nil, Options{Cluster: "a", ID: string(id), Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	n := &groupNode{id: id, l: l}
	for g := range groups {
		cfg := &raft.NetworkTransportConfig{MaxPool: 2, Timeout: time.Second, Logger: hclog.NewNullLogger()}
		tr, err := NewGroupTransport(l, g, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rc := raft.DefaultConfig()
		rc.LocalID = id
		rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
		rc.Logger = hclog.NewNullLogger()
		store := raft.NewInmemStore()
		fsm := &raftfsm.Recorder{}
		r, err := raft.NewRaft(rc, fsm, store, store, raft.NewInmemSnapshotStore(), tr)
		if err != nil {
			t.Fatal(err)
		}
		n.fsms, n.rafts, n.trans = append(n.fsms, fsm), append(n.rafts, r), append(n.trans, tr)
	}
	return n
}

// stop stops the groups, group 0 last: its transport's Close closes the
// port, and with it every group's connections.
func (n *groupNode) stop() {
	for i := len(n.rafts) - 1; i >= 0; i-- {
		n.rafts[i].Shutdown().Error()
		n.trans[i].Close()
	}
	n.l.Close()
}

// TestGroupsShareOnePort: three nodes, three raft groups each over one raft
// port per node. Each group elects and commits on its own, and each group's
// state machine applies only its group's commands: the port hands every
// connection to the group it names, and the first group's is the layer's
// own (as before groups). A node dialled for a group it does not run says
// so.
func TestGroupsShareOnePort(t *testing.T) {
	const groups = 3
	nodes := []*groupNode{startGroupNode(t, "n1.1", groups), startGroupNode(t, "n2.1", groups), startGroupNode(t, "n3.1", groups)}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop()
		}
	})
	var servers []raft.Server
	for _, n := range nodes {
		servers = append(servers, raft.Server{ID: n.id, Address: raft.ServerAddress(n.l.Addr().String())})
	}
	for g := range groups {
		if err := nodes[0].rafts[g].BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for g := range groups {
		for i := range 3 {
			cmd := fmt.Sprintf("g%d-%d", g, i)
			// A leader with a 50 ms lease may step down on a loaded
			// machine: the command goes to whoever leads, until one
			// commits it. Raft may then apply it twice (a retry of a
			// commit whose answer was lost), which the check below allows
			// by comparing distinct commands in order.
			waitFor(t, fmt.Sprintf("group %d commits %s", g, cmd), func() bool {
				for _, n := range nodes {
					if n.rafts[g].State() == raft.Leader {
						return n.rafts[g].Apply([]byte(cmd), 2*time.Second).Error() == nil
					}
				}
				return false
			})
		}
	}
	for g := range groups {
		want := fmt.Sprintf("g%d-0,g%d-1,g%d-2", g, g, g)
		for _, n := range nodes {
			waitFor(t, fmt.Sprintf("%s applies group %d's commands", n.id, g), func() bool {
				return strings.Join(slices.Compact(n.fsms[g].Applied()), ",") == want
			})
		}
	}

	// A dial of a group the other node does not run is refused, naming it.
	sl, err := nodes[0].l.Group(7)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	_, err = sl.Dial(BindAddress(nodes[1].id, raft.ServerAddress(nodes[1].l.Addr().String())), 2*time.Second)
	if !errors.Is(err, ErrNoGroup) || !strings.Contains(err.Error(), "no raft group 7") {
		t.Fatalf("a dial of group 7 where it does not run: %v", err)
	}
	// A group's dial names a server: an unbound address is refused here.
	if _, err := sl.Dial(raft.ServerAddress(nodes[1].l.Addr().String()), time.Second); err == nil {
		t.Fatal("an unbound dial of a group was made")
	}
	if _, err := nodes[0].l.Group(1); err == nil {
		t.Fatal("a second layer for group 1 on one port")
	}
	for _, g := range []int{-1, MaxGroup + 1} {
		if _, err := nodes[0].l.Group(g); err == nil {
			t.Fatalf("group %d taken", g)
		}
	}
	// After the port closes, no group's layer can be had.
	nodes[2].stop()
	if _, err := nodes[2].l.Group(1); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a group on a closed port: %v", err)
	}
	nodes = nodes[:2]
}

// TestGroupConnectionsKeepThePortsRules: a connection of group 1 reaches the
// group's layer only through the port's checks: the target's identity, the
// refusal of a sender kept out; and a build that has services but no groups
// is told apart (ErrOlderBuild).
func TestGroupConnectionsKeepThePortsRules(t *testing.T) {
	a := listen(t, Options{Cluster: "a", ID: "a1.11111111", Loopback: true})
	b := listen(t, Options{Cluster: "a", ID: "a2.22222222", Loopback: true, Refuse: func(sender string) string {
		if sender == "a3.33333333" {
			return "a3.33333333 was removed from cluster a"
		}
		return ""
	}})
	c := listen(t, Options{Cluster: "a", ID: "a3.33333333", Loopback: true})
	group := func(l *Layer, g int) raft.StreamLayer {
		sl, err := l.Group(g)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sl.Close() })
		return sl
	}
	ag, bg, cg := group(a, 1), group(b, 1), group(c, 1)
	addr := raft.ServerAddress(b.Addr().String())

	// The right identity: the connection goes to b's group 1, and b's own
	// handler (group 0's) lets it go.
	served := echo(b)
	conn, err := ag.Dial(BindAddress("a2.22222222", addr), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan net.Conn, 1)
	go func() {
		if c, err := bg.Accept(); err == nil {
			got <- c
		}
	}()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	conn.Write([]byte("hello"))
	var in net.Conn
	select {
	case in = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("b's group 1 did not get the connection")
	}
	defer in.Close()
	buf := make([]byte, 5)
	in.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := in.Read(buf); err != nil || string(buf) != "hello" {
		t.Fatalf("group 1 read %q %v", buf, err)
	}
	if err := <-served; err == nil {
		t.Fatal("b's group 0 served a connection meant for group 1")
	}

	// Another identity at that address: refused before any group sees it.
	echo(b)
	if _, err := ag.Dial(BindAddress("a2.99999999", addr), 2*time.Second); !errors.Is(err, ErrWrongIdentity) {
		t.Fatalf("a group dial of another incarnation: %v", err)
	}
	// A sender the node refuses is refused on every group.
	echo(b)
	if _, err := cg.Dial(BindAddress("a2.22222222", addr), 2*time.Second); !errors.Is(err, ErrRefused) {
		t.Fatalf("a refused sender's group dial: %v", err)
	}

	// A build with services and no groups answers the purpose as unknown
	// (its readPreamble's error).
	old := olderBuild(t, "a9.99999999", func([2]byte) string { return "preamble purpose 2 is unknown" })
	if _, err := ag.Dial(BindAddress("a9.99999999", raft.ServerAddress(old)), 2*time.Second); !errors.Is(err, ErrOlderBuild) {
		t.Fatalf("a group dial of a build without groups: %v", err)
	}
}
