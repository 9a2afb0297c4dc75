package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Digest summarises the live state.
type Digest struct {
	// Hash is the hex SHA-256 over every live key in order with its value,
	// kind and stamp. Two stores have equal hashes exactly when they hold
	// the same live data (up to SHA-256 collisions).
	Hash string
	// Keys is the number of live keys.
	Keys int
	// Tombstones is the number of tombstones not yet collected. It is not in
	// the hash: clusters collect tombstones at different times.
	Tombstones int
	// Counters is the number of PN-counters (in the hash by their totals).
	Counters int
}

// Digest hashes the live state from one consistent snapshot.
func (s *Store) Digest() (Digest, error) { return s.DigestPrefixes(nil) }

// DigestPrefixes hashes the live keys under any of prefixes (every key when
// none), and the counters under them: two clusters agree on what a link's
// filter lets cross when their digests of its include prefixes are equal.
func (s *Store) DigestPrefixes(prefixes []string) (Digest, error) {
	return DigestOf([]*Store{s}, prefixes)
}

// DigestOf hashes the live keys of several stores that hold disjoint keys
// (a cluster's raft groups, issue 51) as one store holding them all would:
// a cluster of several groups and one of a single group that hold the same
// data have equal digests. Each store is read from a snapshot of its own.
func DigestOf(stores []*Store, prefixes []string) (Digest, error) {
	under := func(k []byte) bool {
		if len(prefixes) == 0 {
			return true
		}
		for _, p := range prefixes {
			if bytes.HasPrefix(k, []byte(p)) {
				return true
			}
		}
		return false
	}
	h := sha256.New()
	var d Digest
	var scratch []byte
	err := visitMerged(stores, prefixData, func(key, value []byte) error {
		if !under(key) {
			return nil
		}
		r, err := DecodeRecord(value)
		if err != nil {
			return fmt.Errorf("store: digest key %q: %w", key, err)
		}
		if r.Tombstone {
			d.Tombstones++
			return nil
		}
		d.Keys++
		scratch = appendDigestEntry(scratch[:0], key, &r)
		h.Write(scratch)
		return nil
	})
	if err != nil {
		return Digest{}, err
	}
	// Counters by their per-cluster totals (canonical bytes: sorted).
	err = visitMerged(stores, prefixCounter, func(key, value []byte) error {
		if !under(key) {
			return nil
		}
		c, err := DecodeCounter(value)
		if err != nil {
			return fmt.Errorf("store: digest counter %q: %w", key, err)
		}
		if !c.Counts() {
			return nil // deleted (its floors remove every increment), as a tombstone
		}
		d.Counters++
		scratch = appendCounterDigest(scratch[:0], key, appendCounterTotals(nil, &c))
		h.Write(scratch)
		return nil
	})
	if err != nil {
		return Digest{}, err
	}
	d.Hash = hex.EncodeToString(h.Sum(nil))
	return d, nil
}

// visitMerged calls f with each key (without its prefix byte) and value of
// the space prefix of every store, in key order across the stores, each
// store read from a snapshot of its own.
func visitMerged(stores []*Store, prefix byte, f func(key, value []byte) error) error {
	its := make([]*pebble.Iterator, 0, len(stores))
	defer func() {
		for _, it := range its {
			it.Close()
		}
	}()
	var live []*pebble.Iterator
	for _, s := range stores {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
		if err != nil {
			return fmt.Errorf("store: digest: %w", err)
		}
		its = append(its, it)
		if it.First() {
			live = append(live, it)
		} else if err := it.Error(); err != nil {
			return fmt.Errorf("store: digest: %w", err)
		}
	}
	for len(live) > 0 {
		least := 0
		for i := 1; i < len(live); i++ { // a few groups: a heap would not pay
			if bytes.Compare(live[i].Key(), live[least].Key()) < 0 {
				least = i
			}
		}
		it := live[least]
		if err := f(it.Key()[1:], it.Value()); err != nil {
			return err
		}
		if !it.Next() {
			if err := it.Error(); err != nil {
				return fmt.Errorf("store: digest: %w", err)
			}
			live = append(live[:least], live[least+1:]...)
		}
	}
	return nil
}

// appendDigestEntry frames one live key unambiguously (lengths before bytes).
func appendDigestEntry(dst, key []byte, r *Record) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = append(dst, byte(r.Kind))
	dst = r.Stamp.HLC.AppendTo(dst)
	dst = binary.AppendUvarint(dst, uint64(len(r.Stamp.Origin)))
	dst = append(dst, r.Stamp.Origin...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
	dst = append(dst, r.Value...)
	if r.Expires != 0 {
		// The digest of a version without one is as before.
		dst = append(dst, 'x')
		dst = binary.BigEndian.AppendUint64(dst, uint64(r.Expires))
	}
	return dst
}
