package membership

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
	"github.com/replicator/replicator/origin"
)

// ReportDeps is what the cluster report reads of its node.
type ReportDeps struct {
	// Cluster, NodeID and Incarnation name this node; Mode is how its
	// cluster runs ("single": a node alone, "raft": one of several).
	Cluster, NodeID, Incarnation, Mode string
	Group                              *cluster.Group
	Gossip                             *Gossip
	Service                            *forward.Service
	// Applied is the last log index applied here; Format the log's
	// command format; Ready: this node leads
	// and its term began; Stream the cluster's stream; URL this node's API.
	Applied func() uint64
	Format  func() int
	Ready   func() bool
	Stream  func() string
	URL     func() string
	// Removed says why a raft server may not be a member ("": it may);
	// RemovedAll lists every removal record of the log.
	Removed    func(id raft.ServerID) string
	RemovedAll func() []api.RemovedNode
	// Groups are the cluster's raft groups as this node sees them (nil:
	// one group).
	Groups func() []api.GroupReport
}

// Report is the cluster report (GET /admin/cluster): the configuration's
// nodes as raft, gossip and each node itself see them.
type Report struct{ d ReportDeps }

// NewReport builds the cluster report of d.
func NewReport(d ReportDeps) *Report { return &Report{d: d} }

// Local is this node's own part of the cluster report.
func (c *Report) Local() api.ClusterReport {
	d := c.d
	st := d.Group.Status()
	r := api.ClusterReport{Cluster: d.Cluster, Node: d.NodeID, Mode: d.Mode, State: strings.ToLower(st.State), Leader: st.Leader,
		Term: st.Term, Commit: st.Commit, Applied: d.Applied(), Last: st.Last, Stream: d.Stream()}
	if st.State == "Leader" && !d.Ready() {
		r.State = "leader (applying the log)"
	}
	r.Incarnation, r.RefusedBy, r.Format = d.Incarnation, st.RefusedBy, d.Format()
	r.First, _ = d.Group.LogBounds()
	if d.RemovedAll != nil {
		r.Removed = d.RemovedAll()
	}
	if d.Groups != nil {
		r.Groups = d.Groups()
	}
	for _, sv := range st.Servers {
		cn := api.ClusterNode{ID: sv.ID, Incarnation: sv.Incarnation, Raft: sv.Raft, Voter: sv.Voter, Leader: sv.Leader}
		m, seen := d.Gossip.Member(sv.ID)
		switch {
		case sv.ID == d.NodeID && sv.Incarnation == d.Incarnation:
			cn.Gossip, cn.API, cn.State, cn.Applied, cn.Term = "self", d.URL(), r.State, r.Applied, r.Term
		case sv.ID == d.NodeID || (seen && m.Meta.Inc != sv.Incarnation):
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
	for _, m := range d.Gossip.SameCluster() {
		held := slices.ContainsFunc(r.Nodes, func(c api.ClusterNode) bool { return c.ID == m.Meta.Node && c.Incarnation == m.Meta.Inc })
		if held {
			continue
		}
		cn := api.ClusterNode{ID: m.Meta.Node, Incarnation: m.Meta.Inc, Raft: m.Meta.Raft, API: m.Meta.API, Gossip: m.State, State: "not a member"}
		if why := d.Removed(cluster.ServerID(m.Meta.Node, m.Meta.Inc)); why != "" {
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

// Cluster asks every node of the configuration for its own state
// and puts the answers together. It asks over the raft port, the member
// the configuration names at the address it holds (service.go): no caller
// credential goes anywhere, and a gossip member claiming a member's node ID
// is never asked.
func (c *Report) Cluster(ctx context.Context) api.ClusterReport {
	d := c.d
	r := c.Local()
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
			if d, state := d.Service.Proven(id, true); state == forward.DescKnown {
				cn.API = d.API // what it says of itself, not gossip's
			}
			theirs, err := askCluster(d.Service, ctx, id)
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
	req.Header.Set(forward.HeaderScope, api.ScopeAdmin.String())
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

// ValidServerRef checks a node ID, or a node ID and an incarnation.
func ValidServerRef(id string) error {
	node, inc, one := strings.Cut(id, ".")
	if err := origin.Validate(node); err != nil {
		return fmt.Errorf("%w: node ID: %w", api.ErrBadRequest, err)
	}
	if one && (inc == "" || !origin.ValidIncarnation(inc)) {
		return fmt.Errorf("%w: %q: an incarnation is 8 hex digits after the node ID and a dot", api.ErrBadRequest, id)
	}
	return nil
}
