package wire

import (
	"bytes"
	"errors"
	"fmt"
	"sort"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// Anti-entropy's exchange between clusters (docs/ANTIENTROPY.md). A node
// that compares its tree with a peer's posts a TreeRequest to PathTree on
// the peer's replication listener, authenticated as a batch is, and gets a
// TreeAnswer: the sums of some nodes of one level of the peer's hashtree,
// the versions of the keys of some leaves (stamps and hashes, no values),
// or the whole versions of some keys (to repair). Both are msgpack maps of
// short keys; every bound is checked before anything is used.

// PathTree is where a peer's anti-entropy asks for the tree.
const PathTree = "/v1/replicate/tree"

// Tree operations.
const (
	// TreeSums asks for the sums of Nodes at Level (0: the root).
	TreeSums = 1
	// TreeLeaves asks for the versions, without values, of every key
	// of the leaves Nodes (plain values, tombstones and counters).
	TreeLeaves = 2
	// TreeVersions asks for the whole versions of Keys (Counter says which
	// key space each is in).
	TreeVersions = 3
)

// Bounds of one exchange.
const (
	// MaxTreeNodes bounds the nodes of one sums or leaves request: every
	// leaf of the tree (hashtree.Leaves).
	MaxTreeNodes = 1 << 20
	// MaxTreeKeys bounds the keys of one versions request, and the
	// versions of one answer.
	MaxTreeKeys = 1 << 22
	// MaxTreeBody bounds an answer's body (a request is read as a batch
	// is, within the receiver's --replicate-max-bytes).
	MaxTreeBody = 64 << 20
)

// TreeRequest asks a peer for part of its tree.
type TreeRequest struct {
	// Protocol is the hashtree.Version the asker computes trees with: a
	// peer that computes them otherwise refuses.
	Protocol int   `msgpack:"p"`
	Op       int   `msgpack:"o"`
	Level    int   `msgpack:"l,omitempty"`
	Nodes    []int `msgpack:"n,omitempty"`
	Keys     []Key `msgpack:"k,omitempty"`
	// Filters scope the comparison to the keys every one of them lets
	// cross (none: every key): the asker's link filter toward the
	// answerer, and from the first answer on the answerer's toward the
	// asker too. Pass names the comparison, so that an answerer may keep
	// a scoped tree it summed for it.
	Filters []Filter `msgpack:"f,omitempty"`
	Pass    uint64   `msgpack:"s,omitempty"`
	// Expiry: the asker keeps versions that expire (command format 11).
	// To another asker, whole versions with an expiry are not answered: a
	// build that does not know the field would repair them as versions
	// that never expire.
	Expiry bool `msgpack:"e,omitempty"`
	// Floors: the asker keeps counter floors (command format 12); to
	// another asker, counters with floors are not answered whole.
	Floors bool `msgpack:"fl,omitempty"`
}

// Filter is a link's filter as a tree request scopes by it.
type Filter struct {
	Include []string `msgpack:"i,omitempty"`
	Exclude []string `msgpack:"x,omitempty"`
}

// MaxTreeFilters bounds the filters of one request.
const MaxTreeFilters = 4

// Key names a key in one of the two key spaces.
type Key struct {
	Key     string `msgpack:"k"`
	Counter bool   `msgpack:"c,omitempty"`
}

// TreeAnswer is a peer's answer.
type TreeAnswer struct {
	Protocol int `msgpack:"p"`
	// Sums answer TreeSums, one per node asked, in order (16 bytes each:
	// hashtree.Sum.AppendTo).
	Sums [][]byte `msgpack:"s,omitempty"`
	// Versions answer TreeLeaves (no values) and TreeVersions (whole),
	// sorted by key, plain before counter.
	Versions []TreeVersion `msgpack:"v,omitempty"`
	// Ranges are the range tombstones the peer keeps (TreeSums at level 0).
	Ranges []Range `msgpack:"r,omitempty"`
	// Collected is the cutoff below which the peer collected tombstones:
	// a version older than it that the peer lacks may have been deleted
	// there (a possible resurrection, never copied).
	Collected hlc.Timestamp `msgpack:"h,omitempty"`
	// Filters are the filters the answer was scoped by: the request's and
	// the answerer's own toward the asker (TreeSums at level 0).
	Filters []Filter `msgpack:"f,omitempty"`
	// Answered is how many of a TreeVersions request's keys, in its
	// order, the answer covers (the rest past its byte budget: ask again);
	// 0 from an answerer that covers them all.
	Answered int `msgpack:"a,omitempty"`
	// Rest are the leaves of a TreeLeaves request the answer does not
	// cover (past its byte budget: ask again); none from an answerer that
	// covers them all. Every leaf it lists none of is covered whole.
	Rest []int `msgpack:"rl,omitempty"`
}

// TreeVersion is one key's version as anti-entropy exchanges it.
type TreeVersion struct {
	Key     string `msgpack:"k"`
	Counter bool   `msgpack:"c,omitempty"`
	// Kind is a plain record's kind (entry.KindPlain, or a counter's
	// tombstone in the plain key space).
	Kind      uint8         `msgpack:"d,omitempty"`
	Stamp     hlc.Timestamp `msgpack:"t"`
	Origin    string        `msgpack:"o"`
	Tombstone bool          `msgpack:"x,omitempty"`
	// Hash is the value's hash (a counter's: its totals'), as its leaf
	// digest covers it.
	Hash uint64 `msgpack:"h"`
	// Value, Ctx and Totals come with whole versions only.
	Value  []byte        `msgpack:"v,omitempty"`
	Ctx    []ContextItem `msgpack:"a,omitempty"`
	Totals []Component   `msgpack:"z,omitempty"`
	Whole  bool          `msgpack:"w,omitempty"`
	// Expires is a plain version's expiry (wall ns; 0: never), with
	// whole versions and leaves alike (Hash covers it).
	Expires int64 `msgpack:"e,omitempty"`
	// Floors are a counter's floors (whole versions only; Hash covers
	// them).
	Floors []Component `msgpack:"fl,omitempty"`
}

// ContextItem is one item of a version's causal context.
type ContextItem struct {
	Origin string        `msgpack:"o"`
	Stamp  hlc.Timestamp `msgpack:"t"`
}

// Component is one cluster's totals in a counter.
type Component struct {
	Cluster string `msgpack:"c"`
	P       uint64 `msgpack:"p"`
	N       uint64 `msgpack:"n"`
}

// Range is a range tombstone as anti-entropy compares it.
type Range struct {
	Start  string        `msgpack:"s"`
	End    string        `msgpack:"e,omitempty"`
	Stamp  hlc.Timestamp `msgpack:"t"`
	Origin string        `msgpack:"o"`
}

// EntryStamp is v's stamp as the tree keeps it.
func (v *TreeVersion) EntryStamp() entry.Stamp { return entry.Stamp{HLC: v.Stamp, Origin: v.Origin} }

// Context is v's context as the tree keeps it.
func (v *TreeVersion) Context() entry.Context {
	if len(v.Ctx) == 0 {
		return nil
	}
	c := make(entry.Context, len(v.Ctx))
	for i, it := range v.Ctx {
		c[i] = entry.ContextItem{Origin: it.Origin, HLC: it.Stamp}
	}
	return c
}

// ErrBadTree refuses a tree request or answer that does not decode or
// breaks a bound.
var ErrBadTree = errors.New("wire: bad tree message")

// EncodeTree encodes a request or an answer.
func EncodeTree(v any) ([]byte, error) { return msgpack.Marshal(v) }

// DecodeTreeRequest decodes and checks a request.
func DecodeTreeRequest(b []byte) (*TreeRequest, error) {
	var r TreeRequest
	if err := boundLengths(b); err != nil {
		return nil, err
	}
	if err := msgpack.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadTree, err)
	}
	if err := checkFilters(r.Filters); err != nil {
		return nil, err
	}
	switch r.Op {
	case TreeSums, TreeLeaves:
		if len(r.Nodes) == 0 || len(r.Nodes) > MaxTreeNodes {
			return nil, fmt.Errorf("%w: %d nodes (1 to %d)", ErrBadTree, len(r.Nodes), MaxTreeNodes)
		}
	case TreeVersions:
		if len(r.Keys) == 0 || len(r.Keys) > MaxTreeKeys {
			return nil, fmt.Errorf("%w: %d keys (1 to %d)", ErrBadTree, len(r.Keys), MaxTreeKeys)
		}
		for _, k := range r.Keys {
			if err := checkTreeKey(k.Key); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrBadTree, err)
			}
		}
	default:
		return nil, fmt.Errorf("%w: operation %d", ErrBadTree, r.Op)
	}
	return &r, nil
}

// DecodeTreeAnswer decodes and checks an answer.
func DecodeTreeAnswer(b []byte) (*TreeAnswer, error) {
	var a TreeAnswer
	if err := boundLengths(b); err != nil {
		return nil, err
	}
	if err := msgpack.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadTree, err)
	}
	if len(a.Sums) > MaxTreeNodes || len(a.Versions) > MaxTreeKeys || len(a.Rest) > MaxTreeNodes {
		return nil, fmt.Errorf("%w: %d sums, %d versions, %d leaves left", ErrBadTree, len(a.Sums), len(a.Versions), len(a.Rest))
	}
	if err := checkFilters(a.Filters); err != nil {
		return nil, err
	}
	for _, s := range a.Sums {
		if len(s) != 16 {
			return nil, fmt.Errorf("%w: a sum of %d bytes", ErrBadTree, len(s))
		}
	}
	for i := range a.Versions {
		if err := a.Versions[i].Check(); err != nil {
			return nil, fmt.Errorf("%w: version %d: %v", ErrBadTree, i, err)
		}
	}
	return &a, nil
}

// Check validates a decoded version as the tree would take it.
func (v *TreeVersion) Check() error {
	if err := checkTreeKey(v.Key); err != nil {
		return err
	}
	if v.Origin == "" || len(v.Origin) > 63 {
		return fmt.Errorf("origin %q", v.Origin)
	}
	if entry.Kind(v.Kind) != entry.KindPlain && entry.Kind(v.Kind) != entry.KindCounter {
		return fmt.Errorf("kind %d", v.Kind)
	}
	if len(v.Ctx) > entry.MaxContext {
		return fmt.Errorf("context of %d items", len(v.Ctx))
	}
	if v.Expires < 0 || (v.Expires != 0 && (v.Tombstone || v.Counter)) {
		return fmt.Errorf("an expiry of %d on a tombstone or a counter", v.Expires)
	}
	if err := v.Context().Check(); err != nil && len(v.Ctx) > 0 {
		return err
	}
	if !v.Counter && (len(v.Totals) > 0 || len(v.Floors) > 0) {
		return errors.New("totals or floors on a plain version")
	}
	if len(v.Floors) > entry.MaxFloors {
		return fmt.Errorf("%d floors", len(v.Floors))
	}
	for _, cs := range [][]Component{v.Totals, v.Floors} {
		if !sort.SliceIsSorted(cs, func(i, j int) bool { return cs[i].Cluster < cs[j].Cluster }) {
			return errors.New("components out of order")
		}
		for i, c := range cs {
			if c.Cluster == "" || len(c.Cluster) > entry.MaxComponentLen || (i > 0 && c.Cluster == cs[i-1].Cluster) {
				return fmt.Errorf("component %q", c.Cluster)
			}
		}
	}
	return nil
}

// maxTreeKey bounds a key anti-entropy names (the API's keys are far
// shorter; this only keeps a bad message from naming huge ones).
const maxTreeKey = 1 << 16

func checkTreeKey(k string) error {
	if k == "" || len(k) > maxTreeKey {
		return fmt.Errorf("a key of %d bytes", len(k))
	}
	return nil
}

// maxTreeDepth bounds the nesting of a tree message (an answer nests four
// deep: answer, versions, a version, its context).
const maxTreeDepth = 6

// boundLengths walks a msgpack message and refuses any array or map that
// claims more elements than bytes remain, or nesting deeper than the
// messages have: the decoder would otherwise allocate up to a million
// elements for a five-byte lie before finding the body short.
func boundLengths(b []byte) error {
	rd := bytes.NewReader(b)
	dec := msgpack.NewDecoder(rd)
	var walk func(depth int) error
	walk = func(depth int) error {
		if depth > maxTreeDepth {
			return fmt.Errorf("%w: nested deeper than %d", ErrBadTree, maxTreeDepth)
		}
		c, err := dec.PeekCode()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadTree, err)
		}
		var n, per int
		switch {
		case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
			n, err = dec.DecodeArrayLen()
			per = 1
		case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
			n, err = dec.DecodeMapLen()
			per = 2
		default:
			if err := dec.Skip(); err != nil {
				return fmt.Errorf("%w: %v", ErrBadTree, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadTree, err)
		}
		if n > rd.Len() {
			return fmt.Errorf("%w: %d elements claimed, %d bytes left", ErrBadTree, n, rd.Len())
		}
		for i := 0; i < n*per; i++ {
			if err := walk(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(0); err != nil {
		return err
	}
	if rd.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadTree, rd.Len())
	}
	return nil
}

// Entry is f as the tree's filters are.
func (f Filter) Entry() entry.Filter { return entry.Filter{Include: f.Include, Exclude: f.Exclude} }

func checkFilters(fs []Filter) error {
	if len(fs) > MaxTreeFilters {
		return fmt.Errorf("%w: %d filters (at most %d)", ErrBadTree, len(fs), MaxTreeFilters)
	}
	for _, f := range fs {
		if err := f.Entry().Validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrBadTree, err)
		}
	}
	return nil
}

// SortVersions orders versions as answers carry them: by key, a plain
// version before a counter of the same key.
func SortVersions(vs []TreeVersion) {
	sort.Slice(vs, func(i, j int) bool {
		if vs[i].Key != vs[j].Key {
			return vs[i].Key < vs[j].Key
		}
		return !vs[i].Counter && vs[j].Counter
	})
}
