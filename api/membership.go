package api

import (
	"errors"
	"fmt"
)

// The refusals of a cluster's membership and leadership (package cluster
// decides them; the messages keep its prefix).
var (
	// ErrNotLeader: this node cannot commit; NotLeaderError names the
	// leader when one is known.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrQuorum refuses a removal that would leave the group without a
	// quorum of live voters.
	ErrQuorum = errors.New("cluster: the change would lose quorum")
	// ErrUnknownNode is a removal of a node that is not a member.
	ErrUnknownNode = errors.New("cluster: no such node")
	// ErrNodeIDRemoved refuses a node ID that was removed from the group
	// (a join of it, or its own start); ErrRemoved is the node's refusal
	// of reads and writes once that happened to it.
	ErrNodeIDRemoved = errors.New("cluster: the node ID was removed")
)

// NotLeaderError says who leads (empty when nobody is known to).
type NotLeaderError struct{ LeaderID, LeaderAddr string }

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "cluster: not the leader, and no leader is known"
	}
	return fmt.Sprintf("cluster: not the leader (the leader is %s at %s)", e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }
