package groups

import (
	"log/slog"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/slot"
)

// Keeper keeps a node's groups in line with its cluster's: group 0's
// leader records the cluster's groups and slot map when the cluster forms
// (before any write is admitted); a node whose number of groups disagrees
// with the record stops; a node that leads more groups than another
// hands one over; and it reports the groups.
type Keeper struct {
	Router *Router
	// Count is the number of groups the node was started with.
	Count  int
	NodeID string
	// Servers are group 0's configuration (nil: a node alone).
	Servers func() []cluster.Server
	// Fatal stops the node for a reason a restart does not fix.
	Fatal  func(error)
	Logger *slog.Logger
}

// Record runs on a timer: group 0's leader records the cluster's groups
// once (a node alone at its start); every node stops when the record
// disagrees with its own number of groups (a node added with another
// --groups), or when it would record groups over a tree a cluster of one
// group wrote.
func (k *Keeper) Record() {
	zero := k.Router.Zero
	mc := zero.Rep.Machine()
	m := mc.Slots()
	if err := Check(m, k.Count, false); err != nil {
		k.Fatal(err)
		return
	}
	if m != nil || k.Count <= 1 || !zero.Rep.Ready() || mc.Format() < machine.FormatGroups {
		return
	}
	if empty, err := zero.Store.Empty(); err != nil || !empty {
		k.Fatal(Check(nil, k.Count, true))
		return
	}
	m, _ = slot.Initial(k.Count)
	if err := zero.Rep.ApplyCommand(&machine.Command{Groups: &machine.GroupsCmd{Map: m}}); err != nil {
		k.Logger.Warn("recording the cluster's raft groups", "groups", k.Count, "err", err)
	}
}

// Spread moves one group's leadership from this node when it leads more
// groups than another voter by two or more (cluster.SpreadMove): every
// node reads the same leaders, so only the loaded one acts. On a timer, one
// move a round.
func (k *Keeper) Spread() {
	if k.Router.Set == nil || k.Servers == nil {
		return
	}
	var nodes []string
	incs := map[string]string{}
	for _, sv := range k.Servers() {
		if sv.Voter && sv.Alive {
			nodes, incs[sv.ID] = append(nodes, sv.ID), sv.Incarnation
		}
	}
	gs := k.Router.All()
	leaders := make([]string, len(gs))
	for i, g := range gs {
		leaders[i], _ = cluster.SplitServerID(g.Rep.Group().LeaderServer())
	}
	g, to, ok := cluster.SpreadMove(leaders, nodes)
	if !ok || leaders[g] != k.NodeID || !gs[g].Rep.Ready() {
		return
	}
	if err := gs[g].Rep.Group().TransferLeadershipTo(raft.ServerID(cluster.ServerID(to, incs[to]))); err != nil {
		k.Logger.Info("spreading the groups' leaders", "group", g, "to", to, "err", err)
	}
}

// Report is the cluster's groups as this node sees them (nil: one group).
func (k *Keeper) Report() []api.GroupReport {
	if k.Router.Set == nil {
		return nil
	}
	m := k.Router.Zero.Rep.Machine().Slots()
	if m == nil {
		m, _ = slot.Initial(k.Router.Count())
	}
	var out []api.GroupReport
	for _, g := range k.Router.All() {
		grp := g.Rep.Group()
		leader, _ := cluster.SplitServerID(grp.LeaderServer())
		out = append(out, api.GroupReport{Group: g.Number, Leader: leader, State: strings.ToLower(grp.Status().State),
			Slots: m.SlotsOf(g.Number), Applied: g.Rep.Applied()})
	}
	return out
}
