package antientropy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// ErrNotKept refuses a comparison while a tree's leaves are not kept (a
// snapshot's tree is being copied in, or the copy failed: a rebuild
// restores them).
var ErrNotKept = errors.New("antientropy: the tree's leaf hashes are not kept now")

// Local answers tree requests from a store: for this node's own side of a
// comparison, and for peers that ask (wire.PathTree).
type Local struct {
	St *store.Store
	// Toward is this cluster's link filter toward the asker, when a peer
	// asks: the comparison is scoped to what both links carry.
	Toward entry.Filter
	// Scoped keeps the scoped trees summed for recent passes (nil: each
	// request sums its own).
	Scoped *ScopeCache
	// Asker names who asks (a peer; "" for this node's own side): each
	// asker holds at most one tree of Scoped, so a peer sending passes
	// without end cannot push out another's.
	Asker string
	// Budget bounds the bytes of versions one answer carries (0:
	// AnswerBudget).
	Budget int
}

// AnswerBudget bounds, roughly, the bytes of versions one answer carries:
// well below wire.MaxTreeBody.
const AnswerBudget = wire.MaxTreeBody / 4

// versionOverhead is, roughly and from above, what a version without its
// key, value, context and totals costs in an answer (stamp, origin, hash,
// field names).
const versionOverhead = 64

func (l Local) budget() int {
	if l.Budget <= 0 {
		return AnswerBudget
	}
	return l.Budget
}

// ScopeCache keeps the leaves of a few trees, by pass and scope: a
// comparison asks for sums once per level, and each would otherwise copy
// the kept leaves (16 MiB) or, for a filtered link, scan its scope again;
// kept, the walk also sees one view of the tree from root to leaves. Safe
// for concurrent use.
type ScopeCache struct {
	mu      sync.Mutex
	entries []scoped // the most recent last
}

type scoped struct {
	key, owner string
	leaves     []hashtree.Sum
}

// scopeCacheSize bounds the trees kept (16 MiB each).
const scopeCacheSize = 4

func (c *ScopeCache) get(owner string, pass uint64, scope string, sum func() ([]hashtree.Sum, error)) ([]hashtree.Sum, error) {
	if c == nil || pass == 0 {
		return sum()
	}
	key := fmt.Sprint(pass, scope)
	c.mu.Lock()
	for _, e := range c.entries {
		if e.key == key {
			c.mu.Unlock()
			return e.leaves, nil
		}
	}
	c.mu.Unlock()
	leaves, err := sum()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	// The owner's tree of an earlier pass goes first: one each.
	c.entries = slices.DeleteFunc(c.entries, func(e scoped) bool { return e.owner == owner })
	c.entries = append(c.entries, scoped{key, owner, leaves})
	if len(c.entries) > scopeCacheSize {
		c.entries = c.entries[1:]
	}
	c.mu.Unlock()
	return leaves, nil
}

// scope is what a request compares: the keys every filter lets cross.
type scope struct {
	filters []entry.Filter
	spans   []entry.Span // nil: every key
}

func (l Local) scopeOf(req *wire.TreeRequest) scope {
	var sc scope
	add := func(f entry.Filter) {
		if f.All() {
			return
		}
		for _, g := range sc.filters {
			if g.Equal(f) {
				return // the asker sends back the answerer's own filter
			}
		}
		sc.filters = append(sc.filters, f)
	}
	for _, f := range req.Filters {
		add(f.Entry())
	}
	add(l.Toward)
	for i, f := range sc.filters {
		if i == 0 {
			sc.spans = f.Spans()
		} else {
			sc.spans = f.ClipSpans(sc.spans)
		}
	}
	if !sc.all() && sc.spans == nil {
		sc.spans = []entry.Span{} // filters no key passes: nothing, not everything
	}
	return sc
}

func (sc *scope) all() bool { return len(sc.filters) == 0 }

func (sc *scope) match(key string) bool {
	for _, f := range sc.filters {
		if !f.Match(key) {
			return false
		}
	}
	return true
}

func (sc *scope) wire() []wire.Filter {
	out := make([]wire.Filter, len(sc.filters))
	for i, f := range sc.filters {
		out[i] = wire.Filter{Include: f.Include, Exclude: f.Exclude}
	}
	return out
}

// Ask answers req from the store.
func (l Local) Ask(_ context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	if req.Protocol != hashtree.Version {
		return nil, fmt.Errorf("antientropy: tree protocol %d asked, this build computes %d", req.Protocol, hashtree.Version)
	}
	ans := &wire.TreeAnswer{Protocol: hashtree.Version}
	sc := l.scopeOf(req)
	switch req.Op {
	case wire.TreeSums:
		// One view of the tree for the whole walk of a pass: the leaves
		// are taken (or, scoped, summed) at its first request and kept.
		leaves, err := l.Scoped.get(l.Asker, req.Pass, fmt.Sprint(sc.filters), func() ([]hashtree.Sum, error) {
			if sc.all() {
				if leaves := l.St.Leaves(); leaves != nil {
					return leaves, nil
				}
				return nil, ErrNotKept
			}
			return l.St.ScanLeavesIn(sc.spans, sc.match)
		})
		if err != nil {
			return nil, err
		}
		levels, err := hashtree.Levels(leaves)
		if err != nil {
			return nil, err
		}
		if req.Level < 0 || req.Level > hashtree.Depth {
			return nil, fmt.Errorf("antientropy: level %d (0 to %d)", req.Level, hashtree.Depth)
		}
		lv := levels[req.Level]
		for _, i := range req.Nodes {
			if i < 0 || i >= len(lv) {
				return nil, fmt.Errorf("antientropy: node %d of level %d (of %d)", i, req.Level, len(lv))
			}
			ans.Sums = append(ans.Sums, lv[i].AppendTo(nil))
		}
		if req.Level == 0 {
			ans.Filters = sc.wire()
			// Each range delete clipped to the scope, as a filtered link
			// carries it: both sides clip alike, so what differs is real.
			for _, r := range l.St.RangeTombstones() {
				for _, sp := range sc.clip(r.Start, r.End) {
					ans.Ranges = append(ans.Ranges, wire.Range{Start: sp.Start, End: sp.End, Stamp: r.Stamp.HLC, Origin: r.Stamp.Origin})
				}
			}
			if ans.Collected, err = l.St.CollectedBelow(); err != nil {
				return nil, err
			}
		}
	case wire.TreeLeaves:
		// Versions without values, still unbounded in number: the answer
		// takes whole leaves until its byte budget is spent, and lists the
		// leaves it left for the asker to ask again. The scan goes in key
		// order, not leaf order, so a leaf first met past the budget is
		// left, and one met before it is taken whole.
		const (
			asked = iota + 1
			taken
			left
		)
		state := make([]uint8, hashtree.Leaves)
		for _, i := range req.Nodes {
			if i < 0 || i >= hashtree.Leaves {
				return nil, fmt.Errorf("antientropy: leaf %d (of %d)", i, hashtree.Leaves)
			}
			state[i] = asked
		}
		size, budget := 0, l.budget()
		err := l.St.VisitLeaves(sc.spans, func(leaf int) bool {
			switch state[leaf] {
			case taken:
				return true
			case asked:
				if size > budget {
					state[leaf] = left
					return false
				}
				state[leaf] = taken
				return true
			}
			return false
		}, func(key string, r *store.Record, c *store.Counter) error {
			if c != nil && !c.Counts() {
				return nil // deleted: compared as a collected tombstone is
			}
			if sc.match(key) {
				ans.Versions = append(ans.Versions, version(key, r, c, false))
				size += len(key) + versionOverhead
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, i := range req.Nodes {
			if state[i] == left {
				ans.Rest = append(ans.Rest, i)
				state[i] = taken // listed once
			}
		}
		wire.SortVersions(ans.Versions)
	case wire.TreeVersions:
		// Whole versions carry values: the answer stops at a budget of
		// bytes (after one key at least) and says how many of the keys
		// asked it covers; the asker asks for the rest again.
		size, budget := 0, l.budget()
		ans.Answered = len(req.Keys)
		// The horizon now: the asker judges with the newest it was told.
		var err error
		if ans.Collected, err = l.St.CollectedBelow(); err != nil {
			return nil, err
		}
		for i, k := range req.Keys {
			if i > 0 && size > budget {
				ans.Answered = i
				break
			}
			if n := len(ans.Versions); n > 0 {
				v := &ans.Versions[n-1]
				size += len(v.Key) + len(v.Value) + versionOverhead + 24*len(v.Ctx) + 40*len(v.Totals)
			}
			if !sc.match(k.Key) {
				continue // out of the comparison's scope: not this link's
			}
			if k.Counter {
				c, err := l.St.Counter(k.Key)
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				if !c.Counts() || (len(c.Floors) > 0 && !req.Floors) {
					// Deleted (compared as a collected tombstone), or
					// the asker would count what was deleted.
					continue
				}
				ans.Versions = append(ans.Versions, version(k.Key, nil, &c, true))
				continue
			}
			r, err := l.St.Get(k.Key)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if r.Expires != 0 && !req.Expiry {
				continue // the asker would keep it for ever
			}
			ans.Versions = append(ans.Versions, version(k.Key, &r, nil, true))
		}
		wire.SortVersions(ans.Versions)
	default:
		return nil, fmt.Errorf("antientropy: operation %d", req.Op)
	}
	return ans, nil
}

// version is a record or a counter as the exchange carries it (whole: with
// its value, context and totals).
func version(key string, r *store.Record, c *store.Counter, whole bool) wire.TreeVersion {
	v := wire.TreeVersion{Key: key, Hash: store.ValueDigestHash(r, c), Whole: whole}
	if c != nil {
		v.Counter, v.Stamp, v.Origin = true, c.Stamp.HLC, c.Stamp.Origin
		if v.Origin == "" {
			v.Origin = "-" // a counter's stamp is not compared (its totals are)
		}
		if whole {
			for _, name := range sortedKeys(c.Totals) {
				t := c.Totals[name]
				v.Totals = append(v.Totals, wire.Component{Cluster: name, P: t.P, N: t.N})
			}
			for _, name := range sortedKeys(c.Floors) {
				t := c.Floors[name]
				v.Floors = append(v.Floors, wire.Component{Cluster: name, P: t.P, N: t.N})
			}
		}
		return v
	}
	v.Stamp, v.Origin, v.Tombstone, v.Kind, v.Expires = r.Stamp.HLC, r.Stamp.Origin, r.Tombstone, uint8(r.Kind), r.Expires
	if whole {
		if len(r.Value) > 0 {
			v.Value = append([]byte(nil), r.Value...)
		}
		for _, it := range r.Ctx {
			v.Ctx = append(v.Ctx, wire.ContextItem{Origin: it.Origin, Stamp: it.HLC})
		}
	}
	return v
}

func sortedKeys(m map[string]entry.PN) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func less(k1 string, c1 bool, k2 string, c2 bool) bool {
	if k1 != k2 {
		return k1 < k2
	}
	return !c1 && c2
}

// clip returns the parts of [start, end) the scope's keys lie in (the
// whole range when the scope is every key; end "" is the end of the key
// space).
func (sc *scope) clip(start, end string) []entry.Span {
	if sc.all() {
		return []entry.Span{{Start: start, End: end}}
	}
	var out []entry.Span
	for _, sp := range sc.spans {
		lo, hi := max(start, sp.Start), sp.End
		if end != "" && (hi == "" || end < hi) {
			hi = end
		}
		if hi == "" || lo < hi {
			out = append(out, entry.Span{Start: lo, End: hi})
		}
	}
	return out
}
