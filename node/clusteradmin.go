package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/origin"
)

// localCluster is this node's own part of the report.
func (n *Node) LocalCluster() api.ClusterReport {
	st := n.group.Status()
	r := api.ClusterReport{Cluster: n.cluster, Node: n.nodeID, Mode: "single", State: strings.ToLower(st.State), Leader: st.Leader,
		Term: st.Term, Commit: st.Commit, Applied: n.progress.get(), Last: st.Last, Stream: n.out.Stream().String()}
	if n.multi() {
		r.Mode = "raft"
		if st.State == "Leader" && !n.lead.ready.Load() {
			r.State = "leader (applying the log)"
		}
	}
	r.Incarnation, r.RefusedBy = n.incarnation, st.RefusedBy
	for _, sv := range st.Servers {
		cn := api.ClusterNode{ID: sv.ID, Incarnation: sv.Incarnation, Raft: sv.Raft, Voter: sv.Voter, Leader: sv.Leader}
		m, seen := n.gossip.Member(sv.ID)
		switch {
		case sv.ID == n.nodeID && sv.Incarnation == n.incarnation:
			cn.Gossip, cn.API, cn.State, cn.Applied, cn.Term = "self", n.URL(), r.State, r.Applied, r.Term
		case sv.ID == n.nodeID || (seen && m.Meta.Inc != sv.Incarnation):
			// Another incarnation of the node runs now: this one is taken
			// out once the new one votes.
			cn.Gossip, cn.State, cn.Error = "replaced", "replaced", "a newer incarnation of this node ID runs: this one goes once that one votes"
		case seen:
			cn.Gossip, cn.API = m.State, m.Meta.API
		}
		r.Nodes = append(r.Nodes, cn)
	}
	// Nodes gossip sees that the configuration does not hold (yet): a
	// node waiting to be added, or one kept out.
	for _, m := range n.gossip.SameCluster() {
		held := slices.ContainsFunc(r.Nodes, func(c api.ClusterNode) bool { return c.ID == m.Meta.Node && c.Incarnation == m.Meta.Inc })
		if held {
			continue
		}
		cn := api.ClusterNode{ID: m.Meta.Node, Incarnation: m.Meta.Inc, Raft: m.Meta.Raft, API: m.Meta.API, Gossip: m.State, State: "not a member"}
		if why := n.cons.removedServer(cluster.ServerID(m.Meta.Node, m.Meta.Inc)); why != "" {
			cn.State, cn.Error = "removed", why
		}
		r.Nodes = append(r.Nodes, cn)
	}
	// Nodes kept out whose raft traffic this node refused lately, gossip or
	// not.
	for id, why := range st.Refused {
		node, inc := cluster.SplitServerID(raft.ServerID(id))
		if !slices.ContainsFunc(r.Nodes, func(c api.ClusterNode) bool { return c.ID == node && c.Incarnation == inc }) {
			r.Nodes = append(r.Nodes, api.ClusterNode{ID: node, Incarnation: inc, State: "removed", Error: why})
		}
	}
	return r
}

// ClusterReport asks every node of the configuration for its own state
// and puts the answers together. It asks over the raft port, the member
// the configuration names at the address it holds (service.go): no caller
// credential goes anywhere, and a gossip member claiming a member's node ID
// is never asked.
func (n *Node) ClusterReport(ctx context.Context) api.ClusterReport {
	r := n.LocalCluster()
	var wg sync.WaitGroup
	commits := make([]uint64, len(r.Nodes))
	for i := range r.Nodes {
		cn := &r.Nodes[i]
		if cn.Gossip == "self" || cn.State == "removed" || cn.State == "not a member" || cn.State == "replaced" {
			continue
		}
		id := cluster.ServerID(cn.ID, cn.Incarnation)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, state := n.svc.Proven(id, true); state == forward.DescKnown {
				cn.API = d.API // what it says of itself, not gossip's
			}
			theirs, err := askCluster(n.svc, ctx, id)
			switch {
			case errors.Is(err, cluster.ErrOlderBuild):
				cn.State, cn.Error = "older build", "it runs a build that answers no requests on its raft port: its state is not asked (no credential goes to the URL gossip reports)"
				return
			case err != nil:
				cn.State, cn.Error = "unreachable", err.Error()
				return
			}
			cn.State, cn.Applied, cn.Term = theirs.State, theirs.Applied, theirs.Term
			commits[i] = theirs.Commit
		}()
	}
	wg.Wait()
	for _, c := range commits {
		r.Commit = max(r.Commit, c) // a follower may know more than a deposed node
	}
	for i := range r.Nodes {
		if cn := &r.Nodes[i]; cn.Raft != "" && cn.State != "unreachable" && cn.State != "removed" && cn.State != "not a member" &&
			cn.State != "replaced" && r.Commit > cn.Applied {
			cn.Lag = r.Commit - cn.Applied
		}
	}
	return r
}

// askCluster asks member id its own part of the report, over the raft port.
func askCluster(s *forward.Service, ctx context.Context, id raft.ServerID) (api.ClusterReport, error) {
	var r api.ClusterReport
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, forward.URL(id, "/admin/cluster?local=1"), nil)
	if err != nil {
		return r, err
	}
	// Asked while answering /admin/cluster, which took the admin scope.
	req.Header.Set(forward.HeaderScope, httpapi.ScopeAdmin.String())
	resp, err := s.Client.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("answered %s", resp.Status)
	}
	return r, json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&r)
}

// JoinNode adds a node to the cluster (the leader does it for every node
// gossip finds; this is for one it does not): as a non-voter, made a voter
// once it caught up. id is a node ID (its raft port tells its incarnation)
// or a raft server ID ("node.incarnation").
//
// force, when not empty, is the operator's reason to add the node although
// its raft port does not say who it is (a node of an older build, one not
// started yet): it is still added as a non-voter, and votes only once it
// answered and caught up, so an unreachable address costs no quorum.
func (n *Node) JoinNode(id, raftAddr, force string) error {
	if !n.multi() {
		return fmt.Errorf("%w: this node is alone in its cluster (no --raft-listen): restart it with a raft port first", api.ErrNotACluster)
	}
	if err := validServerRef(id); err != nil {
		return err
	}
	if force != "" {
		n.log.Warn("admin cluster join --force: adding a node its raft port did not confirm", "node", id, "raft", raftAddr, "reason", force)
	}
	return n.group.Join(id, raftAddr, force != "")
}

// validServerRef checks a node ID, or a node ID and an incarnation.
func validServerRef(id string) error {
	node, inc, one := strings.Cut(id, ".")
	if err := origin.Validate(node); err != nil {
		return fmt.Errorf("%w: node ID: %w", api.ErrBadRequest, err)
	}
	if one && (inc == "" || !origin.ValidIncarnation(inc)) {
		return fmt.Errorf("%w: %q: an incarnation is 8 hex digits after the node ID and a dot", api.ErrBadRequest, id)
	}
	return nil
}

// RemoveNode takes a node out of the cluster, for good: its ID is recorded
// as removed (through the log) before the configuration changes, and is
// never added back. id is a node ID (every incarnation of it goes) or a
// raft server ID ("node.incarnation": that incarnation goes, the node ID
// stays usable). A removal that would leave no quorum of live voters is
// refused.
func (n *Node) RemoveNode(id string) error {
	if !n.multi() {
		return fmt.Errorf("%w: this node is alone in its cluster", api.ErrNotACluster)
	}
	if err := validServerRef(id); err != nil {
		return err
	}
	return n.group.RemoveWith(id, func() error {
		return n.cons.applyCommand(&machine.Command{RemoveNode: &machine.RemoveNodeCmd{ID: id}})
	})
}
