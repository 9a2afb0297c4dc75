// Package antientropy compares a cluster's tree with a peer's and repairs
// what one lacks (docs/ANTIENTROPY.md). Both sides keep, as data changes, a
// hashtree of their live versions (store's leaves); a comparison walks the
// two trees top-down and descends only where sums differ, then exchanges
// the (key, stamp, origin, value hash) lists of the differing leaves, and
// looks again, after the link's lag, at the keys that differed: a key
// counts as divergent only if neither side changed it meanwhile and it
// still differs (a write in flight is not divergence).
package antientropy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// Tree is one side of a comparison: Local for this node's store, a link's
// shipper (transport.Shipper.AskTree) for a peer's.
type Tree interface {
	Ask(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error)
}

// Report is a comparison's result (api.DiffReport), with the peer's
// whole version of each divergent key, which a repair of this side applies.
type Report struct {
	api.DiffReport
	// peer[i] is the peer's version of Divergent[i] (nil: none).
	peer []*wire.TreeVersion
}

// MaxLeavesPerPass bounds the differing leaves one comparison lists the
// keys of (about 10 keys each at 10,000,000 keys: some 30 MB of lists).
const MaxLeavesPerPass = 1 << 16

// Options configure a comparison.
type Options struct {
	// Settle is how long the second look waits after the first: at
	// least the link's replication lag, so that what was in flight at the
	// first look has arrived.
	Settle time.Duration
	// Sleep waits d or until ctx ends (tests pass a fake clock's).
	Sleep func(ctx context.Context, d time.Duration) error
	// Counted is told the bytes of every exchange with the peer (the
	// remote Tree counts them).
	Counted func() int64
	// Filter is this cluster's link filter toward the peer: the
	// comparison looks only at the keys it lets cross (and that the peer's
	// filter toward this cluster lets cross, which the peer adds).
	Filter entry.Filter
	// Pass names the comparison to the peer (any number unlikely to repeat).
	Pass uint64
	// PeerBehind, asked after the wait, reports that this cluster's link
	// to the peer still had not delivered what it held at the first look:
	// then a key the peer lacks may be in flight, and counts so.
	PeerBehind func() bool
	// Local is this cluster's ID: with the peer's, it says whose writes a
	// version is (a repair takes only the peer's; a third cluster's are
	// listed apart).
	Local string
	// Expiry: this cluster keeps versions that expire, and asks for them.
	Expiry bool
	// Floors: this cluster keeps counter floors, and asks for them.
	Floors bool
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Compare compares the local tree with the peer's.
func Compare(ctx context.Context, peerName string, local, peer Tree, opts Options) (*Report, error) {
	if opts.Sleep == nil {
		opts.Sleep = Sleep
	}
	rep := &Report{DiffReport: api.DiffReport{Peer: peerName, Repaired: -1, Divergent: []api.Divergence{}}}
	ask := func(t Tree, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
		req.Protocol = hashtree.Version
		return t.Ask(ctx, req)
	}
	// The scope: this side's filter, then what the peer says it compared
	// (its own filter toward this side added), for both sides alike.
	var filters []wire.Filter
	if !opts.Filter.All() {
		filters = []wire.Filter{{Include: opts.Filter.Include, Exclude: opts.Filter.Exclude}}
	}
	both := func(req wire.TreeRequest) (l, p *wire.TreeAnswer, err error) {
		req.Pass, req.Expiry, req.Floors = opts.Pass, opts.Expiry, opts.Floors
		pr := req
		pr.Filters = filters
		if p, err = ask(peer, &pr); err != nil {
			return nil, nil, fmt.Errorf("antientropy: the tree of %s: %w", peerName, err)
		}
		if req.Op == wire.TreeSums && req.Level == 0 && len(p.Filters) > 0 {
			filters = p.Filters
		}
		lr := req
		lr.Filters = filters
		if l, err = ask(local, &lr); err != nil {
			return nil, nil, fmt.Errorf("antientropy: this tree: %w", err)
		}
		return l, p, nil
	}

	// Top-down: the root, then the children of every node that differs.
	nodes := []int{0}
	var lh, ph *wire.TreeAnswer
	for level := 0; level <= hashtree.Depth && len(nodes) > 0; level++ {
		l, p, err := both(wire.TreeRequest{Op: wire.TreeSums, Level: level, Nodes: nodes})
		if err != nil {
			return nil, err
		}
		if len(l.Sums) != len(nodes) || len(p.Sums) != len(nodes) {
			return nil, fmt.Errorf("antientropy: %d and %d sums for %d nodes", len(l.Sums), len(p.Sums), len(nodes))
		}
		if level == 0 {
			lh, ph = l, p
			pair := func(o string) bool { return o == opts.Local || o == peerName }
			lr, pr := liveRanges(l.Ranges, l.Collected, p.Collected, pair), liveRanges(p.Ranges, l.Collected, p.Collected, pair)
			rep.RangesDiffer, rep.RangesHere, rep.RangesPeer = !slices.Equal(lr, pr), len(lr), len(pr)
			rep.RangesOnlyHere, rep.RangesOnlyPeer = rangesOnly(lr, pr), rangesOnly(pr, lr)
		}
		var differ []int
		for i, n := range nodes {
			if !slices.Equal(l.Sums[i], p.Sums[i]) {
				differ = append(differ, n)
			}
		}
		if level == hashtree.Depth {
			nodes = differ
			break
		}
		nodes = nodes[:0]
		for _, n := range differ {
			first, end := hashtree.Children(n)
			for c := first; c < end; c++ {
				nodes = append(nodes, c)
			}
		}
	}
	rep.LeavesDiffering = len(nodes)
	if len(nodes) > MaxLeavesPerPass {
		// The rest waits for another pass: a pass's key lists stay within
		// an answer's bound. Each pass starts at its own place (by its
		// number), so that leaves never repaired at the front (possible
		// resurrections, unknowns) do not hide the others for ever.
		off := int(opts.Pass % uint64(len(nodes)))
		nodes, rep.Truncated = append(append([]int(nil), nodes[off:]...), nodes[:off]...)[:MaxLeavesPerPass], true
	}
	rep.LeavesCompared = len(nodes)
	if len(nodes) == 0 {
		// Equal live versions. Range deletes are reported beside it
		// (RangesDiffer), not in it: a tree restored from an old backup
		// keeps range tombstones every other cluster collected, and a
		// wiped tree's horizon does not say what it never held, so a
		// difference of range tombstones is not a difference of data.
		rep.Equal = true
		rep.Bytes = counted(opts)
		return rep, nil
	}

	// The versions of the differing leaves, side by side. Each answer
	// covers the leaves its byte budget lets it and lists the rest: the
	// leaves both covered are compared, the others asked for again.
	first := map[wire.Key][2]*wire.TreeVersion{}
	var keys []wire.Key
	for pending := nodes; len(pending) > 0; {
		l, p, err := both(wire.TreeRequest{Op: wire.TreeLeaves, Nodes: pending})
		if err != nil {
			return nil, err
		}
		asked := make(map[int]bool, len(pending))
		for _, i := range pending {
			asked[i] = true
		}
		rest := map[int]bool{}
		for _, i := range append(l.Rest, p.Rest...) {
			if asked[i] {
				rest[i] = true
			}
		}
		if len(rest) == len(asked) {
			return nil, fmt.Errorf("antientropy: the tree of %s and this tree answered none of %d leaves", peerName, len(asked))
		}
		pvs, unasked := inLeaves(p.Versions, asked, rest)
		if unasked > 0 {
			// A peer listing keys of leaves nobody asked for: not
			// compared, never pulled.
			rep.refuse("unasked", unasked)
		}
		lvs, _ := inLeaves(l.Versions, asked, rest)
		join(lvs, pvs, func(k wire.Key, lv, pv *wire.TreeVersion) {
			rep.Compared++
			if sameLive(lv, pv) {
				return
			}
			first[k] = [2]*wire.TreeVersion{lv, pv}
			keys = append(keys, k)
		})
		next := pending[:0:0]
		for _, i := range pending {
			if rest[i] {
				next = append(next, i)
			}
		}
		pending = next
	}
	rep.Candidates = len(keys)
	if len(keys) == 0 {
		rep.Bytes = counted(opts)
		return rep, nil
	}

	// The second look, after the link's lag: whole versions of the keys
	// that differed. The collection horizons judged against are the
	// newest either side says: one may have collected tombstones since
	// the first look, and a version older than the horizon of a side that
	// holds nothing of its key may be a delete collected meanwhile.
	if err := opts.Sleep(ctx, opts.Settle); err != nil {
		return nil, err
	}
	localCollected, peerCollected := lh.Collected, ph.Collected
	for start := 0; start < len(keys); {
		chunk := keys[start:min(start+1<<14, len(keys))]
		l, p, err := both(wire.TreeRequest{Op: wire.TreeVersions, Keys: chunk})
		if err != nil {
			return nil, err
		}
		if localCollected.Less(l.Collected) {
			localCollected = l.Collected
		}
		if peerCollected.Less(p.Collected) {
			peerCollected = p.Collected
		}
		// Each side covers a prefix of the chunk (values have a byte
		// budget): judge the keys both covered, ask for the rest again.
		n := min(covered(l, len(chunk)), covered(p, len(chunk)))
		in := make(map[wire.Key]bool, n)
		for _, k := range chunk[:n] {
			in[k] = true
		}
		join(only(l.Versions, in), only(p.Versions, in), func(k wire.Key, lv, pv *wire.TreeVersion) {
			was, ok := first[k]
			if !ok {
				return // not asked (a peer answering more than asked)
			}
			delete(first, k)
			if !sameVersion(was[0], lv) || !sameVersion(was[1], pv) || sameLive(lv, pv) {
				rep.InFlight++
				return
			}
			d := judge(k, lv, pv, localCollected, peerCollected, opts.Local, peerName)
			switch d.Lacks {
			case api.LacksThirdOrigin:
				rep.ThirdOrigin = append(rep.ThirdOrigin, d)
				return
			case api.LacksExpired:
				rep.Expired = append(rep.Expired, d)
				return
			}
			rep.Divergent = append(rep.Divergent, d)
			rep.peer = append(rep.peer, pv)
		})
		start += n
	}
	// Keys neither side holds any more (both collected) are in flight too.
	rep.InFlight += len(first)
	if opts.PeerBehind != nil && opts.PeerBehind() {
		rep.LinkBehind = true
		kept, peer := rep.Divergent[:0], rep.peer[:0]
		for i, d := range rep.Divergent {
			if d.Lacks == api.LacksPeer {
				rep.InFlight++
				continue
			}
			kept, peer = append(kept, d), append(peer, rep.peer[i])
		}
		rep.Divergent, rep.peer = kept, peer
	}
	rep.Bytes = counted(opts)
	return rep, nil
}

func counted(opts Options) int64 {
	if opts.Counted == nil {
		return 0
	}
	return opts.Counted()
}

// join walks two sorted version lists by key, calling f with each key's
// version on either side (nil: none).
func join(a, b []wire.TreeVersion, f func(k wire.Key, av, bv *wire.TreeVersion)) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && less(a[i].Key, a[i].Counter, b[j].Key, b[j].Counter)):
			f(wire.Key{Key: a[i].Key, Counter: a[i].Counter}, &a[i], nil)
			i++
		case i == len(a) || less(b[j].Key, b[j].Counter, a[i].Key, a[i].Counter):
			f(wire.Key{Key: b[j].Key, Counter: b[j].Counter}, nil, &b[j])
			j++
		default:
			f(wire.Key{Key: a[i].Key, Counter: a[i].Counter}, &a[i], &b[j])
			i++
			j++
		}
	}
}

// live reports a version that is in the hashes (not a tombstone).
func live(v *wire.TreeVersion) bool { return v != nil && !v.Tombstone }

// sameLive reports two sides that agree on a key as the hashes see it:
// both without a live version (tombstones are collected at different
// times), or both with the same one. A counter's stamp is not compared.
func sameLive(a, b *wire.TreeVersion) bool {
	if !live(a) || !live(b) {
		return !live(a) && !live(b)
	}
	if a.Counter {
		return a.Hash == b.Hash
	}
	return a.Stamp == b.Stamp && a.Origin == b.Origin && a.Hash == b.Hash && a.Kind == b.Kind
}

// sameVersion reports the same version at both looks (nil for none).
func sameVersion(a, b *wire.TreeVersion) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Stamp == b.Stamp && a.Origin == b.Origin && a.Hash == b.Hash && a.Tombstone == b.Tombstone && a.Kind == b.Kind
}

// judge says which side lacks what, for a key that differs, and whose
// write the lacked version is: a repair of a side takes only the other
// side's own writes (local and peer name the two clusters).
func judge(k wire.Key, lv, pv *wire.TreeVersion, localCollected, peerCollected hlc.Timestamp, local, peer string) api.Divergence {
	d := api.Divergence{Key: k.Key, Counter: k.Counter, Local: held(lv), Peer: held(pv)}
	if k.Counter {
		d.Lacks = counterLacks(lv, pv, local, peer)
		return d
	}
	switch {
	case live(lv) && live(pv):
		switch c := lv.EntryStamp().Compare(pv.EntryStamp()); {
		case c > 0:
			d.Lacks = api.LacksPeer
		case c < 0:
			d.Lacks = api.LacksLocal
		default:
			d.Lacks = api.LacksUnknown
		}
	case live(lv):
		switch {
		case pv != nil && pv.EntryStamp().Compare(lv.EntryStamp()) == 0:
			// A delete and a write under one stamp: one write, kept two
			// ways (a side's tree rotted): the stamp cannot tell which.
			d.Lacks = api.LacksUnknown
		case pv != nil && pv.EntryStamp().Compare(lv.EntryStamp()) > 0:
			d.Lacks = api.LacksLocal // the peer's delete is newer
		case pv == nil && lv.Stamp.Less(peerCollected):
			d.Lacks = api.LacksMaybeDeleted
		default:
			d.Lacks = api.LacksPeer
		}
	default: // only the peer's is live
		switch {
		case lv != nil && lv.EntryStamp().Compare(pv.EntryStamp()) == 0:
			d.Lacks = api.LacksUnknown
		case lv != nil && lv.EntryStamp().Compare(pv.EntryStamp()) > 0:
			d.Lacks = api.LacksPeer // this side's delete is newer
		case lv == nil && pv.Stamp.Less(localCollected):
			d.Lacks = api.LacksMaybeDeleted
		default:
			d.Lacks = api.LacksLocal
		}
	}
	// Whose write the lacked version is.
	switch {
	case d.Lacks == api.LacksLocal && pv.Origin != peer:
		d.Lacks = whose(pv.Origin, local)
	case d.Lacks == api.LacksPeer && lv.Origin != local:
		d.Lacks = whose(lv.Origin, peer)
	case d.Lacks == api.LacksMaybeDeleted:
		// A third cluster's version is that cluster's to repair (and its
		// filter may keep it from one side on purpose), whatever the
		// horizons say.
		v, horizon := firstLive(lv, pv), peerCollected
		if v == pv {
			horizon = localCollected
		}
		switch {
		case v.Expires != 0 && v.Expires <= horizon.Wall:
			// Expired by the lacking side's horizon: it collected it.
			d.Lacks = api.LacksExpired
		case v.Origin != local && v.Origin != peer:
			d.Lacks = api.LacksThirdOrigin
		}
	}
	return d
}

func firstLive(a, b *wire.TreeVersion) *wire.TreeVersion {
	if live(a) {
		return a
	}
	return b
}

// whose labels a lacked version of origin that is not the holder's own
// write: the lacking side's own (lacker), or a third cluster's.
func whose(origin, lacker string) api.Lacks {
	if origin == lacker {
		return api.LacksOwnWrite
	}
	return api.LacksThirdOrigin
}

// componentCluster is the cluster a counter component (cluster/stream)
// belongs to.
func componentCluster(name string) string {
	c, _, _ := strings.Cut(name, "/")
	return c
}

// floorPrefix names a counter's floors apart from its totals where both
// are compared by component.
const floorPrefix = "floor "

// counterLacks compares two counters component by component: a side lacks
// what the other holds higher; what a repair of it may take is the other
// side's own components.
func counterLacks(lv, pv *wire.TreeVersion, local, peer string) api.Lacks {
	comps := func(v *wire.TreeVersion) map[string]wire.Component {
		m := map[string]wire.Component{}
		if v != nil {
			for _, c := range v.Totals {
				m[c.Cluster] = c
			}
			for _, c := range v.Floors {
				// A component's floors are judged as its cluster's (as
				// a re-seed relays them).
				m[floorPrefix+c.Cluster] = c
			}
		}
		return m
	}
	lc, pc := comps(lv), comps(pv)
	var localLow, peerLow, own, third bool
	note := func(name string, lower bool, holder, lacker string) bool {
		if !lower {
			return false
		}
		switch componentCluster(strings.TrimPrefix(name, floorPrefix)) {
		case holder:
			return true
		case lacker:
			own = true
		default:
			third = true
		}
		return false
	}
	for name := range pc {
		l, p := lc[name], pc[name]
		localLow = note(name, l.P < p.P || l.N < p.N, peer, local) || localLow
		peerLow = note(name, p.P < l.P || p.N < l.N, local, peer) || peerLow
	}
	for name := range lc {
		if _, ok := pc[name]; !ok {
			l := lc[name]
			peerLow = note(name, l.P > 0 || l.N > 0, local, peer) || peerLow
		}
	}
	switch {
	case localLow && peerLow:
		return api.LacksBoth
	case localLow:
		return api.LacksLocal
	case peerLow:
		return api.LacksPeer
	case own:
		// Before a third cluster's part: a side's lost own write is
		// divergence between these two.
		return api.LacksOwnWrite
	case third:
		return api.LacksThirdOrigin
	}
	return api.LacksUnknown
}

func held(v *wire.TreeVersion) *api.Held {
	if v == nil {
		return nil
	}
	return &api.Held{Stamp: v.Stamp.String(), Origin: v.Origin, Tombstone: v.Tombstone, Hash: fmt.Sprintf("%016x", v.Hash)}
}

// Pulls are the peer's versions a repair of this side applies: those of
// the keys this side lacks whose newer version is the peer's own write (a
// counter's components of the peer, when this side holds them lower).
// Possible resurrections, unknowns, this cluster's own lost writes and
// third clusters' versions are never copied: each cluster's writes repair
// over that cluster's own links.
func (r *Report) Pulls() []wire.TreeVersion {
	var out []wire.TreeVersion
	for i := range r.Divergent {
		d, v := &r.Divergent[i], r.peer[i]
		if (d.Lacks != api.LacksLocal && d.Lacks != api.LacksBoth) || v == nil {
			continue
		}
		if !v.Counter {
			if v.Origin == r.Peer {
				out = append(out, *v)
			}
			continue
		}
		c := *v
		c.Totals, c.Floors = nil, nil
		for _, t := range v.Totals {
			if componentCluster(t.Cluster) == r.Peer {
				c.Totals = append(c.Totals, t)
			}
		}
		for _, t := range v.Floors {
			if componentCluster(t.Cluster) == r.Peer {
				c.Floors = append(c.Floors, t)
			}
		}
		if len(c.Totals) > 0 || len(c.Floors) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// liveRanges are the range deletes of the pair's clusters (pair) neither
// side may have collected yet (both collect them at their own pace, as
// tombstones), in one order.
func liveRanges(rs []wire.Range, a, b hlc.Timestamp, pair func(origin string) bool) []wire.Range {
	horizon := a
	if horizon.Less(b) {
		horizon = b
	}
	var out []wire.Range
	for _, r := range rs {
		if !r.Stamp.Less(horizon) && pair(r.Origin) {
			out = append(out, r)
		}
	}
	// One range delete may be kept in pieces that touch (a filtered link
	// ships the part it lets cross, and a widening's backfill the rest):
	// the pieces of one stamp are joined, so that only the keys covered
	// are compared, not how they were carried.
	slices.SortFunc(out, func(x, y wire.Range) int {
		switch {
		case x.Stamp != y.Stamp:
			return x.Stamp.Compare(y.Stamp)
		case x.Origin != y.Origin:
			return strings.Compare(x.Origin, y.Origin)
		case x.Start != y.Start:
			return strings.Compare(x.Start, y.Start)
		}
		return strings.Compare(x.End, y.End)
	})
	joined := out[:0]
	for _, r := range out {
		if n := len(joined); n > 0 {
			last := &joined[n-1]
			if last.Stamp == r.Stamp && last.Origin == r.Origin && (last.End == "" || r.Start <= last.End) {
				if last.End != "" && (r.End == "" || r.End > last.End) {
					last.End = r.End
				}
				continue
			}
		}
		joined = append(joined, r)
	}
	out = joined
	slices.SortFunc(out, func(x, y wire.Range) int {
		switch {
		case x.Start != y.Start:
			return strings.Compare(x.Start, y.Start)
		case x.End != y.End:
			return strings.Compare(x.End, y.End)
		case x.Stamp != y.Stamp:
			return x.Stamp.Compare(y.Stamp)
		}
		return strings.Compare(x.Origin, y.Origin)
	})
	return out
}

// rangesOnly lists the ranges of a that b does not hold.
func rangesOnly(a, b []wire.Range) []api.RangeDelete {
	var out []api.RangeDelete
	for _, r := range a {
		if !slices.Contains(b, r) {
			out = append(out, api.RangeDelete{Start: r.Start, End: r.End, Stamp: r.Stamp.String(), Origin: r.Origin})
		}
	}
	return out
}

// covered is how many of n keys asked an answer covers (at least one: an
// answerer always takes one; 0 from one that covers all).
func covered(a *wire.TreeAnswer, n int) int {
	if a.Answered <= 0 || a.Answered > n {
		return n
	}
	return a.Answered
}

// inLeaves keeps the versions of keys in the leaves asked and not left
// for another request, and counts those of leaves never asked.
func inLeaves(vs []wire.TreeVersion, asked, left map[int]bool) ([]wire.TreeVersion, int) {
	out, unasked := vs[:0:0], 0
	for _, v := range vs {
		switch leaf := hashtree.Leaf(v.Key); {
		case !asked[leaf]:
			unasked++
		case !left[leaf]:
			out = append(out, v)
		}
	}
	return out, unasked
}

// refuse counts n of the peer's versions not taken, for why.
func (r *Report) refuse(why string, n int) {
	if r.RefusedWhy == nil {
		r.RefusedWhy = map[string]int{}
	}
	r.Refused += n
	r.RefusedWhy[why] += n
}

// Refuse counts n of the peer's versions a repair did not take, for why.
func (r *Report) Refuse(why string, n int) { r.refuse(why, n) }

// only keeps the versions of the keys in set.
func only(vs []wire.TreeVersion, set map[wire.Key]bool) []wire.TreeVersion {
	out := vs[:0:0]
	for _, v := range vs {
		if set[wire.Key{Key: v.Key, Counter: v.Counter}] {
			out = append(out, v)
		}
	}
	return out
}
