// Package replica is one raft group's replica on this node: the unit a node
// holds one of today, and several of once a cluster runs several raft
// groups (docs/CLUSTER.md "The next step"); each has its own stream,
// committer, read gate and links.
//
// A Replica is built from Deps, values and functions, never the node. It
// opens the state machine and the raft group (and migrates a data directory
// of a build before the log into them), squares the tree with the log after
// a crash or a restore (recover.go's reconcile), proposes commands and waits
// for them to apply, hands raft's FSM its callbacks, raises the log's
// command format once every member reads it, follows this node's
// leadership in terms (term.go), and gates local reads after a start
// (readgate.go). It is the acceptor's Log and the router's Leadership and
// Progress.
//
// The write path's committer (committer.go) is built from a CommitEnv: it
// stamps proposals in order, commits each group as one command of the log
// and answers each writer with what the state machine decided. The
// Submitter in front of it admits a write (Bounds: what a write may be) and
// queues it in order.
//
// Order is code: Open is "open the machine, migrate, reconcile, open the
// group, and for a node alone: elect itself, apply the log, mint the stream,
// check its identity, lead". A term of a cluster of several is "apply the
// log (a barrier), raise the clock, mint the stream if none, check the
// identity once per process (Deps.Identity), make the links
// (Deps.BeginTerm), seal a stream a recovery left, then lead and run the
// links"; it ends by stopping them. The replica never touches the links
// beyond the Term interface it declares.
package replica
