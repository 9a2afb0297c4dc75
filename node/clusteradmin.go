package node

import (
	"context"
	"fmt"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/membership"
)

// LocalCluster is this node's own part of the cluster report.
func (n *Node) LocalCluster() api.ClusterReport { return n.report.Local() }

// ClusterReport asks every node of the configuration for its own state
// and puts the answers together, over the raft port (membership.Report).
func (n *Node) ClusterReport(ctx context.Context) api.ClusterReport { return n.report.Cluster(ctx) }

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
	if err := membership.ValidServerRef(id); err != nil {
		return err
	}
	if force != "" {
		n.log.Warn("admin cluster join --force: adding a node its raft port did not confirm", "node", id, "raft", raftAddr, "reason", force)
	}
	return n.group.Join(id, raftAddr, force != "")
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
	if err := membership.ValidServerRef(id); err != nil {
		return err
	}
	return n.group.RemoveWith(id, func() error {
		return n.rep.ApplyCommand(&machine.Command{RemoveNode: &machine.RemoveNodeCmd{ID: id}})
	})
}
