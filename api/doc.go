// Package api holds the words of the node's contract that every layer
// shares: the writes and their results, preconditions, the error classes,
// the recorded answers of keyed requests, and every report the endpoints
// answer, in Go types with their JSON names; one type each.
//
// It is a leaf: it imports entry, hlc and small internal helpers, never
// the store, the state machine, raft or gossip. The packages below it
// (machine, store, acceptor, transport, cluster) declare their answers as
// aliases of these types, so the doors (httpapi, resp), the client and
// the CLI speak the contract without carrying the data plane, and a
// report is never a copy kept equal by a converter.
package api
