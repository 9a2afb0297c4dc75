// Package replica is one raft group's replica on this node: the unit a node
// holds one of today, and several of once a cluster runs several raft
// groups (docs/CLUSTER.md "The next step"); each has its own stream,
// committer, read gate and links.
//
// It holds the write path's committer (committer.go), built from a
// CommitEnv of values and functions, never the node: it stamps proposals
// in order, commits each group as one command of the log and answers each
// writer with what the state machine decided. The rest of a replica (open
// and recover the machine and the group, the lead loop, the read gate,
// applied progress, the format raise) moves here from package node next
// (issue 47).
package replica
