package entry

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/replicator/replicator/hlc"
)

// StreamID names one outbound WAL. It is random, minted when the WAL is
// created, so a WAL that is lost and recreated never reuses identities.
type StreamID [16]byte

// NewStreamID mints a random stream ID.
func NewStreamID() StreamID {
	var s StreamID
	if _, err := rand.Read(s[:]); err != nil {
		panic("entry: no randomness for a stream id: " + err.Error())
	}
	return s
}

func (s StreamID) String() string { return hex.EncodeToString(s[:]) }

// IsZero reports whether s is the zero ID (no stream).
func (s StreamID) IsZero() bool { return s == StreamID{} }

// Compare orders streams by their bytes (slices.SortFunc, the order of a
// heartbeat's open streams).
func (s StreamID) Compare(o StreamID) int { return bytes.Compare(s[:], o[:]) }

// ParseStreamID reads the output of String.
func ParseStreamID(v string) (StreamID, error) {
	var s StreamID
	b, err := hex.DecodeString(v)
	if err != nil || len(b) != len(s) {
		return s, fmt.Errorf("entry: stream id %q: want 32 hex digits", v)
	}
	copy(s[:], b)
	return s, nil
}

// Entry is one replicated mutation. Its WAL identity (Origin, Stream, Index)
// never changes, whichever cluster forwards it; receivers dedup on it.
type Entry struct {
	Index  uint64        // i: position in the origin stream, from 1
	Origin string        // o: authoring cluster, resolved by infrastructure
	Stream StreamID      // s: the origin's stream
	Commit hlc.Timestamp // c: commit HLC, assigned at append; grows with Index
	Stamp  hlc.Timestamp // t: LWW stamp; equals Commit unless a caller pinned one
	Op     Op            // op
	Key    string        // k
	Value  []byte        // val
	Idem   *Idem         // idem: the idempotency record this write creates
	// StampOrigin is the origin of the LWW stamp when it differs from the
	// entry's origin: only in a re-seed snapshot, which relays every key
	// with the stamp it holds, whoever wrote it. For a counter entry it is
	// also the cluster whose totals Ctr carries.
	StampOrigin string // so
	End         string // end: exclusive end of a delete_range ("" = the end of the key space)
	Ctr         *PN    // ctr: [P, N], the resulting totals of the component CtrComp (op counter)
	// CtrComp names the totals Ctr carries (cc): Component(origin,
	// stream) for a local increment, any component in a re-seed snapshot.
	// Empty in entries written before totals were kept per stream: those
	// carry the totals of CounterCluster.
	CtrComp string
	Ops     []BatchOp // ops: the writes of an atomic batch (op multi)
	// Oversize marks a stub (ovs): the entry was too large for the peer it
	// was shipped to, so only its identity, op and key travel, with its
	// encoded size; the receiver sets it aside as a dead letter and the
	// link moves on.
	Oversize uint64
	// FilteredTo marks a filtered marker (flt): the entries from Index up to
	// FilteredTo hold no key the link's filter lets cross, so only their
	// index range and the commit of the last one (Commit) travel. The
	// receiver raises its high-water mark past them, counted as filtered.
	FilteredTo uint64
	// Ctx is the causal context of a set or delete (cx): what its author
	// held for the key, with its own stamp. Empty from a cluster whose log
	// keeps no contexts (then a conflict it wins is only possible).
	Ctx Context
	// Restores marks a set or delete that brings a conflict's loser back
	// (rs): written only while the key held the conflict's winner, its
	// context covers the loser too, and every cluster that applies it marks
	// its records of that loser restored.
	Restores *Restore
	// Expires is when a set's version expires (ex): wall time in ns since
	// the epoch, 0 for never. It belongs to the version: a later write
	// replaces it with its own (docs/DATAMODEL.md "Expiry").
	Expires int64
	// Floors are the counter totals a set, delete or increment observed at
	// its key (fl), per component: once it applies, the key's value counts
	// only what lies beyond them (an observed remove: docs/DATAMODEL.md
	// "Counters"). Merged by pointwise maximum, as totals are.
	Floors map[string]PN
	// Clears marks an increment that first deletes the key's expired value
	// (cl): the key counts again from zero, as in Redis.
	Clears bool
}

// Restore names the conflict a write restores: the discarded version and
// the one that won.
type Restore struct {
	Loser, Winner Stamp
}

// IsMarker reports whether e is a filtered marker.
func (e *Entry) IsMarker() bool { return e.FilteredTo > 0 }

// Covers is how many indexes e accounts for: one, or a marker's run.
func (e *Entry) Covers() uint64 {
	if e.FilteredTo > 0 {
		return e.FilteredTo - e.Index + 1
	}
	return 1
}

// Last is the last index e accounts for.
func (e *Entry) Last() uint64 { return e.Index + e.Covers() - 1 }

// BatchOp is one write of an atomic batch; it takes the batch entry's stamp.
type BatchOp struct {
	Op    Op // set or delete; delete_range only in a batch clipped by a filter
	Key   string
	Value []byte
	End   string  // delete_range: the exclusive end ("" = the end of the key space)
	Ctx   Context // cx: the op's causal context (one per key)
	// Expires is when a set's version expires (ex; Entry.Expires).
	Expires int64
	// Floors are the counter totals the op observed at its key (fl;
	// Entry.Floors).
	Floors map[string]PN
}

// CounterCluster is the cluster whose totals a legacy counter entry (one
// without CtrComp) carries.
func (e *Entry) CounterCluster() string {
	if e.StampOrigin != "" {
		return e.StampOrigin
	}
	return e.Origin
}

// CounterComponent is the component whose totals a counter entry carries.
func (e *Entry) CounterComponent() string {
	if e.CtrComp != "" {
		return e.CtrComp
	}
	return e.CounterCluster()
}

// Stub returns the entry as an oversize stub of the given encoded size:
// identity, op, key and stamps, without the payload.
func (e *Entry) Stub(size int) Entry {
	st := Entry{Index: e.Index, Origin: e.Origin, Stream: e.Stream, Commit: e.Commit, Stamp: e.Stamp,
		Op: e.Op, Oversize: uint64(size)}
	if len(e.Key) <= 4096 {
		st.Key = e.Key
	}
	return st
}

// Idem is the idempotency record of a keyed request: what the request was
// (its fingerprint) and what it was answered. It rides in the entry so every
// cluster stores it with the write, and a retry sent to any of them replays
// the answer instead of writing again.
type Idem struct {
	Key         string // k: the client's Idempotency-Key
	Fingerprint []byte // fp: SHA-256 of the request
	Status      int    // st: the HTTP status answered
	Body        []byte // b: the answer's body
	Expires     int64  // x: wall ns after which the record may be collected
}

// MaxIdemKey bounds an idempotency key.
const MaxIdemKey = 256

// LWW returns the entry's last-writer-wins stamp.
func (e *Entry) LWW() Stamp {
	ts := e.Stamp
	if ts.IsZero() {
		ts = e.Commit
	}
	o := e.Origin
	if e.StampOrigin != "" {
		o = e.StampOrigin
	}
	return Stamp{HLC: ts, Origin: o}
}

// ErrMalformed is the class of errors for entry bytes that do not decode to a
// valid entry. Input from a peer that fails this way is refused with a 4xx;
// bytes from the local WAL that fail this way are corruption.
var ErrMalformed = errors.New("entry: malformed")

// CheckComponent validates a counter component name: a cluster ID,
// optionally followed by "/" and a stream ID in hex.
func CheckComponent(c string) error {
	cluster, stream, withStream := strings.Cut(c, "/")
	if cluster == "" || len(cluster) > 63 || len(c) > MaxComponentLen {
		return fmt.Errorf("counter component %q", c)
	}
	for i := 0; i < len(cluster); i++ {
		ch := cluster[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-') {
			return fmt.Errorf("counter component %q", c)
		}
	}
	if withStream {
		id, epoch, withEpoch := strings.Cut(stream, ".")
		if _, err := ParseStreamID(id); err != nil {
			return fmt.Errorf("counter component %q: %v", c, err)
		}
		if withEpoch {
			if n, err := strconv.ParseUint(epoch, 10, 32); err != nil || n == 0 || strconv.FormatUint(n, 10) != epoch {
				return fmt.Errorf("counter component %q: epoch %q", c, epoch)
			}
		}
	}
	return nil
}

// Validate checks what every entry must satisfy, wherever it came from.
func (e *Entry) Validate() error {
	switch {
	case e.Index == 0:
		return fmt.Errorf("%w: index 0", ErrMalformed)
	case e.Origin == "" || len(e.Origin) > 63:
		return fmt.Errorf("%w: origin %q", ErrMalformed, e.Origin)
	case e.Stream.IsZero():
		return fmt.Errorf("%w: zero stream", ErrMalformed)
	case e.Commit.IsZero():
		return fmt.Errorf("%w: entry %d has no commit hlc", ErrMalformed, e.Index)
	}
	bad := func(why string) error { return fmt.Errorf("%w: entry %d: %s: %s", ErrMalformed, e.Index, e.Op, why) }
	if e.CtrComp != "" && e.Op != OpCounter {
		return bad("a counter component")
	}
	if e.FilteredTo > 0 {
		// A marker carries its run and the last commit, nothing else.
		if e.FilteredTo < e.Index || e.Oversize > 0 || e.Op != 0 || e.Key != "" || len(e.Value) > 0 || e.End != "" ||
			e.Ctr != nil || len(e.Ops) > 0 || e.Idem != nil || e.StampOrigin != "" || e.CtrComp != "" || e.HasFloors() {
			return fmt.Errorf("%w: entry %d: a filtered marker to %d with other fields", ErrMalformed, e.Index, e.FilteredTo)
		}
		return nil
	}
	if e.Oversize > 0 {
		// A stub carries no payload; it is never applied, only set aside.
		if e.Op < OpSet || e.Op > OpMulti {
			return fmt.Errorf("%w: entry %d: unknown op %d", ErrMalformed, e.Index, e.Op)
		}
		if len(e.Value) > 0 || e.End != "" || e.Ctr != nil || len(e.Ops) > 0 || e.Idem != nil || e.HasFloors() {
			return bad("a stub with a payload")
		}
		return nil
	}
	if err := e.checkContexts(); err != nil {
		return bad(err.Error())
	}
	if err := e.checkExpiry(); err != nil {
		return bad(err.Error())
	}
	if err := e.checkFloors(); err != nil {
		return bad(err.Error())
	}
	switch e.Op {
	case OpSet, OpDelete:
		if e.Key == "" {
			return bad("empty key")
		}
		if e.Op == OpDelete && len(e.Value) > 0 {
			return bad("a value")
		}
		if e.End != "" || e.Ctr != nil || len(e.Ops) > 0 {
			return bad("fields of another op")
		}
	case OpDeleteRange:
		if e.End != "" && e.End <= e.Key {
			return bad(fmt.Sprintf("empty range [%q, %q)", e.Key, e.End))
		}
		if len(e.Value) > 0 || e.Ctr != nil || len(e.Ops) > 0 {
			return bad("fields of another op")
		}
	case OpCounter:
		if e.Key == "" || e.Ctr == nil {
			return bad("needs a key and totals")
		}
		if len(e.Value) > 0 || e.End != "" || len(e.Ops) > 0 {
			return bad("fields of another op")
		}
	case OpMulti:
		if len(e.Ops) == 0 {
			return bad("no ops")
		}
		if e.Key != "" || len(e.Value) > 0 || e.End != "" || e.Ctr != nil {
			return bad("fields of another op")
		}
	default:
		return fmt.Errorf("%w: entry %d: unknown op %d", ErrMalformed, e.Index, e.Op)
	}
	return nil
}

// HasExpiry reports whether e, or an op of it, carries an expiry.
func (e *Entry) HasExpiry() bool {
	if e.Expires != 0 {
		return true
	}
	for i := range e.Ops {
		if e.Ops[i].Expires != 0 {
			return true
		}
	}
	return false
}

// HasFloors reports whether e, or an op of it, carries counter floors or
// clears a key: what a cluster before command format 12 cannot keep.
func (e *Entry) HasFloors() bool {
	if len(e.Floors) > 0 || e.Clears {
		return true
	}
	for i := range e.Ops {
		if len(e.Ops[i].Floors) > 0 {
			return true
		}
	}
	return false
}

// MaxFloors bounds the components a write's floors name.
const MaxFloors = 1024

// checkFloors: floors ride on a set, a delete or an increment (or a
// batch's set or delete), name components, and are bounded; only an
// increment clears.
func (e *Entry) checkFloors() error {
	check := func(op Op, f map[string]PN) error {
		if len(f) == 0 {
			return nil
		}
		if op != OpSet && op != OpDelete && op != OpCounter {
			return fmt.Errorf("counter floors on %s", op)
		}
		if len(f) > MaxFloors {
			return fmt.Errorf("%d counter floors", len(f))
		}
		for c := range f {
			if err := CheckComponent(c); err != nil {
				return err
			}
		}
		return nil
	}
	if e.Clears && e.Op != OpCounter {
		return fmt.Errorf("a clear on %s", e.Op)
	}
	if err := check(e.Op, e.Floors); err != nil {
		return err
	}
	for i := range e.Ops {
		if e.Ops[i].Op == OpCounter {
			return fmt.Errorf("op %d: an increment in a batch", i)
		}
		if err := check(e.Ops[i].Op, e.Ops[i].Floors); err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
	}
	return nil
}

// checkExpiry: an expiry rides only on a set (or a batch's set op), and is
// a time after the epoch.
func (e *Entry) checkExpiry() error {
	if e.Expires < 0 || (e.Expires != 0 && e.Op != OpSet) {
		return fmt.Errorf("an expiry of %d on %s", e.Expires, e.Op)
	}
	for i := range e.Ops {
		if x := e.Ops[i].Expires; x < 0 || (x != 0 && e.Ops[i].Op != OpSet) {
			return fmt.Errorf("op %d: an expiry of %d on %s", i, x, e.Ops[i].Op)
		}
	}
	return nil
}

// checkContexts: a context rides only on a set or delete, or on the ops of
// a batch, is well formed, and covers the version's own stamp (a context
// that does not would make a version a conflict of itself).
func (e *Entry) checkContexts() error {
	own := e.LWW()
	check := func(c Context) error {
		if len(c) == 0 {
			return nil
		}
		if err := c.Check(); err != nil {
			return err
		}
		if !c.Covers(own) {
			return fmt.Errorf("context does not cover the version's own stamp %s", own)
		}
		return nil
	}
	if len(e.Ctx) > 0 && e.Op != OpSet && e.Op != OpDelete && !(e.Op == OpCounter && e.Clears) {
		return errors.New("a context on an op that is not a set or delete")
	}
	if r := e.Restores; r != nil {
		switch {
		case e.Op != OpSet && e.Op != OpDelete:
			return errors.New("a restore on an op that is not a set or delete")
		case r.Loser.Origin == "" || r.Winner.Origin == "" || r.Loser.HLC.IsZero() || r.Winner.HLC.IsZero():
			return errors.New("a restore without both versions")
		}
	}
	if err := check(e.Ctx); err != nil {
		return err
	}
	for i := range e.Ops {
		if len(e.Ops[i].Ctx) > 0 && e.Ops[i].Op == OpDeleteRange {
			return errors.New("a context on a delete_range")
		}
		if err := check(e.Ops[i].Ctx); err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
	}
	return nil
}

// ErrNotKept: a stream does not hold an entry at that index (any more): it
// was cut once every peer acknowledged it, or lies past the stream's end. A
// shipper that needs it must re-seed its peer instead.
var ErrNotKept = errors.New("entry: not kept in the stream")

// ClusterIDPattern is the syntax of a cluster ID: lower-case letters, digits
// and '-', 1 to 63 characters, not starting with '-' (a DNS label, so it fits
// hostnames, metric labels and file names alike).
const ClusterIDPattern = `^[a-z0-9][a-z0-9-]{0,62}$`

// ValidClusterID reports whether id matches ClusterIDPattern. Every origin
// and sender that arrives on the wire passes it before anything is applied.
func ValidClusterID(id string) bool {
	if id == "" || len(id) > 63 || id[0] == '-' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
