package cluster

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftconn"
)

// Membership (docs/CLUSTER.md "Forming, growing and shrinking" and "A
// node's identity"). raft knows a node as its node ID and its data
// directory's incarnation; gossip says which nodes of the cluster run,
// where, and as which incarnation. The leader:
//
//   - adds a node the configuration lacks as a non-voter, once its raft
//     port confirms the identity gossip reports (raftconn.Identify);
//   - makes it a voter once it applied the log up to the commit index the
//     leader had when it first saw it (a new member with an empty disk
//     would otherwise count toward every quorum while a snapshot of the
//     whole tree is on its way);
//   - then takes out the older incarnations of the same node ID (a wiped
//     node's old self, a restored copy's original), recording each as
//     removed first, so that none comes back;
//   - never adds a server the state machine says was removed.
//
// Gossip is not trusted with more than finding: every identity is
// confirmed on the raft port, which is authenticated.

// ServerID is raft's name for a node: its node ID and, after a dot, its
// data directory's incarnation (the bare node ID for a directory that
// joined a group before incarnations).
func ServerID(node, incarnation string) raft.ServerID {
	if incarnation == "" {
		return raft.ServerID(node)
	}
	return raft.ServerID(node + "." + incarnation)
}

// SplitServerID undoes ServerID.
func SplitServerID(id raft.ServerID) (node, incarnation string) {
	node, incarnation, _ = strings.Cut(string(id), ".")
	return node, incarnation
}

// sameNode reports whether two server IDs name incarnations of one node.
func sameNode(a, b raft.ServerID) bool {
	an, _ := SplitServerID(a)
	bn, _ := SplitServerID(b)
	return an == bn
}

// Removal is why a server is out of the group for good.
type Removal uint8

// Removals.
const (
	// RemovedByOperator: `admin cluster remove` (every incarnation of the
	// node ID).
	RemovedByOperator Removal = 1
	// RemovedReplaced: a newer incarnation of the node ID took its place
	// (its data directory was wiped or restored).
	RemovedReplaced Removal = 2
	// RemovedInRecovery: it was lost with the majority a peers.json
	// recovery left behind.
	RemovedInRecovery Removal = 3
)

func (r Removal) String() string {
	switch r {
	case RemovedByOperator:
		return "removed by an operator (admin cluster remove); a removed node ID is never added back: give the node a new ID and an empty data directory"
	case RemovedReplaced:
		return "replaced by a newer incarnation of its node ID (its data directory was wiped or restored); this one is out for good: start the node with an empty data directory"
	case RemovedInRecovery:
		return "lost with the majority when the cluster was recovered from peers.json; it may hold writes the cluster does not, and never rejoins: start the node with an empty data directory"
	}
	return "removed (reason " + strconv.Itoa(int(r)) + ")"
}

// run bootstraps when the time comes and, while leading, keeps the
// configuration in step with the nodes gossip reports. It exits at Close.
func (g *Group) run() {
	defer close(g.done)
	t := time.NewTicker(g.opts.Reconcile)
	defer t.Stop()
	for {
		g.reconcile()
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
	}
}

func (g *Group) reconcile() {
	members := g.opts.Members.Members()
	if g.raft.State() == raft.Leader {
		g.reconcileMembers(members)
		return
	}
	g.lead.learners = nil // a later term measures again
	g.mu.Lock()
	bootstrapped := g.mu.bootstrapped
	g.mu.Unlock()
	if bootstrapped || g.opts.HasData() {
		return
	}
	if g.opts.FormWith != nil {
		g.formWith()
		return
	}
	if g.opts.BootstrapExpect == 0 {
		return
	}
	// Consul's rule, with one writer of the first configuration: once
	// exactly the expected number of nodes is seen, all fresh (none holds a
	// group's state or data, which would mean a group exists to join), the
	// lowest ID bootstraps with all of them; the others are told of it by
	// the leader's first append.
	var fresh []Member
	for _, m := range members {
		if !m.Fresh {
			return
		}
		if m.Alive {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) != g.opts.BootstrapExpect {
		return
	}
	slices.SortFunc(fresh, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	if fresh[0].ID != g.opts.Node {
		return
	}
	var servers []raft.Server
	for _, m := range fresh {
		id := ServerID(m.ID, m.Incarnation)
		if id != g.id {
			release, ok := g.confirmed(id, m.RaftAddr)
			if !ok {
				return // asked again at the next round
			}
			// Released at once: no member of a group not formed yet
			// decides anything by who the members are, and admissions
			// do not nest.
			release()
		}
		servers = append(servers, raft.Server{ID: id, Address: raft.ServerAddress(m.RaftAddr)})
	}
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		g.opts.Logger.Warn("bootstrap failed", "err", err)
		return
	}
	g.mu.Lock()
	g.mu.bootstrapped = true
	g.mu.Unlock()
	g.opts.Logger.Info("cluster bootstrapped", "nodes", len(servers))
}

// formWith bootstraps a group after 0 with the servers FormWith gives, at
// the lowest ID of them.
func (g *Group) formWith() {
	servers := g.opts.FormWith()
	if len(servers) == 0 {
		return
	}
	servers = slices.Clone(servers)
	slices.SortFunc(servers, func(a, b raft.Server) int { return strings.Compare(string(a.ID), string(b.ID)) })
	if servers[0].ID != g.id {
		return
	}
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		g.opts.Logger.Warn("forming the group failed", "group", g.opts.Number, "err", err)
		return
	}
	g.mu.Lock()
	g.mu.bootstrapped = true
	g.mu.Unlock()
	g.opts.Logger.Info("group formed with group 0's members", "group", g.opts.Number, "nodes", len(servers))
}

// confirmed asks the raft port at addr who answers there: gossip says which
// incarnation runs, the authenticated raft port confirms it.
//
// A member whose raft port did not confirm it is asked again only after
// unconfirmedBackoff: gossip without a key may report any number of
// made-up members (a flood), and each would otherwise cost a dial every
// round.
//
// An admitted node's admission holds until the caller calls release, once
// the node is in the configuration or its change failed (Options.Admit).
func (g *Group) confirmed(id raft.ServerID, addr string) (release func(), ok bool) {
	if g.layer == nil {
		return func() {}, true
	}
	key := string(id) + "@" + addr
	g.unconfirmed.Lock()
	if until, ok := g.unconfirmed.m[key]; ok && time.Now().Before(until) {
		g.unconfirmed.Unlock()
		return nil, false
	}
	g.unconfirmed.Unlock()
	who, err := g.layer.Identify(addr, time.Second)
	if err == nil && who.ID == string(id) {
		if g.opts.Admit == nil {
			return func() {}, true
		}
		if release, err = g.opts.Admit(who.Description); err == nil {
			return release, true
		}
		err = fmt.Errorf("%s answers there, and is not admitted: %w", who.ID, err)
	}
	g.unconfirmed.Lock()
	if g.unconfirmed.m == nil || len(g.unconfirmed.m) > 4096 {
		g.unconfirmed.m = map[string]time.Time{}
	}
	g.unconfirmed.m[key] = time.Now().Add(unconfirmedBackoff)
	g.unconfirmed.Unlock()
	if err == nil {
		err = fmt.Errorf("%s answers there", who.ID)
	}
	g.logOnce("confirm:"+string(id), "gossip reports a node its raft port does not confirm: not added", "server", id, "raft", addr, "err", err)
	return nil, false
}

// unconfirmedBackoff is how long a member its raft port did not confirm is
// left alone before it is asked again.
const unconfirmedBackoff = 2 * time.Second

// reconcileMembers is the leader's round: add new members as non-voters,
// promote those that caught up, retire replaced incarnations.
func (g *Group) reconcileMembers(members []Member) {
	if g.recovery.Load() != nil {
		// Until the recovery's first term recorded who was lost, a lost
		// node back in gossip would look like a new one.
		return
	}
	cf := g.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	servers := cf.Configuration().Servers
	// The configuration never keeps a removed server (one added in a race
	// with its removal record).
	for _, s := range servers {
		if why := g.opts.Removed(s.ID); why != "" && s.ID != g.id {
			if err := g.removeServers([]raft.ServerID{s.ID}, nil); err != nil {
				g.logOnce("sweep:"+string(s.ID), "taking a removed server out of the configuration failed", "server", s.ID, "err", err)
				continue
			}
			g.opts.Logger.Warn("took a removed server out of the configuration", "server", s.ID, "why", why)
			return
		}
	}
	in := map[raft.ServerID]raft.Server{}
	for _, s := range servers {
		in[s.ID] = s
	}
	// current is the incarnation gossip reports running for each node ID.
	current := map[string]raft.ServerID{}
	refused := map[raft.ServerID]string{}
	var candidates []Member
	for _, m := range members {
		if !m.Alive || m.ID == "" || m.RaftAddr == "" {
			continue
		}
		id := ServerID(m.ID, m.Incarnation)
		if why := g.opts.Removed(id); why != "" {
			refused[id] = why
			continue
		}
		current[m.ID] = id
		candidates = append(candidates, m)
	}
	g.mu.Lock()
	g.mu.refused = refused
	g.mu.Unlock()
	for _, m := range candidates {
		id := ServerID(m.ID, m.Incarnation)
		if s, ok := in[id]; ok {
			if string(s.Address) == m.RaftAddr {
				continue
			}
			if id == g.id {
				g.moveServer(s, m.RaftAddr)
			} else if release, ok := g.confirmed(id, m.RaftAddr); ok {
				g.moveServer(s, m.RaftAddr)
				release()
			}
			continue
		}
		release, ok := g.confirmed(id, m.RaftAddr)
		if !ok {
			continue
		}
		if old := serverAt(servers, m.RaftAddr); old != nil {
			// raft holds one server per address. The raft port there just
			// confirmed the new identity: the old one is gone from it (a
			// wiped or restored directory at the same address), and takes no
			// vote or entry any more. It goes first (recorded as replaced);
			// the new one is added at the next round.
			if node, _ := SplitServerID(old.ID); node != m.ID {
				release()
				g.logOnce("addr:"+string(id), "a node gossip reports is at the raft address of another member: not added",
					"server", id, "raft", m.RaftAddr, "member", old.ID)
				continue
			}
			release()
			g.retireOne(*old, id)
			return
		}
		err := g.raft.AddNonvoter(id, raft.ServerAddress(m.RaftAddr), 0, 5*time.Second).Error()
		release()
		if err != nil {
			g.logOnce("add:"+string(id), "adding a node failed", "server", id, "err", err)
			continue
		}
		g.opts.Logger.Info("node added as a non-voter: it votes once it has caught up", "server", id, "raft", m.RaftAddr)
		return // one configuration change at a time
	}
	if g.promote(servers) {
		return
	}
	g.retire(servers, current)
}

// moveServer records a member's new raft address, keeping its suffrage (a
// group of one's first start on the network, a node moved to another host).
func (g *Group) moveServer(s raft.Server, addr string) {
	var err error
	if s.Suffrage == raft.Voter {
		err = g.raft.AddVoter(s.ID, raft.ServerAddress(addr), 0, 5*time.Second).Error()
	} else {
		err = g.raft.AddNonvoter(s.ID, raft.ServerAddress(addr), 0, 5*time.Second).Error()
	}
	if err != nil {
		g.logOnce("move:"+string(s.ID), "updating a node's raft address failed", "server", s.ID, "err", err)
		return
	}
	g.opts.Logger.Info("node's raft address updated", "server", s.ID, "raft", addr)
}

// promote makes a voter of each non-voter that applied the log up to the
// commit index this leader saw when it first met it. It reports whether it
// changed the configuration.
func (g *Group) promote(servers []raft.Server) bool {
	if g.lead.learners == nil {
		g.lead.learners = map[raft.ServerID]uint64{}
	}
	for id := range g.lead.learners {
		if !slices.ContainsFunc(servers, func(s raft.Server) bool { return s.ID == id && s.Suffrage == raft.Nonvoter }) {
			delete(g.lead.learners, id)
		}
	}
	for _, s := range servers {
		if s.Suffrage != raft.Nonvoter || g.opts.Removed(s.ID) != "" {
			continue
		}
		target, ok := g.lead.learners[s.ID]
		if !ok {
			// What this leader applied when it first met the learner, in
			// the learner's unit: the state machine's commands (raft's own
			// entries never reach it).
			target = g.applied()
			g.lead.learners[s.ID] = target
		}
		if g.layer == nil {
			continue
		}
		applied, err := g.learnerApplied(s)
		if err != nil || applied < target {
			continue
		}
		if err := g.raft.AddVoter(s.ID, s.Address, 0, 5*time.Second).Error(); err != nil {
			g.logOnce("promote:"+string(s.ID), "making a caught-up node a voter failed", "server", s.ID, "err", err)
			continue
		}
		delete(g.lead.learners, s.ID)
		g.opts.Logger.Info("node caught up and now votes", "server", s.ID, "applied", applied, "target", target)
		return true
	}
	return false
}

// learnerApplied is the last index learner s applied in this group: what
// its raft port says, once it answers as s, for group 0; what
// MemberApplied learns for a group after it.
func (g *Group) learnerApplied(s raft.Server) (uint64, error) {
	who, err := g.layer.Identify(string(s.Address), time.Second)
	if err != nil {
		return 0, err
	}
	if who.ID != string(s.ID) {
		return 0, fmt.Errorf("%s answers at %s, not %s", who.ID, s.Address, s.ID)
	}
	if g.opts.MemberApplied != nil {
		return g.opts.MemberApplied(s.ID, string(s.Address))
	}
	return who.Applied, nil
}

// retire takes out the incarnations of a node ID older than the one gossip
// reports running, once that one votes: recorded as removed first, so that
// a copy of the old one never comes back.
func (g *Group) retire(servers []raft.Server, current map[string]raft.ServerID) {
	for _, s := range servers {
		node, _ := SplitServerID(s.ID)
		now, ok := current[node]
		if !ok || now == s.ID || s.ID == g.id {
			continue
		}
		if !slices.ContainsFunc(servers, func(o raft.Server) bool { return o.ID == now && o.Suffrage == raft.Voter }) {
			continue // not before the one that replaces it votes
		}
		g.retireOne(s, now)
		return
	}
}

// retireOne takes out incarnation s of a node that now runs as now:
// recorded as removed first, so that a copy of it never comes back.
func (g *Group) retireOne(s raft.Server, now raft.ServerID) {
	err := g.removeServers([]raft.ServerID{s.ID}, func() error { return g.opts.RecordRemoved(s.ID, RemovedReplaced) })
	if err != nil {
		g.logOnce("retire:"+string(s.ID), "taking out a replaced incarnation failed", "server", s.ID, "replaced_by", now, "err", err)
		return
	}
	g.opts.Logger.Warn("took out a node's replaced incarnation", "server", s.ID, "replaced_by", now)
}

// serverAt is the member of the configuration at a raft address.
func serverAt(servers []raft.Server, addr string) *raft.Server {
	for i := range servers {
		if string(servers[i].Address) == addr {
			return &servers[i]
		}
	}
	return nil
}

// logOnce logs a warning of a kind at most every 10 s (the leader's round
// runs every Reconcile).
func (g *Group) logOnce(kind, msg string, args ...any) {
	if g.lead.logged == nil {
		g.lead.logged = map[string]time.Time{}
	}
	if t, ok := g.lead.logged[kind]; ok && time.Since(t) < 10*time.Second {
		return
	}
	if len(g.lead.logged) > 1000 {
		g.lead.logged = map[string]time.Time{}
	}
	g.lead.logged[kind] = time.Now()
	g.opts.Logger.Warn(msg, args...)
}

// Join adds a node as a non-voter (an operator's join, or one gossip does
// not report); the leader makes it a voter once it caught up. id is a node
// ID, whose incarnation the node's raft port tells, or a raft server ID. A
// removed one is refused.
//
// force skips asking the node's raft port who it is (the operator's stated
// emergency): id is then taken as given, and the node is still added as a
// non-voter, which the membership round promotes only once it answered as
// id and caught up.
func (g *Group) Join(id, addr string, force bool) error {
	if !g.IsLeader() {
		lid, laddr := g.Leader()
		return &NotLeaderError{LeaderID: lid, LeaderAddr: laddr}
	}
	if id == "" || addr == "" {
		return fmt.Errorf("cluster: join: a node ID and a raft address are required")
	}
	sid := raft.ServerID(id)
	if g.layer != nil && !force {
		who, err := g.layer.Identify(addr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("cluster: join %s at %s: its raft port did not say who it is: %w", id, addr, err)
		}
		node, _ := SplitServerID(raft.ServerID(who.ID))
		if (strings.Contains(id, ".") && who.ID != id) || (!strings.Contains(id, ".") && node != id) {
			return fmt.Errorf("cluster: join %s at %s: %s answers there", id, addr, who.ID)
		}
		sid = raft.ServerID(who.ID)
		if g.opts.Admit != nil {
			release, err := g.opts.Admit(who.Description)
			if err != nil {
				return fmt.Errorf("cluster: join %s at %s: %w", id, addr, err)
			}
			defer release() // until the configuration holds the node
		}
	}
	if why := g.opts.Removed(sid); why != "" {
		return fmt.Errorf("%w: %s: %s", ErrRemoved, sid, why)
	}
	if err := g.raft.AddNonvoter(sid, raft.ServerAddress(addr), 0, 10*time.Second).Error(); err != nil {
		return fmt.Errorf("cluster: join %s at %s: %w", sid, addr, err)
	}
	return nil
}

// Leader is the known leader's node ID and raft address (empty: none
// known).
func (g *Group) Leader() (id, addr string) {
	a, i := g.raft.LeaderWithID()
	node, _ := SplitServerID(i)
	return node, string(a)
}

// ID is this node's raft server ID.
func (g *Group) ID() raft.ServerID { return g.id }

// Server is one member of the configuration.
type Server struct {
	ID          string `json:"id"`
	Incarnation string `json:"incarnation,omitempty"`
	Raft        string `json:"raft"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
	Alive       bool   `json:"alive"`
}

// Status is /admin/cluster's document.
type Status struct {
	Cluster     string   `json:"cluster"`
	Node        string   `json:"node"`
	Incarnation string   `json:"incarnation,omitempty"`
	State       string   `json:"state"`
	Leader      string   `json:"leader"`
	Term        uint64   `json:"term"`
	Commit      uint64   `json:"commit_index"`
	Applied     uint64   `json:"applied_index"`
	Last        uint64   `json:"last_log_index"`
	Servers     []Server `json:"servers"`
	// Refused are the members gossip reports that the leader keeps out,
	// and why (the leader's view).
	Refused map[string]string `json:"refused,omitempty"`
	// RefusedBy is the last time another node refused this one: it was
	// removed, replaced, or lost in a recovery.
	RefusedBy *raftconn.Refusal `json:"refused_by,omitempty"`
}

// Status reports this node's view of the group.
func (g *Group) Status() Status {
	st := g.raft.Stats()
	num := func(k string) uint64 { v, _ := strconv.ParseUint(st[k], 10, 64); return v }
	leader, _ := g.Leader()
	_, leaderID := g.raft.LeaderWithID()
	s := Status{Cluster: g.opts.Cluster, Node: g.opts.Node, Incarnation: g.opts.Incarnation, State: g.raft.State().String(), Leader: leader,
		Term: num("term"), Commit: g.raft.CommitIndex(), Applied: g.raft.AppliedIndex(), Last: num("last_log_index")}
	alive := map[raft.ServerID]bool{}
	for _, m := range g.opts.Members.Members() {
		alive[ServerID(m.ID, m.Incarnation)] = m.Alive
	}
	if cf := g.raft.GetConfiguration(); cf.Error() == nil {
		for _, sv := range cf.Configuration().Servers {
			node, inc := SplitServerID(sv.ID)
			s.Servers = append(s.Servers, Server{ID: node, Incarnation: inc, Raft: string(sv.Address), Voter: sv.Suffrage == raft.Voter,
				Leader: sv.ID == leaderID, Alive: alive[sv.ID] || sv.ID == g.id})
		}
	}
	g.mu.Lock()
	for id, why := range g.mu.refused {
		if s.Refused == nil {
			s.Refused = map[string]string{}
		}
		s.Refused[string(id)] = why
	}
	g.mu.Unlock()
	if g.layer != nil {
		// And those whose raft traffic it refused lately (a lost node that
		// came back, perhaps never seen by gossip: it stopped at once).
		for id, r := range g.layer.Refusing(10 * time.Minute) {
			if s.Refused == nil {
				s.Refused = map[string]string{}
			}
			if _, ok := s.Refused[id]; !ok {
				s.Refused[id] = fmt.Sprintf("%s (its raft traffic refused at %s)", r.Reason, r.At.UTC().Format(time.RFC3339))
			}
		}
	}
	if g.layer != nil {
		if r := g.refusedBy.Load(); r != nil && time.Since(r.At) < time.Minute {
			s.RefusedBy = r
		}
	}
	return s
}

// Remove takes a node out of the group. It is refused when the voters left
// that gossip sees alive would not be a majority of the new configuration.
func (g *Group) Remove(id string) error { return g.RemoveWith(id, nil) }

// RemoveWith is Remove, calling before (when set) once the removal was
// found to keep a quorum and before it is made: the node records that the
// ID was removed, so that the leader never adds it back. id is a node ID
// (every incarnation of it goes) or a raft server ID (that one).
func (g *Group) RemoveWith(id string, before func() error) error {
	if !g.IsLeader() {
		lid, addr := g.Leader()
		return &NotLeaderError{LeaderID: lid, LeaderAddr: addr}
	}
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("cluster: remove %s: %w", id, err)
	}
	var ids []raft.ServerID
	for _, s := range cf.Configuration().Servers {
		if node, _ := SplitServerID(s.ID); string(s.ID) == id || (!strings.Contains(id, ".") && node == id) {
			ids = append(ids, s.ID)
		}
	}
	if len(ids) == 0 {
		return fmt.Errorf("%w: %s", ErrUnknownNode, id)
	}
	return g.removeServers(ids, before)
}

// removeServers takes servers out, one configuration change each, after
// checking that the voters left that are alive are a quorum.
func (g *Group) removeServers(ids []raft.ServerID, before func() error) error {
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("cluster: remove %v: %w", ids, err)
	}
	alive := map[raft.ServerID]bool{g.id: true}
	for _, m := range g.opts.Members.Members() {
		if m.Alive {
			alive[ServerID(m.ID, m.Incarnation)] = true
		}
	}
	voters, live := 0, 0
	for _, s := range cf.Configuration().Servers {
		if slices.Contains(ids, s.ID) || s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if alive[s.ID] {
			live++
		}
	}
	if voters == 0 || live < voters/2+1 {
		return fmt.Errorf("%w: removing %v leaves %d voters, %d of them alive (a quorum is %d)", ErrQuorum, ids, voters, live, voters/2+1)
	}
	if before != nil {
		if err := before(); err != nil {
			return fmt.Errorf("cluster: remove %v: %w", ids, err)
		}
	}
	for _, id := range ids {
		if err := g.raft.RemoveServer(id, 0, 10*time.Second).Error(); err != nil {
			return fmt.Errorf("cluster: remove %s: %w", id, err)
		}
	}
	return nil
}
