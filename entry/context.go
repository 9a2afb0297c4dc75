package entry

import (
	"fmt"
	"sort"

	"github.com/replicator/replicator/hlc"
)

// Context is a version's causal context: for each origin cluster, the newest
// stamp of that origin the version descends from, its own stamp included.
// A local write's context is what its cluster held for the key when it wrote
// (the stored version's context and stamp) merged with its own stamp; a
// replicated version keeps the context its author gave it. It has one item
// per cluster that ever wrote the key, sorted by origin, so it is bounded by
// the mesh (MaxContext).
//
// Last-writer-wins discards the loser of two versions; the discard is a
// conflict when the winner's context does not cover the loser: its author had
// not seen it. Stamps are compared only within one origin, so the rule does
// not depend on clocks being in step (docs/DATAMODEL.md "Conflicts").
type Context []ContextItem

// ContextItem is the newest stamp of one origin a version descends from.
type ContextItem struct {
	Origin string
	HLC    hlc.Timestamp
}

// MaxContext bounds the items of one context: the clusters of a mesh that
// write one key.
const MaxContext = 64

// At returns the newest stamp of origin the context holds (zero: none).
func (c Context) At(origin string) hlc.Timestamp {
	for _, it := range c {
		if it.Origin == origin {
			return it.HLC
		}
	}
	return hlc.Timestamp{}
}

// Covers reports whether a version with context c descends from the version
// stamped s: its author had seen s (or a later version of s's origin).
func (c Context) Covers(s Stamp) bool {
	at := c.At(s.Origin)
	return !at.IsZero() && s.HLC.Compare(at) <= 0
}

// With returns c with origin's stamp raised to ts (a copy: c is not
// changed). The result stays sorted by origin.
func (c Context) With(origin string, ts hlc.Timestamp) Context {
	out := make(Context, 0, len(c)+1)
	done := false
	for _, it := range c {
		switch {
		case it.Origin == origin:
			if it.HLC.Less(ts) {
				it.HLC = ts
			}
			done = true
		case !done && origin < it.Origin:
			out = append(out, ContextItem{Origin: origin, HLC: ts})
			done = true
		}
		out = append(out, it)
	}
	if !done {
		out = append(out, ContextItem{Origin: origin, HLC: ts})
	}
	return out
}

// Merge returns the pointwise maximum of c and d.
func (c Context) Merge(d Context) Context {
	out := append(Context(nil), c...)
	for _, it := range d {
		out = out.With(it.Origin, it.HLC)
	}
	return out
}

// Descend is the context of a write stamped s over a stored version with
// stamp prev and context prevCtx (prev zero: nothing stored): what the author
// held, and its own stamp.
func Descend(prevCtx Context, prev Stamp, s Stamp) Context {
	c := prevCtx
	if prev.Origin != "" {
		c = c.With(prev.Origin, prev.HLC)
	}
	return c.With(s.Origin, s.HLC)
}

// Check validates a decoded context: at most MaxContext items, origins of
// 1-63 bytes, sorted and unique, no zero stamp.
func (c Context) Check() error {
	if len(c) > MaxContext {
		return fmt.Errorf("context of %d items (at most %d)", len(c), MaxContext)
	}
	for i, it := range c {
		if it.Origin == "" || len(it.Origin) > 63 {
			return fmt.Errorf("context origin %q", it.Origin)
		}
		if it.HLC.IsZero() {
			return fmt.Errorf("context stamp of %q is zero", it.Origin)
		}
		if i > 0 && c[i-1].Origin >= it.Origin {
			return fmt.Errorf("context origins not sorted and unique at %q", it.Origin)
		}
	}
	return nil
}

// Sort orders c by origin (a decoded context is checked, not sorted).
func (c Context) Sort() { sort.Slice(c, func(i, j int) bool { return c[i].Origin < c[j].Origin }) }
