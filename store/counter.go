package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
)

// PN-counters live in a key space of their own,
//
//	k<key>   version(1) | stamp hlc(12) | len(origin)(1) | origin | n(2) | n x component
//	         [| m(2) | m x component: the floors, version 2]
//	         component: len(cluster)(1) | cluster | P(8) | N(8), sorted by cluster
//
// so a counter and a plain value never overwrite each other: the local rule
// refuses one kind of write on a key that holds the other, and writes that
// raced at two clusters end up side by side, the same everywhere.
const (
	counterVersion = 1
	// counterFloorsVersion adds | n(2) | n x component of floors (command
	// format 12; a build before it refuses the record as corrupt).
	counterFloorsVersion = 2
)

// CounterEpoch returns the counter epoch recorded for a stream (0 when none,
// or when the record is of another stream).
func (s *Store) CounterEpoch(stream [16]byte) (uint32, error) {
	v, closer, err := s.db.Get(keyCtrEpoch)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: read counter epoch: %w", err)
	}
	defer closer.Close()
	if len(v) != 20 {
		return 0, fmt.Errorf("%w: counter epoch of %d bytes", ErrCorrupt, len(v))
	}
	if [16]byte(v[:16]) != stream {
		return 0, nil
	}
	return binary.BigEndian.Uint32(v[16:]), nil
}

// SetCounterEpoch records a stream's counter epoch, synced.
func (s *Store) SetCounterEpoch(stream [16]byte, epoch uint32) error {
	v := binary.BigEndian.AppendUint32(append([]byte(nil), stream[:]...), epoch)
	if err := s.db.Set(keyCtrEpoch, v, pebble.Sync); err != nil {
		return fmt.Errorf("store: write counter epoch: %w", err)
	}
	return nil
}

// SetCounterEpoch records a stream's counter epoch in the batch.
func (b *Batch) SetCounterEpoch(stream [16]byte, epoch uint32) error {
	return b.pb.Set(keyCtrEpoch, binary.BigEndian.AppendUint32(append([]byte(nil), stream[:]...), epoch), nil)
}

func appendCounter(dst []byte, c *Counter) []byte {
	v := byte(counterVersion)
	if len(c.Floors) > 0 {
		v = counterFloorsVersion
	}
	dst = append(dst, v)
	dst = c.Stamp.HLC.AppendTo(dst)
	dst = append(dst, byte(len(c.Stamp.Origin)))
	dst = append(dst, c.Stamp.Origin...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(c.Totals)))
	dst = appendComponents(dst, c.Totals)
	if len(c.Floors) > 0 {
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(c.Floors)))
		dst = appendComponents(dst, c.Floors)
	}
	return dst
}

// DecodeCounter parses a stored counter.
func DecodeCounter(b []byte) (Counter, error) {
	c := Counter{Totals: map[string]entry.PN{}}
	bad := func(what string) (Counter, error) {
		return Counter{}, fmt.Errorf("%w: counter record: %s", ErrCorrupt, what)
	}
	version := byte(counterVersion)
	if len(b) > 0 && b[0] == counterFloorsVersion {
		version = counterFloorsVersion
	}
	st, b, what := decodeStampHead(b, version, 2)
	if what != "" {
		return bad(what)
	}
	c.Stamp = st
	if b, what = decodeComponents(b, c.Totals); what != "" {
		return bad(what)
	}
	if version == counterFloorsVersion {
		c.Floors = map[string]entry.PN{}
		if len(b) < 2 {
			return bad("floors")
		}
		if b, what = decodeComponents(b, c.Floors); what != "" {
			return bad("floors: " + what)
		}
		if len(c.Floors) == 0 {
			return bad("no floors")
		}
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return c, nil
}

// decodeComponents reads count(2) | component* into into, returning what
// follows or what is wrong.
func decodeComponents(b []byte, into map[string]entry.PN) ([]byte, string) {
	count := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	prev := ""
	for i := 0; i < count; i++ {
		if len(b) < 1 {
			return nil, "component"
		}
		l := int(b[0])
		if l == 0 || l > entry.MaxComponentLen || len(b) < 1+l+16 {
			return nil, "component"
		}
		name := string(b[1 : 1+l])
		if i > 0 && name <= prev {
			return nil, "components out of order"
		}
		prev = name
		into[name] = entry.PN{P: binary.BigEndian.Uint64(b[1+l:]), N: binary.BigEndian.Uint64(b[9+l:])}
		b = b[1+l+16:]
	}
	return b, ""
}

// Counter reads a counter (ErrNotFound when the key holds none).
func (s *Store) Counter(key string) (Counter, error) {
	if !s.hasCounters.Load() || !s.mayHoldCounter(key) {
		return Counter{}, ErrNotFound // no counter at all, or none at key: nothing to read
	}
	v, closer, err := s.db.Get(counterKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return Counter{}, ErrNotFound
	}
	if err != nil {
		return Counter{}, fmt.Errorf("store: read counter %q: %w", key, err)
	}
	defer closer.Close()
	return DecodeCounter(v)
}

// Counter reads a counter as this batch sees it (its own merges first).
func (b *Batch) Counter(key string) (Counter, bool, error) {
	if c, ok := b.pendingCtr[key]; ok {
		return copyCounter(c), true, nil
	}
	c, err := b.s.Counter(key)
	if errors.Is(err, ErrNotFound) {
		return Counter{Totals: map[string]entry.PN{}}, false, nil
	}
	return c, err == nil, err
}

func copyCounter(c *Counter) Counter {
	out := Counter{Totals: make(map[string]entry.PN, len(c.Totals)), Stamp: c.Stamp}
	for k, v := range c.Totals {
		out.Totals[k] = v
	}
	out.Floors = maps.Clone(c.Floors)
	return out
}

// MergeFloors folds a write's counter floors into key's counter by
// pointwise maximum (a record of floors alone when the key has none yet:
// the increments they remove may arrive later).
func (b *Batch) MergeFloors(key string, f map[string]entry.PN, stamp entry.Stamp) (bool, error) {
	c, _, err := b.Counter(key)
	if err != nil {
		return false, err
	}
	prev, was := counterDigest(&b.digester, key, &c), c.Counts()
	if !c.MergeFloors(f) {
		return false, nil
	}
	if c.Stamp.Compare(stamp) < 0 {
		c.Stamp = stamp
	}
	if b.max.Compare(stamp) < 0 {
		b.max, b.maxOwn = stamp, false
	}
	return true, b.putCounter(key, &c, prev, was)
}

// putCounter writes a counter changed in the batch (prev its digest
// before, was whether it counted).
func (b *Batch) putCounter(key string, c *Counter, prev hashtree.Sum, was bool) error {
	ck := counterKey(key)
	if err := b.pb.Set(ck, appendCounter(nil, c), nil); err != nil {
		return err
	}
	b.s.ctrMu.Lock()
	if !b.s.ctrKeys.mayHold(ck) {
		b.s.ctrKeys.add(ck)
	}
	b.s.ctrMu.Unlock()
	b.moveLeafLocked(key, prev, counterDigest(&b.digester, key, c))
	if b.pendingCtr == nil {
		b.pendingCtr = map[string]*Counter{}
	}
	b.pendingCtr[key] = c
	return b.moveCounterLiveLocked(key, was, c.Counts())
}

// MergeCounter folds one cluster's totals into a counter by pointwise
// maximum. Applied if that changed anything; Duplicate otherwise (a delta
// delivered again).
func (b *Batch) MergeCounter(key, cluster string, t entry.PN, stamp entry.Stamp) (entry.Outcome, error) {
	c, _, err := b.Counter(key)
	if err != nil {
		return 0, err
	}
	cur := c.Totals[cluster]
	next := entry.PN{P: max(cur.P, t.P), N: max(cur.N, t.N)}
	if next == cur && c.Stamp.Compare(stamp) >= 0 {
		return entry.Duplicate, nil
	}
	prev, was := counterDigest(&b.digester, key, &c), c.Counts()
	if next != (entry.PN{}) {
		// Zero totals (a re-seed's carrier of floors alone) add no
		// component: two trees that agree hash alike.
		c.Totals[cluster] = next
	}
	if c.Stamp.Compare(stamp) < 0 {
		c.Stamp = stamp
	}
	if b.max.Compare(stamp) < 0 {
		b.max, b.maxOwn = stamp, false
	}
	if err := b.putCounter(key, &c, prev, was); err != nil {
		return 0, err
	}
	if next == cur {
		return entry.Duplicate, nil
	}
	return entry.Applied, nil
}

// appendCounterTotals encodes only the per-cluster totals, sorted: what two
// converged clusters agree on exactly. (The stamp, the counter's version, is
// left out: a re-seed relays totals, not the stamps of every delta.)
//
// Floors follow the totals after a zero byte (no component name is empty),
// only when there are some: a counter without floors hashes as before them.
func appendCounterTotals(dst []byte, c *Counter) []byte {
	dst = appendComponents(dst, c.Totals)
	if len(c.Floors) > 0 {
		dst = appendComponents(append(dst, 0), c.Floors)
	}
	return dst
}

func appendComponents(dst []byte, m map[string]entry.PN) []byte {
	for _, n := range slices.Sorted(maps.Keys(m)) {
		t := m[n]
		dst = append(dst, byte(len(n)))
		dst = append(dst, n...)
		dst = binary.BigEndian.AppendUint64(dst, t.P)
		dst = binary.BigEndian.AppendUint64(dst, t.N)
	}
	return dst
}

// appendCounterDigest frames a counter for the digest: its key and its
// totals (the stamp too, as for values).
func appendCounterDigest(dst, key []byte, raw []byte) []byte {
	dst = append(dst, 0xff) // counters after values, never mistaken for one
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = binary.AppendUvarint(dst, uint64(len(raw)))
	return append(dst, raw...)
}

func (s *Store) checkCounters() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixCounter}, UpperBound: []byte{prefixCounter + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	s.hasCounters.Store(it.First())
	return it.Error()
}

// mayHoldCounter reports whether key may hold a counter (ctrKeys).
func (s *Store) mayHoldCounter(key string) bool {
	s.ctrMu.RLock()
	defer s.ctrMu.RUnlock()
	return s.ctrKeys.mayHold(counterKey(key))
}

// HasCounters reports whether the tree may hold a counter; false means it
// certainly holds none, so plain writes skip the check.
func (s *Store) HasCounters() bool { return s.hasCounters.Load() }

// decodeStampHead reads the head a counter and an idempotency record start
// with, version(1) | hlc(12) | len(origin)(1) | origin, and checks that at
// least more bytes follow it. It returns the stamp and the rest, or what is
// wrong.
func decodeStampHead(b []byte, version byte, more int) (st entry.Stamp, rest []byte, what string) {
	if len(b) < 1+hlc.EncodedLen+1 || b[0] != version {
		return st, nil, "header"
	}
	ts, err := hlc.Decode(b[1 : 1+hlc.EncodedLen])
	if err != nil {
		return st, nil, err.Error()
	}
	b = b[1+hlc.EncodedLen:]
	n := int(b[0])
	if n == 0 || n > maxOriginLen || len(b) < 1+n+more {
		return st, nil, "origin"
	}
	return entry.Stamp{HLC: ts, Origin: string(b[1 : 1+n])}, b[1+n:], ""
}

// Read reads key as a reader sees it at wall time now (entry.Resolve): its
// plain record (held false when none; a tombstone is held) and its
// counter, as one.
func (s *Store) Read(key string, now int64) (v entry.View, r Record, held bool, err error) {
	r, err = s.Get(key)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return v, r, false, err
	default:
		held = true
	}
	var rp *Record
	if held {
		rp = &r
	}
	c, err := s.Counter(key)
	switch {
	case errors.Is(err, ErrNotFound):
		return entry.Resolve(rp, nil, now), r, held, nil
	case err != nil:
		return v, r, held, err
	}
	return entry.Resolve(rp, &c, now), r, held, nil
}
