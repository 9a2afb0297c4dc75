package machine

import (
	"bytes"
	"errors"
	"fmt"
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
	ctr    map[string]entry.PN
	expect int // keys the group is about to decide (Reserve)
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
			st, ok = plainState{stamp: r.Stamp, tomb: r.Tombstone, expires: r.Expires}, true
		}
	}
	for _, rt := range o.ranges {
		if rt.Covers(key) && (!ok || rt.Stamp.Compare(st.stamp) > 0) {
			st, ok = plainState{stamp: rt.Stamp, tomb: true}, true
		}
	}
	return st, ok, nil
}

// isCounter reports whether a key holds a counter.
func (o *Overlay) isCounter(key string) (bool, error) {
	if _, ok := o.ctr[key]; ok {
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
	if cond != nil && (cond.IfMatch != "" || cond.IfNoneMatch) {
		st, ok, err := o.currentPlain(e.Key)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		live := ok && st.live(o.now)
		cur := ""
		if live {
			cur = st.stamp.String()
		}
		switch {
		case cond.IfMatch != "" && !live:
			pe := &PreconditionError{Key: e.Key, Why: "If-Match on a key that holds no value"}
			if ok && !st.tomb {
				pe.Why = "If-Match on a key whose value expired"
			}
			if ok && st.tomb {
				pe.Deleted, pe.Why = st.stamp.String(), "If-Match on a key deleted at "+st.stamp.String()
			}
			return 0, pe
		case cond.IfMatch != "" && cond.IfMatch != cur:
			return 0, &PreconditionError{Key: e.Key, Current: cur, Why: fmt.Sprintf("it holds version %s, not %s", cur, cond.IfMatch)}
		case cond.IfNoneMatch && live:
			return 0, &PreconditionError{Key: e.Key, Current: cur, Why: "If-None-Match: * on a key that holds a value"}
		}
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
		c, err := o.st.Counter(e.Key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		// This stream's own totals: a node that lost its data starts a
		// new stream, and fresh totals no max-merge can absorb.
		comp := o.comp
		t := c.Totals[comp]
		if ot, ok := o.ctr[e.Key]; ok {
			t = ot
		}
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
	}
	return counterValue, nil
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
		case ok && st.live(o.now):
			cur = st.stamp.String()
		default:
			if _, inGroup := o.ctr[kv.Key]; inGroup {
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
		st, ok, err := o.currentPlain(k)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		if ok && st.live(o.now) {
			n++
		}
	}
	return n, nil
}

// DropAbsentDeletes takes out of e the deletes of keys that hold no live
// value here (absent, deleted, or under a range delete): they would write
// a tombstone for nothing and ship it to every peer. It reports that
// nothing of e is left to write.
func (o *Overlay) DropAbsentDeletes(e *entry.Entry) (bool, error) {
	o.now = e.Commit.Wall
	live := func(k string) (bool, error) {
		st, ok, err := o.currentPlain(k)
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		return ok && st.live(o.now), nil
	}
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
		o.setPlain(e.Key, plainState{stamp: st, tomb: e.Op == entry.OpDelete, expires: e.Expires})
	case entry.OpMulti:
		for _, op := range e.Ops {
			o.setPlain(op.Key, plainState{stamp: st, tomb: op.Op == entry.OpDelete, expires: op.Expires})
		}
	case entry.OpDeleteRange:
		o.ranges = append(o.ranges, store.RangeTombstone{Start: e.Key, End: e.End, Stamp: st})
	case entry.OpCounter:
		if o.ctr == nil {
			o.ctr = map[string]entry.PN{}
		}
		o.ctr[e.Key] = *e.Ctr
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
