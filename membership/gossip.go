package membership

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/discovery"
)

// Deps is what the gossip view needs of its node.
type Deps struct {
	// Cluster and NodeID name this node.
	Cluster, NodeID string
	Logger          *slog.Logger
	// OnPeer is told of each change of a member of another cluster (a
	// peer found): the node's links react to it.
	OnPeer func(m api.Member)
}

// StartOptions are how this node joins gossip and what it says of itself.
type StartOptions struct {
	Bind, Advertise string
	Join            []string
	Key             []byte
	Profile         string
	Meta            api.MemberMeta
}

// Gossip is what gossip tells the node: the nodes of its cluster (their
// URLs and incarnations, for raft's membership) and the peer clusters
// found. Gossip finds nodes; it never says where a request goes (package
// forward asks the raft configuration's members over the raft port).
type Gossip struct {
	d Deps
	// disc is set once Start joined; memberlist delivers the first joins
	// while it starts, and the group's reconciliation may ask before.
	disc atomic.Pointer[discovery.Discovery]
}

// New is the gossip view of a node that has not joined yet.
func New(d Deps) *Gossip { return &Gossip{d: d} }

// Start joins the memberlist cluster. The join loop's goroutine (counted
// in bg) exits once a seed answered, or at stop.
func (g *Gossip) Start(o StartOptions, stop <-chan struct{}, bg *sync.WaitGroup) error {
	o.Meta.V, o.Meta.Cluster, o.Meta.Node = discovery.GossipVersion, g.d.Cluster, g.d.NodeID
	name := g.d.Cluster + "-" + g.d.NodeID
	d, err := discovery.Start(discovery.Options{
		NodeName: name, Bind: o.Bind, Advertise: o.Advertise, Join: o.Join, Key: o.Key,
		Profile: o.Profile, Meta: o.Meta, OnChange: g.onMember, Logger: g.d.Logger.With("component", "gossip"),
	})
	if err != nil {
		return err
	}
	g.disc.Store(d)
	bg.Add(1)
	go func() {
		defer bg.Done()
		d.JoinLoop(stop)
	}()
	g.d.Logger.Info("gossip started", "bind", o.Bind, "node", name, "seeds", o.Join)
	return nil
}

// onMember reacts to a member's join, update, departure or death: a member
// of another cluster is the node's to link to.
func (g *Gossip) onMember(m api.Member) {
	if c := m.Meta.Cluster; c == "" || c == g.d.Cluster || m.Note != "" {
		return
	}
	g.d.OnPeer(m)
}

// Note annotates a member, once gossip is set: memberlist delivers the
// first joins while it starts, before Start holds its result; a member is
// noted again at its next change.
func (g *Gossip) Note(node string, shipped bool, note string) {
	if d := g.disc.Load(); d != nil {
		d.SetNote(node, shipped, note)
	}
}

// Members lists the nodes known through gossip (nil without gossip).
func (g *Gossip) Members() []api.Member {
	if d := g.disc.Load(); d != nil {
		return d.Members()
	}
	return nil
}

// SameCluster lists the gossip members of this node's cluster (not this
// node) that gossip a node ID.
func (g *Gossip) SameCluster() []api.Member {
	var out []api.Member
	for _, m := range g.Members() {
		if m.Meta.Cluster == g.d.Cluster && m.Meta.Node != "" && m.Meta.Node != g.d.NodeID && m.Note == "" {
			out = append(out, m)
		}
	}
	return out
}

// Member returns the gossip member of this cluster with node ID id.
func (g *Gossip) Member(id string) (api.Member, bool) {
	for _, m := range g.SameCluster() {
		if m.Meta.Node == id {
			return m, true
		}
	}
	return api.Member{}, false
}

// Refresh keeps what this node gossips current: change edits a copy of
// its metadata, which is gossiped when it differs.
func (g *Gossip) Refresh(change func(*api.MemberMeta)) {
	d := g.disc.Load()
	if d == nil {
		return
	}
	meta := d.Meta()
	want := meta
	change(&want)
	if want != meta {
		if err := d.SetMeta(want, time.Second); err != nil {
			g.d.Logger.Debug("gossip: updating this node's metadata", "err", err)
		}
	}
}

// Stop leaves gracefully: the others learn this node left, rather than
// died.
func (g *Gossip) Stop() error {
	if d := g.disc.Load(); d != nil {
		return d.Leave(5 * time.Second)
	}
	return nil
}

// GroupMembers is the raft group's view of gossip (cluster.Options.Members):
// the nodes of this cluster, this one included once the group is open (its
// own goroutine asks before Open has returned it: Attach).
type GroupMembers struct {
	Gossip      *Gossip
	NodeID      string
	Incarnation string
	g           atomic.Pointer[cluster.Group]
}

// Attach gives the view its node's group, open.
func (gm *GroupMembers) Attach(g *cluster.Group) { gm.g.Store(g) }

func (gm *GroupMembers) Members() []cluster.Member {
	var out []cluster.Member
	if g := gm.g.Load(); g != nil {
		out = append(out, cluster.Member{ID: gm.NodeID, Incarnation: gm.Incarnation, RaftAddr: g.Addr(), Alive: true, Fresh: g.Fresh()})
	}
	for _, m := range gm.Gossip.SameCluster() {
		out = append(out, cluster.Member{ID: m.Meta.Node, Incarnation: m.Meta.Inc, RaftAddr: m.Meta.Raft, Alive: m.State == api.LiveAlive,
			Fresh: m.Meta.Fresh})
	}
	return out
}
