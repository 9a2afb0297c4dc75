// Package forward carries what a node of a cluster sends the node that
// leads it, over the raft port: a write as a typed proposal (propose.go),
// whose result or failure comes back by class (api.RemoteFailure), never as
// an HTTP answer to parse. Both sides are built from what they need
// (Leader, Follower): functions of the node's raft group, its applied
// index and the raft port's client, so the package knows neither the node
// nor raft.
package forward
