package api

import (
	"github.com/replicator/replicator/entry"
)

// WriteResult is the answer to a write.
type WriteResult struct {
	Key string
	// Version is the write's stamp, the same on every cluster; "" when
	// nothing was written (a delete of keys that hold no value here:
	// docs/DATAMODEL.md "Deletes").
	Version string
	Origin  string
	// Outcome is Applied, or Stale when a higher stamp already held the key
	// (possible only against a pinned or replicated stamp).
	Outcome entry.Outcome
	Index   uint64         // the entry's WAL index
	Stream  entry.StreamID // the stream Index is of
	// Replay is the recorded answer when an Idempotency-Key was seen before;
	// nothing was written then.
	Replay *IdemRecord
	// Counter is a counter's value right after the increment, in commit
	// order (an increment only).
	Counter int64
	// Existed is, for a delete or a batch, how many of the keys it deleted
	// held a live value just before it, decided in commit order.
	Existed int
}

// CounterResult is a counter's state.
type CounterResult struct {
	Key     string              `json:"key"`
	Value   int64               `json:"value"`
	Version string              `json:"version"`
	Totals  map[string]entry.PN `json:"totals"` // per cluster
	// Components are the totals per stream (and epoch) of each cluster, as
	// they merge (docs/DATAMODEL.md).
	Components map[string]entry.PN `json:"components,omitempty"`
	Origin     string              `json:"origin,omitempty"` // of the increment
}

// BatchOp is one write of an atomic batch.
type BatchOp struct {
	Delete bool
	Key    string
	Value  []byte
	// Expires is when a set's version expires (wall ns; 0: never).
	Expires int64 `msgpack:",omitempty"`
}

// BulkRecord is one record of a bulk load.
type BulkRecord struct {
	Key   string
	Value []byte
}

// BulkResult is the answer to a bulk load.
type BulkResult struct {
	Loaded  int    `json:"loaded"`
	Batches int    `json:"batches"`
	Version string `json:"last_version,omitempty"`
}

// Keyed is a request that carries an idempotency key (an Idempotency-Key
// header, or a batch's operation ID): the same key with another fingerprint
// is a different request, and is refused.
type Keyed struct {
	Key string
	// Fingerprint covers what decides the write and nothing
	// cluster-specific, so every cluster computes the same.
	Fingerprint []byte
	// Answer is the shape of the recorded answer, OpID a batch's operation
	// ID (machine.Answer).
	Answer AnswerKind
	OpID   string
}

// Write is one write as the HTTP API proposes it: a set, delete, counter
// increment or range delete in Entry (Key, Value, End), or the ops of an
// atomic batch; with its precondition and idempotency key.
type Write struct {
	Entry entry.Entry
	// Ops is an atomic batch (Entry is then unused).
	Ops []BatchOp
	// Delta is a counter increment (Entry.Op is entry.OpCounter).
	Delta int64
	Cond  *Condition
	Keyed *Keyed
}

// HeldReport answers GET /v1/held: the peer clusters whose links
// acknowledged holding the writes from From to Index of Stream (docs/RESP.md "WAIT").
// A link's filter is not applied: a write the filter kept home is counted
// by its acknowledgement as a filtered marker; the caller that knows the
// write's keys judges that.
type HeldReport struct {
	Stream string   `json:"stream"`
	From   uint64   `json:"from"`
	Index  uint64   `json:"index"`
	Peers  []string `json:"peers"`
}
