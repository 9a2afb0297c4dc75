// Package rejoin keeps a cluster's stream identity and rejoins after data
// loss.
//
// A stream's indexes must never mean two different writes. A data directory
// restored from a backup (or copied) holds a WAL whose tail peers may have
// seen with other content: a peer that answers a high-water mark the WAL
// does not hold, or another commit HLC at an index it does, proves it. The
// node then seals the stream (sets the WAL aside) and begins a new one, and
// rejoins. A node whose WAL is new (wiped, or its WAL moved away) learns the
// same from the first peer that holds streams of its cluster it no longer
// has.
//
// Rejoining: the node asks every peer for a re-seed (recorded by the peer,
// and only such a requested re-seed may bring back writes of the node's own
// cluster: what it lost). Once every peer's snapshot is in, it re-seeds every
// peer in turn, so that what only some peers had of its lost stream reaches
// the others. Both sides keep tombstones until the rejoin ends. Every step
// is recorded in the store (R and J records), so restarts resume it.
//
// The Rejoiner is built from Deps: it sees the links through the Link
// interface it declares, and goes through the cluster's log by functions.
package rejoin
