package entry

import (
	"maps"
	"math"
	"math/big"
	"slices"

	"github.com/replicator/replicator/hlc"
)

// What a key of the tree holds, as every layer reads it: its record (a
// value or a tombstone, of a plain or counter key), a counter's totals, a
// range tombstone, and how far a stream was applied.

// Counter is a PN-counter: per-cluster totals merged by pointwise maximum,
// so re-applying a delta (which carries its cluster's resulting totals) is a
// no-op. Its value is sum(P) - sum(N).
type Counter struct {
	Totals map[string]PN
	// Stamp is the highest stamp of the deltas merged: the counter's
	// version, equal on every cluster that merged the same deltas.
	Stamp Stamp
}

// Value is sum(P) - sum(N), saturated at the bounds of int64: each
// cluster's totals can fit while their sum does not (a local increment that
// would leave the range is refused; totals merged from several clusters are
// not). Components are summed in order, so every cluster holding the same
// totals reads the same value.
func (c *Counter) Value() int64 {
	sum := new(big.Int)
	for _, n := range slices.Sorted(maps.Keys(c.Totals)) {
		t := c.Totals[n]
		sum.Add(sum, new(big.Int).SetUint64(t.P))
		sum.Sub(sum, new(big.Int).SetUint64(t.N))
	}
	switch {
	case sum.IsInt64():
		return sum.Int64()
	case sum.Sign() > 0:
		return math.MaxInt64
	default:
		return math.MinInt64
	}
}

// AppliedIndex is how far the local stream is applied to the tree: every entry
// of Stream up to Index, the last of which was committed at Commit.
type AppliedIndex struct {
	Stream [16]byte
	Index  uint64
	Commit hlc.Timestamp
}

// RangeTombstone deletes [Start, End) (End "" means the end of the key
// space) as of Stamp.
type RangeTombstone struct {
	Start, End string
	Stamp      Stamp
}

// Covers reports whether key lies in the range.
func (r *RangeTombstone) Covers(key string) bool {
	return key >= r.Start && (r.End == "" || key < r.End)
}

// Kind tells plain values from counters; a key keeps its kind until its
// tombstone is collected.
type Kind uint8

const (
	KindPlain   Kind = 0
	KindCounter Kind = 1
)

// Record is what one key holds.
type Record struct {
	Stamp     Stamp
	Tombstone bool
	Kind      Kind
	Value     []byte
	// Ctx is the version's causal context (empty: kept by no log yet, or
	// from a peer that sends none).
	Ctx Context
	// Conflicted says the conflict log holds a record of a version this
	// key discarded (looked up only then, when a later version arrives).
	Conflicted bool
	// Expires is when the version expires (wall ns; 0: never): from then
	// on it reads as absent, and it still wins against older writes
	// (docs/DATAMODEL.md "Expiry").
	Expires int64
}

// Expired reports whether r is a version that expired by now (wall ns).
func (r *Record) Expired(now int64) bool { return r.Expires != 0 && r.Expires <= now }

// Live reports whether r holds a value at now: not a tombstone, not
// expired.
func (r *Record) Live(now int64) bool { return !r.Tombstone && !r.Expired(now) }
