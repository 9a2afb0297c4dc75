package machine

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/big"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/store"
)

// Local decisions of the write path, taken in commit order: preconditions,
// the kind of a key (plain value or counter), and a counter's next totals.
// They see the store as committed plus the effects of the earlier proposals
// of the same group (the overlay), so two writes in one group decide as if
// one after the other. They read the tree and nothing else (no clock, no
// node state), so every node of a cluster that applies the same command to
// the same state decides the same.

// The decisions' refusals and a write's precondition are the contract's
// words (package api): the doors map them without importing the machine.
var (
	ErrPrecondition = api.ErrPrecondition
	ErrKindConflict = api.ErrKindConflict
)

// PreconditionError carries the key's current version (api.PreconditionError).
type PreconditionError = api.PreconditionError

// Condition is a precondition of a single-key write (api.Condition).
type Condition = api.Condition

// Reader is what decisions read: the tree as committed (*store.Store).
type Reader interface {
	Get(key string) (store.Record, error)
	HasCounters() bool
	Counter(key string) (store.Counter, error)
	Idem(key string) (store.IdemRecord, bool, error)
	RangeTombstones() []store.RangeTombstone
}

type plainState struct {
	stamp   entry.Stamp
	tomb    bool
	expires int64
	value   []byte
}

// live: a value that has not expired by now (the decided write's commit
// wall time: every node of the cluster decides the same).
func (st plainState) live(now int64) bool { return !st.tomb && (st.expires == 0 || st.expires > now) }

// Overlay decides a group's writes in order: the tree as committed plus the
// effects of the group's earlier writes.
type Overlay struct {
	st Reader
	// comp is the counter component this stream's increments count under.
	comp   string
	plain  map[string]plainState
	ranges []store.RangeTombstone
	// ctrs are the counters the group's earlier writes changed, whole.
	ctrs   map[string]*entry.Counter
	expect int // keys the group is about to decide (Reserve)
	// Floors: the format decides with counter floors (FormatCounterFloors):
	// a key's plain value and its counter read as one (entry.Resolve).
	Floors bool
	// now is the commit wall time of the write being decided: a version
	// expired by then holds no value for its decisions.
	now int64
}

// NewOverlay starts a group's decisions over st; increments count under
// the counter component comp (entry.Component of the cluster, its stream
// and counter epoch).
func NewOverlay(st Reader, comp string) *Overlay { return &Overlay{st: st, comp: comp} }

// Reserve sizes the overlay for about n keys.
func (o *Overlay) Reserve(n int) { o.expect = n }

// currentPlain returns what a plain key holds: ok false when nothing.
func (o *Overlay) currentPlain(key string) (plainState, bool, error) {
	st, ok := o.plain[key]
	if !ok {
		r, err := o.st.Get(key)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return st, false, err
		default:
			st, ok = plainState{stamp: r.Stamp, tomb: r.Tombstone, expires: r.Expires, value: r.Value}, true
		}
	}
	for _, rt := range o.ranges {
		if rt.Covers(key) && (!ok || rt.Stamp.Compare(st.stamp) > 0) {
			st, ok = plainState{stamp: rt.Stamp, tomb: true}, true
		}
	}
	return st, ok, nil
}

// currentCounter returns a key's counter as the group's earlier writes
// left it (empty totals, ok false, when it has none).
func (o *Overlay) currentCounter(key string) (entry.Counter, bool, error) {
	if c, ok := o.ctrs[key]; ok {
		return copyCounter(c), true, nil
	}
	if !o.st.HasCounters() {
		return entry.Counter{Totals: map[string]entry.PN{}}, false, nil
	}
	c, err := o.st.Counter(key)
	if errors.Is(err, store.ErrNotFound) {
		return entry.Counter{Totals: map[string]entry.PN{}}, false, nil
	}
	return c, err == nil, err
}

func copyCounter(c *entry.Counter) entry.Counter {
	return entry.Counter{Totals: maps.Clone(c.Totals), Floors: maps.Clone(c.Floors), Stamp: c.Stamp}
}

// hold keeps c, read by a decision, as the key's counter in the overlay:
// the write decided changes it, and Record adds what it changes.
func (o *Overlay) hold(key string, c entry.Counter) {
	if _, ok := o.ctrs[key]; ok {
		return
	}
	if o.ctrs == nil {
		o.ctrs = map[string]*entry.Counter{}
	}
	o.ctrs[key] = &c
}

// view reads a key as a reader would at the decided write's commit time
// (entry.Resolve), with its counter.
func (o *Overlay) view(key string) (entry.View, entry.Counter, error) {
	st, ok, err := o.currentPlain(key)
	if err != nil {
		return entry.View{}, entry.Counter{}, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	c, _, err := o.currentCounter(key)
	if err != nil {
		return entry.View{}, entry.Counter{}, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	var r *entry.Record
	if ok {
		r = &entry.Record{Stamp: st.stamp, Tombstone: st.tomb, Expires: st.expires, Value: st.value}
	}
	return entry.Resolve(r, &c, o.now), c, nil
}

// isCounter reports whether a key holds a counter.
func (o *Overlay) isCounter(key string) (bool, error) {
	if _, ok := o.ctrs[key]; ok {
		return true, nil
	}
	if !o.st.HasCounters() {
		return false, nil
	}
	_, err := o.st.Counter(key)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (o *Overlay) plainKeys(e *entry.Entry) []string {
	switch e.Op {
	case entry.OpSet, entry.OpDelete:
		return []string{e.Key}
	case entry.OpMulti:
		keys := make([]string, len(e.Ops))
		for i, op := range e.Ops {
			keys[i] = op.Key
		}
		return keys
	}
	return nil
}

// Decide checks e's local conditions (cond may be nil) and, for an
// increment by delta, fills in the counter's totals and returns its value
// here once the increment applies. Refusals are ErrPrecondition,
// ErrKindConflict and ErrCounterRange; a failed read is ErrUnreadable.
func (o *Overlay) Decide(e *entry.Entry, cond *Condition, delta int64) (counterValue int64, err error) {
	o.now = e.Commit.Wall
	if o.Floors {
		return o.decideFloors(e, cond, delta)
	}
	for _, k := range o.plainKeys(e) {
		c, err := o.isCounter(k)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		if c {
			return 0, fmt.Errorf("%w: %q is a counter; use /v1/counters", ErrKindConflict, k)
		}
	}
	if cond != nil && len(cond.Keys) > 0 {
		if err := o.checkVersions(cond.Keys); err != nil {
			return 0, err
		}
	}
	if err := o.checkSingle(e.Key, cond); err != nil {
		return 0, err
	}
	if r := e.Restores; r != nil {
		if err := o.checkRestore(e.Key, r); err != nil {
			return 0, err
		}
	}
	if e.Op == entry.OpCounter {
		st, ok, err := o.currentPlain(e.Key)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		if ok && st.live(o.now) {
			return 0, fmt.Errorf("%w: %q holds a plain value; counters need a key of their own", ErrKindConflict, e.Key)
		}
		c, _, err := o.currentCounter(e.Key)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		// This stream's own totals: a node that lost its data starts a
		// new stream, and fresh totals no max-merge can absorb.
		comp := o.comp
		t := c.Totals[comp]
		if delta >= 0 {
			t.P += uint64(delta)
		} else {
			t.N += uint64(-delta)
		}
		if err := counterInRange(c.Totals, comp, t, e.Key); err != nil {
			return 0, err
		}
		e.Ctr, e.CtrComp = &t, comp
		// the counter's value here once this increment applies
		v := int64(t.P) - int64(t.N)
		for c2, ct := range c.Totals {
			if c2 != comp {
				v += int64(ct.P) - int64(ct.N)
			}
		}
		counterValue = v
		o.hold(e.Key, c)
	}
	return counterValue, nil
}

// ErrNotInteger refuses an increment of a key whose value is not an
// integer (api.ErrNotInteger).
var ErrNotInteger = api.ErrNotInteger

// decideFloors is Decide from FormatCounterFloors: a key's plain value and
// its counter read as one (entry.Resolve). A set or delete carries the
// totals it observed as floors (what it replaces); an increment adds to
// the key's integer value, and restarts from zero a key whose value
// expired (docs/DATAMODEL.md "Counters").
func (o *Overlay) decideFloors(e *entry.Entry, cond *Condition, delta int64) (int64, error) {
	if cond != nil && len(cond.Keys) > 0 {
		if err := o.checkVersions(cond.Keys); err != nil {
			return 0, err
		}
	}
	if err := o.checkSingle(e.Key, cond); err != nil {
		return 0, err
	}
	if r := e.Restores; r != nil {
		if err := o.checkRestore(e.Key, r); err != nil {
			return 0, err
		}
	}
	// A write that replaces a key's value removes what its counter counted
	// here: the floors it carries.
	observe := func(key string) (map[string]entry.PN, error) {
		c, _, err := o.currentCounter(key)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		f := c.Observed()
		if len(f) > 0 {
			o.hold(key, c)
		}
		return f, nil
	}
	var err error
	switch e.Op {
	case entry.OpSet, entry.OpDelete:
		e.Floors, err = observe(e.Key)
		return 0, err
	case entry.OpMulti:
		for i := range e.Ops {
			if op := &e.Ops[i]; op.Op == entry.OpSet || op.Op == entry.OpDelete {
				if op.Floors, err = observe(op.Key); err != nil {
					return 0, err
				}
			}
		}
		return 0, nil
	case entry.OpCounter:
	default:
		return 0, nil
	}
	v, c, err := o.view(e.Key)
	if err != nil {
		return 0, err
	}
	var base int64
	switch {
	case v.Expired:
		// The key's value expired: the increment deletes it and counts
		// from zero, removing what was counted before.
		e.Clears, e.Floors = true, c.Observed()
	case v.Present && !v.Counted:
		n, ok := entry.ParseInt(v.Value)
		if !ok {
			return 0, fmt.Errorf("%w: %q holds a value that is not an integer", ErrNotInteger, e.Key)
		}
		base = n
	case v.Present:
		st, ok, err := o.currentPlain(e.Key)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		if ok && st.live(o.now) {
			base, _ = entry.ParseInt(st.value)
		}
	}
	comp := o.comp
	t := c.Totals[comp]
	if delta >= 0 {
		t.P += uint64(delta)
	} else {
		t.N += uint64(-delta)
	}
	if old := c.Totals[comp]; t.P < old.P || t.N < old.N {
		return 0, fmt.Errorf("%w: counter %q: this cluster's totals would pass 2^64", ErrCounterRange, e.Key)
	}
	next := copyCounter(&c)
	next.MergeFloors(e.Floors)
	next.Totals[comp] = t
	sum := next.Sum(base)
	if !sum.IsInt64() {
		return 0, fmt.Errorf("%w: counter %q would be %s, outside the 64-bit range", ErrCounterRange, e.Key, sum)
	}
	e.Ctr, e.CtrComp = &t, comp
	o.hold(e.Key, c)
	return sum.Int64(), nil
}

// checkSingle decides a single-key If-Match or If-None-Match (cond may be
// nil) against what key holds: its value, and from FormatCounterFloors its
// value and counter read as one.
func (o *Overlay) checkSingle(key string, cond *Condition) error {
	if cond == nil || (cond.IfMatch == "" && !cond.IfNoneMatch) {
		return nil
	}
	st, ok, err := o.currentPlain(key)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	present, expired := ok && st.live(o.now), ok && !st.tomb && !st.live(o.now)
	version := st.stamp
	if o.Floors {
		v, _, err := o.view(key)
		if err != nil {
			return err
		}
		present, expired, version = v.Present, v.Expired, v.Version
	}
	cur := ""
	if present {
		cur = version.String()
	}
	switch {
	case cond.IfMatch != "" && !present:
		pe := &PreconditionError{Key: key, Why: "If-Match on a key that holds no value"}
		switch {
		case expired:
			pe.Why = "If-Match on a key whose value expired"
		case ok && st.tomb:
			pe.Deleted, pe.Why = st.stamp.String(), "If-Match on a key deleted at "+st.stamp.String()
		}
		return pe
	case cond.IfMatch != "" && cond.IfMatch != cur:
		return &PreconditionError{Key: key, Current: cur, Why: fmt.Sprintf("it holds version %s, not %s", cur, cond.IfMatch)}
	case cond.IfNoneMatch && present:
		return &PreconditionError{Key: key, Current: cur, Why: "If-None-Match: * on a key that holds a value"}
	}
	return nil
}

// checkVersions checks that every key holds the version named: its live
// value's, else its counter's, else "" (a batch's Condition.Keys). A
// counter incremented earlier in the same group holds a version nobody
// could have read.
func (o *Overlay) checkVersions(kvs []api.KeyVersion) error {
	for _, kv := range kvs {
		st, ok, err := o.currentPlain(kv.Key)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		cur := ""
		switch {
		case o.Floors:
			v, _, err := o.view(kv.Key)
			if err != nil {
				return err
			}
			if v.Present {
				cur = v.Version.String()
			}
		case ok && st.live(o.now):
			cur = st.stamp.String()
		default:
			if _, inGroup := o.ctrs[kv.Key]; inGroup && !o.Floors {
				return &PreconditionError{Key: kv.Key, Why: "the counter was incremented since it was read"}
			}
			if o.st.HasCounters() {
				c, err := o.st.Counter(kv.Key)
				switch {
				case err == nil:
					cur = c.Stamp.String()
				case !errors.Is(err, store.ErrNotFound):
					return fmt.Errorf("%w: %w", ErrUnreadable, err)
				}
			}
		}
		if cur != kv.Version {
			pe := &PreconditionError{Key: kv.Key, Current: cur, Why: fmt.Sprintf("it holds version %q, not %q", cur, kv.Version)}
			if cur == "" && ok && st.tomb {
				pe.Deleted = st.stamp.String()
			}
			return pe
		}
	}
	return nil
}

// Existed counts the keys e deletes that hold a live value now (before e),
// as the group's earlier writes left them: a delete's or a batch's answer
// that depends on prior state, decided in commit order. It reads only for
// deletes.
func (o *Overlay) Existed(e *entry.Entry) (int, error) {
	o.now = e.Commit.Wall
	var keys []string
	switch e.Op {
	case entry.OpDelete:
		keys = []string{e.Key}
	case entry.OpMulti:
		for _, op := range e.Ops {
			if op.Op == entry.OpDelete {
				keys = append(keys, op.Key)
			}
		}
	}
	n := 0
	for _, k := range keys {
		ok, err := o.present(k)
		if err != nil {
			return 0, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// present reports whether a key holds a value a delete removes: a live
// plain value, or (from FormatCounterFloors) a counter that counts.
func (o *Overlay) present(k string) (bool, error) {
	if o.Floors {
		v, _, err := o.view(k)
		return v.Present, err
	}
	st, ok, err := o.currentPlain(k)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return ok && st.live(o.now), nil
}

// DropAbsentDeletes takes out of e the deletes of keys that hold no live
// value here (absent, deleted, or under a range delete): they would write
// a tombstone for nothing and ship it to every peer. It reports that
// nothing of e is left to write.
func (o *Overlay) DropAbsentDeletes(e *entry.Entry) (bool, error) {
	o.now = e.Commit.Wall
	live := o.present
	switch e.Op {
	case entry.OpDelete:
		ok, err := live(e.Key)
		return !ok, err
	case entry.OpMulti:
		kept := e.Ops[:0:0]
		for _, op := range e.Ops {
			if op.Op == entry.OpDelete {
				ok, err := live(op.Key)
				if err != nil {
					return false, err
				}
				if !ok {
					continue
				}
			}
			kept = append(kept, op)
		}
		e.Ops = kept
		return len(kept) == 0, nil
	}
	return false, nil
}

// checkRestore: a restore is written only while its key holds the
// conflict's winner (live or deleted), and says what the key holds
// otherwise.
func (o *Overlay) checkRestore(key string, r *entry.Restore) error {
	st, ok, err := o.currentPlain(key)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	if ok && st.stamp == r.Winner {
		return nil
	}
	pe := &PreconditionError{Key: key, Why: fmt.Sprintf("the key no longer holds the conflict's winner %s: it holds nothing", r.Winner)}
	switch {
	case ok && st.tomb:
		pe.Deleted = st.stamp.String()
		pe.Why = fmt.Sprintf("the key no longer holds the conflict's winner %s: it was deleted at %s", r.Winner, st.stamp)
	case ok:
		pe.Current = st.stamp.String()
		pe.Why = fmt.Sprintf("the key no longer holds the conflict's winner %s: it holds %s", r.Winner, st.stamp)
	}
	return pe
}

// ErrCounterRange refuses an increment out of range (api.ErrCounterRange).
var ErrCounterRange = api.ErrCounterRange

// counterInRange checks that a counter whose component comp takes totals t
// stays within int64, and its totals within uint64 (t wrapped if it fell
// below the old ones).
func counterInRange(totals map[string]entry.PN, comp string, t entry.PN, key string) error {
	old := totals[comp]
	if t.P < old.P || t.N < old.N {
		return fmt.Errorf("%w: counter %q: this cluster's totals would pass 2^64", ErrCounterRange, key)
	}
	sum := new(big.Int)
	for c, ct := range totals {
		if c == comp {
			ct = t
		}
		sum.Add(sum, new(big.Int).SetUint64(ct.P))
		sum.Sub(sum, new(big.Int).SetUint64(ct.N))
	}
	if _, ok := totals[comp]; !ok {
		sum.Add(sum, new(big.Int).SetUint64(t.P))
		sum.Sub(sum, new(big.Int).SetUint64(t.N))
	}
	if !sum.IsInt64() {
		return fmt.Errorf("%w: counter %q would be %s, outside the 64-bit range", ErrCounterRange, key, sum)
	}
	return nil
}

// Record adds an accepted entry's effect to the overlay.
func (o *Overlay) Record(e *entry.Entry) {
	st := e.LWW()
	switch e.Op {
	case entry.OpSet, entry.OpDelete:
		o.setPlain(e.Key, plainState{stamp: st, tomb: e.Op == entry.OpDelete, expires: e.Expires, value: e.Value})
		o.recordCounter(e.Key, st, e.Floors, "", nil)
	case entry.OpMulti:
		for _, op := range e.Ops {
			o.setPlain(op.Key, plainState{stamp: st, tomb: op.Op == entry.OpDelete, expires: op.Expires, value: op.Value})
			o.recordCounter(op.Key, st, op.Floors, "", nil)
		}
	case entry.OpDeleteRange:
		o.ranges = append(o.ranges, store.RangeTombstone{Start: e.Key, End: e.End, Stamp: st})
	case entry.OpCounter:
		if e.Clears {
			o.setPlain(e.Key, plainState{stamp: st, tomb: true})
		}
		o.recordCounter(e.Key, st, e.Floors, e.CtrComp, e.Ctr)
	}
}

// recordCounter adds a write's floors, and an increment's totals of comp,
// to the key's counter in the overlay.
func (o *Overlay) recordCounter(key string, st entry.Stamp, floors map[string]entry.PN, comp string, t *entry.PN) {
	if len(floors) == 0 && t == nil {
		return
	}
	c, ok := o.ctrs[key]
	if !ok {
		// Decide holds every counter a write it accepts changes.
		panic(fmt.Sprintf("machine: the overlay holds no counter for %q", key))
	}
	c.MergeFloors(floors)
	if t != nil {
		c.Totals[comp] = *t
	}
	if c.Stamp.Compare(st) < 0 {
		c.Stamp = st
	}
}

func (o *Overlay) setPlain(k string, st plainState) {
	if o.plain == nil {
		o.plain = make(map[string]plainState, o.expect)
	}
	if cur, ok := o.plain[k]; ok && cur.stamp.Compare(st.stamp) > 0 {
		return
	}
	o.plain[k] = st
}

// ErrUnreadable wraps a failed read of the tree during a decision: nothing
// was decided.
var ErrUnreadable = errors.New("machine: tree unreadable")

// ErrIdempotencyConflict refuses a reused idempotency key (api.ErrIdempotencyConflict).
var ErrIdempotencyConflict = api.ErrIdempotencyConflict

// KeyedDecision is what the tree says of a keyed request.
type KeyedDecision uint8

const (
	// KeyNew: no live record under the key; the request is written.
	KeyNew KeyedDecision = iota
	// KeyReplay: the same request was answered; its record is replayed
	// and nothing is written.
	KeyReplay
	// KeyConflict: another request was answered under the key.
	KeyConflict
	// KeyPlanted: a live record of this request whose write is not here
	// (nor anything newer on its key): a record always arrives with its
	// write, in one entry, so this one was planted. Answering it would tell
	// the caller a write happened that did not; the request is written as
	// new (and the caller should log it).
	KeyPlanted
)

// LookupKey decides a keyed request (its key, its request's fingerprint and
// its write e) against the tree at time now (wall ns; a record expired by
// then is no record). The record is returned with KeyReplay and
// KeyPlanted.
func (o *Overlay) LookupKey(key string, fingerprint []byte, now int64, e *entry.Entry) (KeyedDecision, *store.IdemRecord, error) {
	rec, ok, err := o.st.Idem(key)
	if err != nil {
		return KeyNew, nil, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	if !ok || rec.Expires <= now {
		return KeyNew, nil, nil
	}
	if !bytes.Equal(rec.Fingerprint, fingerprint) {
		return KeyConflict, nil, nil
	}
	present, err := o.recordedWriteHere(e, &rec)
	if err != nil {
		return KeyNew, nil, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	if !present {
		return KeyPlanted, &rec, nil
	}
	return KeyReplay, &rec, nil
}

// recordedWriteHere reports whether the write a record answered is applied
// here or superseded: the key (of a single-key write or a counter) holds a
// stamp at least the record's, or a range delete at least as new covers it.
// Writes of many keys are not checked.
func (o *Overlay) recordedWriteHere(e *entry.Entry, rec *store.IdemRecord) (bool, error) {
	switch e.Op {
	case entry.OpSet, entry.OpDelete:
		st, ok, err := NewOverlay(o.st, o.comp).currentPlain(e.Key)
		if err != nil {
			return false, err
		}
		if ok && st.stamp.Compare(rec.Stamp) >= 0 {
			return true, nil
		}
		// A newer range delete may have covered the write before it was
		// ever stored.
		for _, rt := range o.st.RangeTombstones() {
			if rt.Covers(e.Key) && rt.Stamp.Compare(rec.Stamp) >= 0 {
				return true, nil
			}
		}
		return false, nil
	case entry.OpCounter:
		ctr, err := o.st.Counter(e.Key)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return ctr.Stamp.Compare(rec.Stamp) >= 0, nil
	}
	return true, nil
}
