// Package entry holds the words every layer of replicator shares: a stream's
// identity, a replicated entry and its ops, the last-writer-wins stamp, a
// merge's outcome, a counter's totals, the idempotency record an entry
// carries, and the replication bookkeeping (high-water marks, cursors).
//
// It sits below everything and imports only hlc: the codec (wire), the tree
// (store), the state machine (machine) and both ends of a link (transport,
// acceptor) speak these types, so none of them imports another for them.
// Validate is the check every entry passes wherever it came from.
package entry
