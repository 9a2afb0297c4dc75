package antientropy

import (
	"context"
	"errors"
	"fmt"
	"sort"

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
}

// Ask answers req from the store.
func (l Local) Ask(_ context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	if req.Protocol != hashtree.Version {
		return nil, fmt.Errorf("antientropy: tree protocol %d asked, this build computes %d", req.Protocol, hashtree.Version)
	}
	ans := &wire.TreeAnswer{Protocol: hashtree.Version}
	switch req.Op {
	case wire.TreeSums:
		leaves := l.St.Leaves()
		if leaves == nil {
			return nil, ErrNotKept
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
			for _, r := range l.St.RangeTombstones() {
				ans.Ranges = append(ans.Ranges, wire.Range{Start: r.Start, End: r.End, Stamp: r.Stamp.HLC, Origin: r.Stamp.Origin})
			}
			if ans.Collected, err = l.St.CollectedBelow(); err != nil {
				return nil, err
			}
		}
	case wire.TreeLeaves:
		want := make([]bool, hashtree.Leaves)
		for _, i := range req.Nodes {
			if i < 0 || i >= hashtree.Leaves {
				return nil, fmt.Errorf("antientropy: leaf %d (of %d)", i, hashtree.Leaves)
			}
			want[i] = true
		}
		err := l.St.VisitLeaves(func(leaf int) bool { return want[leaf] }, func(key string, r *store.Record, c *store.Counter) error {
			ans.Versions = append(ans.Versions, version(key, r, c, false))
			return nil
		})
		if err != nil {
			return nil, err
		}
		sortVersions(ans.Versions)
	case wire.TreeVersions:
		for _, k := range req.Keys {
			if k.Counter {
				c, err := l.St.Counter(k.Key)
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
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
			ans.Versions = append(ans.Versions, version(k.Key, &r, nil, true))
		}
		sortVersions(ans.Versions)
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
		}
		return v
	}
	v.Stamp, v.Origin, v.Tombstone, v.Kind = r.Stamp.HLC, r.Stamp.Origin, r.Tombstone, uint8(r.Kind)
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

// sortVersions orders versions as answers carry them: by key, a plain
// version before a counter of the same key.
func sortVersions(vs []wire.TreeVersion) {
	sort.Slice(vs, func(i, j int) bool { return less(vs[i].Key, vs[i].Counter, vs[j].Key, vs[j].Counter) })
}

func less(k1 string, c1 bool, k2 string, c2 bool) bool {
	if k1 != k2 {
		return k1 < k2
	}
	return !c1 && c2
}
