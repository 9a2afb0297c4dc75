package node

import (
	"errors"
	"fmt"
	"math/big"

	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

// Local decisions of the write path, taken in commit order: preconditions,
// the kind of a key (plain value or counter), and a counter's next totals.
// They see the store as committed plus the effects of the earlier proposals
// of the same group (the overlay), so two writes in one group decide as if
// one after the other.

var (
	// ErrPrecondition refuses a conditional write whose condition does
	// not hold (412).
	ErrPrecondition = errors.New("node: precondition failed")
	// ErrKindConflict refuses a counter operation on a plain key, or a
	// plain write on a counter key (409).
	ErrKindConflict = errors.New("node: key holds another kind")
)

// PreconditionError carries the key's current version ("" when absent).
type PreconditionError struct {
	Key     string
	Current string
	Why     string
}

func (e *PreconditionError) Error() string {
	return fmt.Sprintf("node: precondition failed on %q: %s", e.Key, e.Why)
}

func (e *PreconditionError) Is(target error) bool { return target == ErrPrecondition }

// condition is an HTTP precondition.
type condition struct {
	ifMatch     string // the version the key must hold; "" = no condition
	ifNoneMatch bool   // the key must not hold a live value
}

type plainState struct {
	stamp store.Stamp
	tomb  bool
}

type overlay struct {
	n      *Node
	plain  map[string]plainState
	ranges []store.RangeTombstone
	ctr    map[string]store.PN
}

func newOverlay(n *Node) *overlay { return &overlay{n: n} }

// currentPlain returns what a plain key holds: ok false when nothing.
func (o *overlay) currentPlain(key string) (plainState, bool, error) {
	st, ok := o.plain[key]
	if !ok {
		r, err := o.n.store.Get(key)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return st, false, err
		default:
			st, ok = plainState{stamp: r.Stamp, tomb: r.Tombstone}, true
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
func (o *overlay) isCounter(key string) (bool, error) {
	if _, ok := o.ctr[key]; ok {
		return true, nil
	}
	if !o.n.store.HasCounters() {
		return false, nil
	}
	_, err := o.n.store.Counter(key)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (o *overlay) plainKeys(e *wal.Entry) []string {
	switch e.Op {
	case store.OpSet, store.OpDelete:
		return []string{e.Key}
	case store.OpMulti:
		keys := make([]string, len(e.Ops))
		for i, op := range e.Ops {
			keys[i] = op.Key
		}
		return keys
	}
	return nil
}

// decide checks p's local conditions and fills in a counter's totals.
func (o *overlay) decide(p *proposal) error {
	e := &p.entry
	for _, k := range o.plainKeys(e) {
		c, err := o.isCounter(k)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotWritten, err)
		}
		if c {
			return fmt.Errorf("%w: %q is a counter; use /v1/counters", ErrKindConflict, k)
		}
	}
	if p.cond != nil {
		st, ok, err := o.currentPlain(e.Key)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotWritten, err)
		}
		live := ok && !st.tomb
		cur := ""
		if live {
			cur = st.stamp.String()
		}
		switch {
		case p.cond.ifMatch != "" && !live:
			return &PreconditionError{Key: e.Key, Why: "If-Match on a key that holds no value"}
		case p.cond.ifMatch != "" && p.cond.ifMatch != cur:
			return &PreconditionError{Key: e.Key, Current: cur, Why: fmt.Sprintf("it holds version %s, not %s", cur, p.cond.ifMatch)}
		case p.cond.ifNoneMatch && live:
			return &PreconditionError{Key: e.Key, Current: cur, Why: "If-None-Match: * on a key that holds a value"}
		}
	}
	if e.Op == store.OpCounter {
		st, ok, err := o.currentPlain(e.Key)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotWritten, err)
		}
		if ok && !st.tomb {
			return fmt.Errorf("%w: %q holds a plain value; counters need a key of their own", ErrKindConflict, e.Key)
		}
		c, err := o.n.store.Counter(e.Key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %w", ErrNotWritten, err)
		}
		// This stream's own totals: a node that lost its data starts a
		// new stream, and fresh totals no max-merge can absorb.
		comp := store.Component(o.n.cluster, o.n.wal.Stream(), o.n.ctrEpoch.Load())
		t := c.Totals[comp]
		if ot, ok := o.ctr[e.Key]; ok {
			t = ot
		}
		if p.delta >= 0 {
			t.P += uint64(p.delta)
		} else {
			t.N += uint64(-p.delta)
		}
		if err := counterInRange(c.Totals, comp, t, e.Key); err != nil {
			return err
		}
		e.Ctr, e.CtrComp = &t, comp
		// the counter's value here once this increment applies
		v := int64(t.P) - int64(t.N)
		for c2, ct := range c.Totals {
			if c2 != comp {
				v += int64(ct.P) - int64(ct.N)
			}
		}
		p.counterValue = v
	}
	return nil
}

// ErrCounterRange refuses an increment that would take a counter, or its
// totals, out of the 64-bit range (400, out_of_range).
var ErrCounterRange = errors.New("node: counter out of range")

// counterInRange checks that a counter whose component comp takes totals t
// stays within int64, and its totals within uint64 (t wrapped if it fell
// below the old ones).
func counterInRange(totals map[string]store.PN, comp string, t store.PN, key string) error {
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

// record adds an accepted entry's effect to the overlay.
func (o *overlay) record(e *wal.Entry) {
	st := e.LWW()
	switch e.Op {
	case store.OpSet, store.OpDelete:
		o.setPlain(e.Key, plainState{stamp: st, tomb: e.Op == store.OpDelete})
	case store.OpMulti:
		for _, op := range e.Ops {
			o.setPlain(op.Key, plainState{stamp: st, tomb: op.Op == store.OpDelete})
		}
	case store.OpDeleteRange:
		o.ranges = append(o.ranges, store.RangeTombstone{Start: e.Key, End: e.End, Stamp: st})
	case store.OpCounter:
		if o.ctr == nil {
			o.ctr = map[string]store.PN{}
		}
		o.ctr[e.Key] = *e.Ctr
	}
}

func (o *overlay) setPlain(k string, st plainState) {
	if o.plain == nil {
		o.plain = map[string]plainState{}
	}
	if cur, ok := o.plain[k]; ok && cur.stamp.Compare(st.stamp) > 0 {
		return
	}
	o.plain[k] = st
}
