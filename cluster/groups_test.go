package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/internal/raftfsm"
)

// gview is gossip's view of nodes that each run several raft groups over
// one port.
type gview struct {
	// dir holds the nodes' directories: made before the nodes stop at the
	// test's end (cleanups run last first), so it is removed after.
	dir    string
	t      *testing.T
	groups int
	mu     sync.Mutex
	nodes  map[string]*gnode
}

type gnode struct {
	id, addr, dir string
	gs            []*Group
	fsms          []*raftfsm.Recorder
}

func (v *gview) Members() []Member {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []Member
	for _, n := range v.nodes {
		m := Member{ID: n.id, RaftAddr: n.addr, Alive: n.gs != nil}
		if n.gs != nil {
			m.Fresh = n.gs[0].Fresh()
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// applied is what node id's state machine of group g applied (the
// MemberApplied of the groups after 0).
func (v *gview) applied(g int) func(id raft.ServerID, _ string) (uint64, error) {
	return func(id raft.ServerID, _ string) (uint64, error) {
		v.mu.Lock()
		defer v.mu.Unlock()
		node, _ := SplitServerID(id)
		n := v.nodes[node]
		if n == nil || n.gs == nil {
			return 0, fmt.Errorf("%s is not running", id)
		}
		return n.gs[g].applied(), nil
	}
}

// start opens node id's groups: group 0 opens the port, the others share
// it.
func (v *gview) start(id string, expect int) *gnode {
	v.t.Helper()
	v.mu.Lock()
	n := v.nodes[id]
	if n == nil {
		n = &gnode{id: id, addr: freeAddr(v.t), dir: filepath.Join(v.dir, id)}
		v.nodes[id] = n
	}
	v.mu.Unlock()
	var gs []*Group
	var fsms []*raftfsm.Recorder
	for g := range v.groups {
		fsm := &raftfsm.Recorder{}
		o := &Options{Cluster: "a", Node: id, Dir: filepath.Join(n.dir, fmt.Sprint("group", g)), Number: g,
			BootstrapExpect: expect, FSM: fsm, Members: v, Reconcile: 50 * time.Millisecond,
			HeartbeatTimeout: 500 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond, LeaderLeaseTimeout: 250 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if g == 0 {
			o.Listen, o.Conn = n.addr, raftconn.Options{GossipKey: gossipKey}
		} else {
			o.Port, o.MemberApplied = gs[0].Port(), v.applied(g)
		}
		grp, err := Open(o)
		if err != nil {
			v.t.Fatal(err)
		}
		gs, fsms = append(gs, grp), append(fsms, fsm)
	}
	v.mu.Lock()
	n.gs, n.fsms = gs, fsms
	v.mu.Unlock()
	return n
}

// stop closes a node's groups, group 0 last (it closes the port).
func (v *gview) stop(n *gnode) {
	v.mu.Lock()
	gs := n.gs
	n.gs = nil
	v.mu.Unlock()
	for i := len(gs) - 1; i >= 0; i-- {
		gs[i].Close()
	}
}

// leaders names each group's leader ("" while it has none).
func (v *gview) leaders() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]string, v.groups)
	for _, n := range v.nodes {
		for g, grp := range n.gs {
			if grp.IsLeader() {
				out[g] = n.id
			}
		}
	}
	return out
}

func (v *gview) leaderOf(g int) *Group {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, n := range v.nodes {
		if n.gs != nil && n.gs[g].IsLeader() {
			return n.gs[g]
		}
	}
	return nil
}

// apply commits cmd in group g, at its leader of the moment.
func (v *gview) apply(g int, cmd string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		l := v.leaderOf(g)
		if l != nil {
			_, err := l.Apply([]byte(cmd), time.Second)
			if err == nil {
				return nil
			}
			if !errors.Is(err, ErrNotLeader) {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %d: no leader took %q in %s", g, cmd, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGroupsOverOnePort (issue 51): three nodes each run three raft groups
// over one raft port. Each group forms, elects and commits on its own, and
// each node's state machine of a group applies that group's commands only.
// The leaders spread (SpreadMove, one transfer at a time) until each node
// leads one group. The node leading group 1 goes: group 1 elects another
// leader while group 2, led elsewhere, keeps committing without a failure.
// A fourth node joins every group as a learner, catches up in each (its
// group's applied index, not group 0's) and votes in each.
func TestGroupsOverOnePort(t *testing.T) {
	v := &gview{dir: t.TempDir(), t: t, groups: 3, nodes: map[string]*gnode{}}
	t.Cleanup(func() {
		for _, n := range v.nodes {
			v.stop(n)
		}
	})
	for _, id := range []string{"a1", "a2", "a3"} {
		v.start(id, 3)
	}
	for g := range v.groups {
		for i := range 5 {
			if err := v.apply(g, fmt.Sprintf("g%d-%d", g, i), 15*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range v.nodes {
		for g, fsm := range n.fsms {
			waitFor(t, fmt.Sprintf("%s applies group %d's commands", n.id, g), func() bool { return len(fsm.Applied()) == 5 })
			for _, c := range fsm.Applied() {
				if !strings.HasPrefix(c, fmt.Sprintf("g%d-", g)) {
					t.Fatalf("%s's state machine of group %d applied %q", n.id, g, c)
				}
			}
		}
	}

	// Spread the leaders.
	nodes := []string{"a1", "a2", "a3"}
	waitFor(t, "the leaders spread one group a node", func() bool {
		leaders := v.leaders()
		g, to, ok := SpreadMove(leaders, nodes)
		if !ok {
			return !strings.Contains(strings.Join(leaders, ","), ",,") && leaders[0] != "" && leaders[len(leaders)-1] != ""
		}
		if l := v.leaderOf(g); l != nil {
			v.mu.Lock()
			id := v.nodes[to].gs[g].id
			v.mu.Unlock()
			_ = l.TransferLeadershipTo(id)
		}
		return false
	})
	leaders := v.leaders()
	t.Logf("leaders after spreading: %v", leaders)

	// The leader of group 1 goes; group 2's keeps committing meanwhile.
	gone := v.nodes[leaders[1]]
	v.stop(gone)
	var failures []error
	elected := false
	for i := 0; !elected || i < 20; i++ {
		// group 2's leader is another node: every write there succeeds
		// at once, elected or not in group 1.
		if l := v.leaderOf(2); l == nil {
			failures = append(failures, fmt.Errorf("group 2 without a leader at write %d", i))
		} else if _, err := l.Apply([]byte(fmt.Sprint("g2-during-", i)), 2*time.Second); err != nil {
			failures = append(failures, err)
		}
		elected = v.leaderOf(1) != nil
		time.Sleep(20 * time.Millisecond)
		if i > 1000 {
			t.Fatal("group 1 elected no leader after its leader went")
		}
	}
	if len(failures) > 0 {
		t.Fatalf("group 2's writes failed while group 1 elected: %v", failures)
	}
	if err := v.apply(1, "g1-after", 15*time.Second); err != nil {
		t.Fatal(err)
	}

	// A fourth node joins every group and votes in each once caught up.
	v.start(gone.id, 3) // back, as it was
	a4 := v.start("a4", 0)
	for g := range v.groups {
		waitFor(t, fmt.Sprintf("a4 votes in group %d", g), func() bool {
			l := v.leaderOf(g)
			if l == nil {
				return false
			}
			cf := l.raft.GetConfiguration()
			if cf.Error() != nil {
				return false
			}
			for _, s := range cf.Configuration().Servers {
				if s.ID == a4.gs[g].id {
					return s.Suffrage == raft.Voter
				}
			}
			return false
		})
		if err := v.apply(g, fmt.Sprintf("g%d-with-a4", g), 15*time.Second); err != nil {
			t.Fatal(err)
		}
		fsm := a4.fsms[g]
		waitFor(t, fmt.Sprintf("a4 applies group %d's commands", g), func() bool {
			got := fsm.Applied()
			return len(got) > 0 && got[len(got)-1] == fmt.Sprintf("g%d-with-a4", g)
		})
		for _, c := range fsm.Applied() {
			if !strings.HasPrefix(c, fmt.Sprintf("g%d-", g)) {
				t.Fatalf("a4's state machine of group %d applied %q", g, c)
			}
		}
	}
}
