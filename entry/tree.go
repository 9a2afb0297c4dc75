package entry

import (
	"maps"
	"math"
	"math/big"
	"slices"
	"strconv"

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
	// Floors are, per component, the totals the key's writes observed (a
	// set or a delete removes what it saw), merged by pointwise maximum:
	// the value counts only what lies beyond them. Nil when none.
	Floors map[string]PN
	// Stamp is the highest stamp of the deltas merged: the counter's
	// version, equal on every cluster that merged the same deltas.
	Stamp Stamp
}

// Value is sum(P) - sum(N) beyond the floors, saturated at the bounds of int64: each
// cluster's totals can fit while their sum does not (a local increment that
// would leave the range is refused; totals merged from several clusters are
// not). Components are summed in order, so every cluster holding the same
// totals reads the same value.
func (c *Counter) Value() int64 { return saturate(c.Sum(0)) }

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

// counterBeyond is what component n counted beyond its floor.
func (c *Counter) counterBeyond(n string) (p, q uint64) {
	t, f := c.Totals[n], c.Floors[n]
	if t.P > f.P {
		p = t.P - f.P
	}
	if t.N > f.N {
		q = t.N - f.N
	}
	return p, q
}

// Counts reports whether some component counted beyond its floor: the key
// reads as a counter (docs/DATAMODEL.md "Counters").
func (c *Counter) Counts() bool {
	for n := range c.Totals {
		if p, q := c.counterBeyond(n); p > 0 || q > 0 {
			return true
		}
	}
	return false
}

// Observed returns the totals of the components that counted beyond their
// floors: what a write that replaces the key's value removes.
func (c *Counter) Observed() map[string]PN {
	var out map[string]PN
	for n, t := range c.Totals {
		if p, q := c.counterBeyond(n); p > 0 || q > 0 {
			if out == nil {
				out = map[string]PN{}
			}
			out[n] = t
		}
	}
	return out
}

// MergeFloors folds floors in by pointwise maximum; it reports a change.
func (c *Counter) MergeFloors(f map[string]PN) bool {
	changed := false
	for n, t := range f {
		cur := c.Floors[n]
		next := PN{P: max(cur.P, t.P), N: max(cur.N, t.N)}
		if next != cur {
			if c.Floors == nil {
				c.Floors = map[string]PN{}
			}
			c.Floors[n] = next
			changed = true
		}
	}
	return changed
}

// Sum is base plus what every component counted beyond its floor, exact.
func (c *Counter) Sum(base int64) *big.Int {
	sum := big.NewInt(base)
	for _, n := range slices.Sorted(maps.Keys(c.Totals)) {
		p, q := c.counterBeyond(n)
		sum.Add(sum, new(big.Int).SetUint64(p))
		sum.Sub(sum, new(big.Int).SetUint64(q))
	}
	return sum
}

// saturate reads sum as an int64, saturated at its bounds.
func saturate(sum *big.Int) int64 {
	switch {
	case sum.IsInt64():
		return sum.Int64()
	case sum.Sign() > 0:
		return math.MaxInt64
	default:
		return math.MinInt64
	}
}

// ParseInt reads a value as Redis reads an integer string: an optional
// minus sign and decimal digits, no leading zeros or spaces, within int64.
func ParseInt(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 20 || v[0] == '+' || (len(v) > 1 && v[0] == '0') || (len(v) > 2 && v[0] == '-' && v[1] == '0') {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil && !(n == 0 && v[0] == '-')
}

// A View is what a key reads as: its plain version and its counter
// resolved (docs/DATAMODEL.md "Counters"). A plain version that expired
// hides the whole key; a key whose counter counts beyond its floors reads
// as its plain integer (0 when none) plus what was counted, a decimal; a
// plain value that is not an integer reads as itself.
type View struct {
	Present bool
	Value   []byte
	// Counted: the value counts increments (a decimal of Int).
	Counted bool
	Int     int64
	// Version is the newest of what the value depends on (zero when
	// absent); Expires the plain version's expiry when the value rests
	// on one.
	Version Stamp
	Expires int64
	// Expired: a plain version expired and hides the key.
	Expired bool
}

// Resolve reads a key from its plain record (nil: none) and its counter
// (nil: none) at wall time now.
func Resolve(r *Record, c *Counter, now int64) View {
	var v View
	live := r != nil && !r.Tombstone
	if live && r.Expired(now) {
		v.Expired = true
		return v
	}
	if c == nil || !c.Counts() {
		if live {
			v = View{Present: true, Value: r.Value, Version: r.Stamp, Expires: r.Expires}
		}
		return v
	}
	var base int64
	if live {
		n, ok := ParseInt(r.Value)
		if !ok {
			return View{Present: true, Value: r.Value, Version: r.Stamp, Expires: r.Expires}
		}
		base, v.Version, v.Expires = n, r.Stamp, r.Expires
	}
	if v.Version.Compare(c.Stamp) < 0 {
		v.Version = c.Stamp
	}
	v.Present, v.Counted = true, true
	v.Int = saturate(c.Sum(base))
	v.Value = strconv.AppendInt(nil, v.Int, 10)
	return v
}
