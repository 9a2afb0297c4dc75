// Package wire is the msgpack codec of what crosses a link between clusters:
// entries (Codec, shared with the outbound entries a cluster keeps, so a
// shipper sends stored bytes unchanged), batches and their headers, the
// acceptor's JSON ack and limits, and the proof a peer node gives that it
// holds the link's secret. Both ends import it; neither imports the other.
//
// Every decoder here bounds what it allocates by the input it was given and
// has a fuzz target; a decode failure wraps ErrMalformed (a batch) or
// entry.ErrMalformed (an entry), never a panic.
package wire
