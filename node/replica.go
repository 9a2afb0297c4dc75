package node

import (
	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/membership"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/wal"
)

// replicaDeps is what the node's replica is built from: the node's values,
// and functions on the parts it hands each term (the rejoin protocol, the
// links) and on its metrics.
func (n *Node) replicaDeps() (replica.Deps, error) {
	o := &n.opts
	d := replica.Deps{
		Cluster: n.cluster, NodeID: n.nodeID, Incarnation: n.incarnation, Dir: o.DataDir,
		Store: n.store, Clock: n.clock, Logger: n.log,
		Committer: replica.CommitEnv{MaxGroup: o.MaxGroupEntries, IdemWindow: o.IdempotencyWindow, CheckPin: n.bounds.CheckPin},
		Log:       wal.Options{SegmentSize: o.WALSegmentSize, NoSync: o.UnsafeNoSync, BeforeWrite: o.Testing.DiskFull()},
		OnFatal:   n.stopFatal,
		Describe:  func() string { return n.svc.DescribeSelf() },
		Reads: func(id raft.ServerID) (int, bool) {
			d, state := n.svc.Proven(id, false)
			return d.Commands, state == forward.DescKnown
		},
		Identity: func(checked bool) error {
			// Once per process: what a node checks when it reopens a stream
			// (docs/ARCHITECTURE.md, "Stream identity").
			if err := n.rejoin.PruneReseedState(); err != nil {
				return err
			}
			return n.rejoin.InitIdentity(checked)
		},
		BeginTerm: func() (replica.Term, error) {
			t, err := n.links.BeginTerm()
			if err != nil {
				return nil, err // not a nil *links.Term in a non-nil interface
			}
			return t, nil
		},
		Seal:         func(stream entry.StreamID, why string) error { return n.rejoin.SealStream(stream, why) },
		ReadsFormat:  o.Testing.ReadsFormat,
		CommandFault: o.Testing.CommandFault,
	}
	if r := o.Raft; r != nil {
		conn, err := raftConn(o, n.tls, n.log)
		if err != nil {
			return replica.Deps{}, err
		}
		n.members = &membership.GroupMembers{Gossip: n.gossip, NodeID: n.nodeID, Incarnation: n.incarnation}
		d.Raft = &replica.Raft{Listen: r.Listen, Advertise: r.Advertise, BootstrapExpect: r.BootstrapExpect,
			ElectionTimeout: r.ElectionTimeout, SnapshotThreshold: r.SnapshotThreshold, TrailingLogs: r.TrailingLogs, SnapshotInterval: r.SnapshotInterval,
			Members: n.members, Conn: conn}
	}
	return d, nil
}

// multi reports a node of a cluster of several. A node alone takes the
// same path (a raft group of one, the same committer, machine and FSM; its
// term is ready once Open returns); what multi() still forks in node is
// only what has no meaning without other nodes: a raft port and its
// requests (forwarding to a leader, asking members, admitting and removing
// them) and follower views of the links.
func (n *Node) multi() bool { return n.opts.Raft != nil }
