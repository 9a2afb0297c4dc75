// Package membership is this node's place among the nodes of its cluster:
// its identity (the node ID and the data directory's incarnation, minted at
// the first start), and the gossip view (Gossip): the nodes of one cluster
// find each other by gossip, each gossiping its node ID, raft address, API
// and replicate URLs, and whether it is fresh (no raft state, no data). The
// raft group (package cluster) reads them to bootstrap and to add members
// (GroupMembers); the node links to the peer clusters gossip finds.
//
// Memberlist itself is package discovery's. The cluster report (Report)
// shows each node of the configuration as raft, gossip and the node itself
// (asked over the raft port) see it.
//
// Gossip finds nodes; it never says where a request goes: forwarding asks
// the raft configuration's members over the raft port (package forward).
package membership
