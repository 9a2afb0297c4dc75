package groups

import (
	"errors"
	"fmt"
	"sort"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
)

// Router is a node's groups as its doors see them: the group a write or a
// key goes to, and the reads over them. With one group (Set nil) every key
// is group 0's, and every read and write takes the path a cluster of one
// group always took.
type Router struct {
	// Zero is group 0: the node's own store, replica and submitter.
	Zero *Group
	// Set holds the groups after 0 (nil: the cluster has one group).
	Set   *Set
	Clock *hlc.Clock
	// Bounds are what a key may be.
	Bounds *replica.Bounds
}

// Count is the cluster's number of groups.
func (r *Router) Count() int {
	if r.Set == nil {
		return 1
	}
	return r.Set.Count()
}

// Group is group g (0 to Count-1).
func (r *Router) Group(g int) *Group {
	if g == 0 {
		return r.Zero
	}
	return r.Set.Group(g)
}

// All are every group, 0 first.
func (r *Router) All() []*Group {
	if r.Set == nil {
		return []*Group{r.Zero}
	}
	return append([]*Group{r.Zero}, r.Set.All()...)
}

// Of is the group of key's slot.
func (r *Router) Of(key string) *Group {
	if r.Set == nil {
		return r.Zero
	}
	return r.Group(r.Set.Of(key))
}

// For is the group a write goes to: its key's, or its batch's when every
// key of the batch and of its condition shares a group (an atomic batch
// across groups is refused: api.CrossGroupError, nothing written). nil
// means every group: a range delete, which each group applies to its keys.
func (r *Router) For(w api.Write) (*Group, error) {
	if r.Set == nil {
		return r.Zero, nil
	}
	switch {
	case w.Ops != nil:
		var keys []string
		for _, op := range w.Ops {
			keys = append(keys, op.Key)
		}
		if w.Cond != nil {
			for _, kv := range w.Cond.Keys {
				keys = append(keys, kv.Key)
			}
		}
		return r.shared(keys)
	case w.Entry.Op == entry.OpDeleteRange:
		return nil, nil
	}
	return r.Of(w.Entry.Key), nil
}

// shared is the group every one of keys is in, or the error naming the
// groups they span.
func (r *Router) shared(keys []string) (*Group, error) {
	if len(keys) == 0 {
		return r.Zero, nil // refused by the submitter's checks
	}
	first := r.Set.Of(keys[0])
	cross := &api.CrossGroupError{Groups: []int{first}, Keys: []string{keys[0]}}
	for _, k := range keys[1:] {
		g := r.Set.Of(k)
		seen := false
		for _, h := range cross.Groups {
			seen = seen || h == g
		}
		if !seen {
			cross.Groups, cross.Keys = append(cross.Groups, g), append(cross.Keys, k)
		}
	}
	if len(cross.Groups) > 1 {
		return nil, cross
	}
	return r.Group(first), nil
}

// Get returns the live record at key, or api.NotFoundError (absent,
// deleted, expired, or collected), from the key's group at this node.
func (r *Router) Get(key string) (store.Record, error) {
	if err := r.Bounds.CheckKey(key); err != nil {
		return store.Record{}, err
	}
	g := r.Of(key)
	if err := g.Rep.Readable(); err != nil {
		return store.Record{}, err
	}
	// The plain record and the counter read as one (a counter that counts
	// reads as its decimal value).
	v, rec, held, err := g.Store.Read(key, r.Clock.Physical())
	switch {
	case err != nil:
		return store.Record{}, err
	case v.Counted:
		return store.Record{Value: v.Value, Stamp: v.Version, Expires: v.Expires, Kind: store.KindCounter}, nil
	case v.Present:
		return rec, nil
	case v.Expired:
		return store.Record{}, &api.NotFoundError{Key: key, Expired: rec.Stamp.String()}
	case held && rec.Tombstone:
		return store.Record{}, &api.NotFoundError{Key: key, Deleted: rec.Stamp.String()}
	}
	nf := &api.NotFoundError{Key: key}
	if cut, err := g.Rep.Machine().CollectedBelow(); err == nil && !cut.IsZero() {
		nf.CollectedBelow = cut.String()
	}
	return store.Record{}, nf
}

// Scan returns a page of live keys in order across the groups at this
// node, and the key to resume after ("" when the range is exhausted). Each
// group's page is read on its own (no snapshot across groups): a key
// written in one group during the scan may show while another group's
// earlier write does not, as with a scan of one group over pages.
func (r *Router) Scan(o store.ScanOptions) ([]store.Item, string, error) {
	o.Now = r.Clock.Physical()
	gs := r.All()
	for _, g := range gs {
		if err := g.Rep.Readable(); err != nil {
			return nil, "", err
		}
	}
	if len(gs) == 1 {
		return r.Zero.Store.Scan(o)
	}
	// Each group's page ends at its own last key when it was cut short: no
	// key past the least of those is known to be the next in order.
	var all []store.Item
	cut := ""
	for _, g := range gs {
		items, next, err := g.Store.Scan(o)
		if err != nil {
			return nil, "", fmt.Errorf("groups: scan of group %d: %w", g.Number, err)
		}
		all = append(all, items...)
		if next != "" && (cut == "" || next < cut) {
			cut = next
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Key < all[j].Key })
	limit, maxBytes := o.Limit, o.MaxBytes
	if limit <= 0 {
		limit = store.DefaultScanLimit
	}
	limit = min(limit, store.MaxScanLimit)
	if maxBytes <= 0 {
		maxBytes = store.DefaultScanBytes
	}
	size := 0
	for i, it := range all {
		if (cut != "" && it.Key > cut) || i == limit || (i > 0 && size+len(it.Key)+1+len(it.Record.Value) > maxBytes) {
			return all[:i], all[i-1].Key, nil
		}
		size += len(it.Key) + 1 + len(it.Record.Value)
	}
	if cut != "" && len(all) > 0 {
		return all, all[len(all)-1].Key, nil
	}
	return all, "", nil
}

// Digest hashes the live state of every group at this node as one store
// holding it would (store.DigestOf), under prefixes (every key when none).
func (r *Router) Digest(prefixes []string) (store.Digest, error) {
	gs := r.All()
	stores := make([]*store.Store, len(gs))
	for i, g := range gs {
		if err := g.Rep.Readable(); err != nil {
			return store.Digest{}, err
		}
		stores[i] = g.Store
	}
	return store.DigestOf(stores, prefixes)
}

// Check says whether a node started with count groups may serve a cluster
// whose group 0 recorded m (nil: no map yet) and holds data or not: the
// count must be the recorded one, and a cluster that wrote as one group
// keeps one (moving slots between groups is not built: docs/CLUSTER.md).
func Check(m *slot.Map, count int, holdsData bool) error {
	switch {
	case m != nil && m.Groups != count:
		return fmt.Errorf("%w: the cluster runs %d raft groups and this node was started with --groups %d: start it with --groups %d",
			ErrGroups, m.Groups, count, m.Groups)
	case m == nil && count > 1 && holdsData:
		return fmt.Errorf("%w: this node holds data the cluster wrote as one raft group, and was started with --groups %d: "+
			"a cluster keeps the groups it was formed with (start it without --groups)", ErrGroups, count)
	}
	return nil
}

// ErrGroups is the class of a node started with another number of groups
// than its cluster runs: a restart with the same flags does not fix it.
var ErrGroups = errors.New("groups: another number of raft groups")
