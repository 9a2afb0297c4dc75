// Package forward carries what one node of a cluster asks another over the
// raft port (docs/CLUSTER.md): a write as a typed proposal to the leader
// (propose.go), whose result or failure comes back by class
// (api.RemoteFailure), never as an HTTP answer to parse (every door's
// writes on a follower: HTTP, RESP, the Go API); the HTTP requests that need
// the leader, relayed whole one hop (router.go: admin actions, a consistent
// read, GET /v1/held); and the raft port's side of a
// node (service.go): what it says of itself, what members said of
// themselves, the scope a forwarded request was granted, and the client
// that dials a member by its raft server ID.
//
// Each side is built from what it needs (Leader, Follower, Router's fields,
// the Leadership and Progress interfaces it declares): functions of the
// node's raft group, its lead and its applied index, so the package knows
// neither the node nor its routes (the node says which requests need the
// leader, and how an error is answered).
package forward
