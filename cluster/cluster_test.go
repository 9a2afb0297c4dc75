package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/internal/raftfsm"
)

var gossipKey = bytes.Repeat([]byte{7}, 32)

// view is what gossip would report: each node's raft address, whether it
// runs, and whether it is fresh. Gossip itself is memberlist's job, tested
// with the node; here only its answers matter.
type view struct {
	mu    sync.Mutex
	nodes map[string]*node
}

type node struct {
	id, addr, dir string
	hasData       bool
	g             *Group
	fsm           *raftfsm.Recorder
}

func (v *view) Members() []Member {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []Member
	for _, n := range v.nodes {
		if n.addr == "" {
			continue
		}
		m := Member{ID: n.id, RaftAddr: n.addr, Alive: n.g != nil}
		if n.g != nil {
			m.Fresh = n.g.Fresh()
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (v *view) start(t *testing.T, id string, expect int) *node {
	t.Helper()
	v.mu.Lock()
	n := v.nodes[id]
	if n == nil {
		n = &node{id: id, addr: freeAddr(t), dir: filepath.Join(t.TempDir(), id)}
		v.nodes[id] = n
	}
	v.mu.Unlock()
	n.fsm = &raftfsm.Recorder{}
	g, err := Open(&Options{Cluster: "a", Node: id, Dir: n.dir, Listen: n.addr, Conn: raftconn.Options{GossipKey: gossipKey},
		BootstrapExpect: expect, HasData: func() bool { return n.hasData }, FSM: n.fsm, Members: v, Reconcile: 50 * time.Millisecond,
		HeartbeatTimeout: 500 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond, LeaderLeaseTimeout: 250 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	v.mu.Lock()
	n.g = g
	v.mu.Unlock()
	return n
}

func (v *view) stop(n *node) {
	v.mu.Lock()
	g := n.g
	n.g = nil
	v.mu.Unlock()
	if g != nil {
		g.Close()
	}
}

func newView(t *testing.T) *view {
	v := &view{nodes: map[string]*node{}}
	t.Cleanup(func() {
		for _, n := range v.nodes {
			v.stop(n)
		}
	})
	return v
}

// startThree starts a1, a2 and a3, expecting three to form the group.
func (v *view) startThree(t *testing.T) []*node {
	var ns []*node
	for _, id := range []string{"a1", "a2", "a3"} {
		ns = append(ns, v.start(t, id, 3))
	}
	return ns
}

func waitFor(t *testing.T, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for deadline := start.Add(15 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 15 s", what)
		}
	}
	return time.Since(start)
}

func (v *view) leader(t *testing.T) *node {
	t.Helper()
	var l *node
	waitFor(t, "a leader", func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, n := range v.nodes {
			if n.g != nil && n.g.IsLeader() {
				l = n
				return true
			}
		}
		return false
	})
	return l
}

func apply(t *testing.T, v *view, prefix string, count int) {
	t.Helper()
	for i := 0; i < count; i++ {
		for {
			l := v.leader(t)
			_, err := l.g.Apply([]byte(fmt.Sprint(prefix, i)), time.Second)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrNotLeader) {
				t.Fatal(err)
			}
		}
	}
}

func expectCommands(t *testing.T, n *node, want []string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s applies %d commands", n.id, len(want)), func() bool { return len(n.fsm.Applied()) >= len(want) })
	if got := n.fsm.Applied(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s applied %v, want %v", n.id, got, want)
	}
}

func seq(prefix string, count int) []string {
	var out []string
	for i := 0; i < count; i++ {
		out = append(out, fmt.Sprint(prefix, i))
	}
	return out
}

// TestFormsAndFailsOver: three fresh nodes form one group; commands reach
// all three in one order; the leader goes and another takes over; it comes
// back and catches up; a fourth node is added by the leader and catches up.
func TestFormsAndFailsOver(t *testing.T) {
	v := newView(t)
	ns := v.startThree(t)
	first := v.leader(t)
	apply(t, v, "w", 10)
	for _, n := range ns {
		expectCommands(t, n, seq("w", 10))
	}
	v.stop(first)
	took := waitFor(t, "a new leader", func() bool {
		for _, n := range ns {
			if n != first && n.g.IsLeader() {
				return true
			}
		}
		return false
	})
	t.Logf("a new leader %s after the old one stopped (election timeout 500ms)", took.Round(time.Millisecond))
	apply(t, v, "x", 10)
	want := append(seq("w", 10), seq("x", 10)...)
	for _, n := range ns {
		if n != first {
			expectCommands(t, n, want)
		}
	}
	back := v.start(t, first.id, 3) // its log and state are kept: it rejoins
	expectCommands(t, back, want)
	extra := v.start(t, "a4", 3) // not fresh-bootstrapping: a group exists
	expectCommands(t, extra, want)
	st := v.leader(t).g.Status()
	if len(st.Servers) != 4 || st.Commit == 0 || st.Applied < st.Commit-1 {
		t.Fatalf("status after adding a4: %+v", st)
	}
}

// TestNodeWithDataDoesNotBootstrap: a node that holds data is not fresh,
// and nobody forms a new group with it (its data belongs to a group that
// exists somewhere).
func TestNodeWithDataDoesNotBootstrap(t *testing.T) {
	v := newView(t)
	v.nodes["a1"] = &node{id: "a1", addr: freeAddr(t), dir: filepath.Join(t.TempDir(), "a1"), hasData: true}
	v.startThree(t)
	time.Sleep(time.Second) // many reconcile rounds and election timeouts
	for _, n := range v.nodes {
		if id, _ := n.g.Leader(); id != "" || n.g.IsLeader() {
			t.Fatalf("a group formed with a node holding data (leader %q)", id)
		}
		if last, _ := n.g.log.LastIndex(); last != 0 {
			t.Fatalf("%s holds raft log entries up to %d", n.id, last)
		}
	}
}

// TestRemoveKeepsQuorum: a removal that would leave fewer live voters than
// a quorum is refused; removing the dead node is not.
func TestRemoveKeepsQuorum(t *testing.T) {
	v := newView(t)
	v.startThree(t)
	l := v.leader(t)
	apply(t, v, "w", 3)
	var dead, other *node
	for _, n := range v.nodes {
		if n != l && dead == nil {
			dead = n
		} else if n != l {
			other = n
		}
	}
	v.stop(dead)
	if err := l.g.Remove(other.id); !errors.Is(err, ErrQuorum) {
		t.Fatalf("removing a live voter with another dead: %v", err)
	}
	if err := l.g.Remove("nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("removing an unknown node: %v", err)
	}
	if err := other.g.Remove(dead.id); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a follower removed a node: %v", err)
	}
	if err := l.g.Remove(dead.id); err != nil {
		t.Fatal(err)
	}
	if st := l.g.Status(); len(st.Servers) != 2 {
		t.Fatalf("after removing %s: %+v", dead.id, st.Servers)
	}
	apply(t, v, "y", 3) // two of two still commit
	expectCommands(t, other, append(seq("w", 3), seq("y", 3)...))
}

func TestOptionsReportEveryProblem(t *testing.T) {
	_, err := Open(&Options{BootstrapExpect: -1})
	if err == nil {
		t.Fatal("empty options accepted")
	}
	for _, want := range []string{"Cluster", "Node", "Dir", "Listen", "FSM", "Members", "negative"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("%q not reported: %v", want, err)
		}
	}
}

// TestVotersLiveSeesALostVoter: the leader counts a voter that stops
// answering its heartbeats as down at once (not when gossip notices, tens of
// seconds later), and live again when it is back; a follower does not
// claim to know.
func TestVotersLiveSeesALostVoter(t *testing.T) {
	v := newView(t)
	ns := v.startThree(t)
	ld := v.leader(t)
	waitFor(t, "three voters live", func() bool {
		live, voters, ok := ld.g.VotersLive()
		return ok && live == 3 && voters == 3
	})
	var f *node
	for _, n := range ns {
		if n != ld {
			if _, _, ok := n.g.VotersLive(); ok {
				t.Fatalf("follower %s claims to know which voters are live", n.id)
			}
			f = n
		}
	}
	v.stop(f)
	waitFor(t, "the stopped voter seen down", func() bool {
		live, voters, ok := ld.g.VotersLive()
		return ok && live == 2 && voters == 3
	})
	v.start(t, f.id, 3)
	waitFor(t, "the voter seen back", func() bool {
		live, voters, ok := ld.g.VotersLive()
		return ok && live == 3 && voters == 3
	})
}
