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
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	defer it.Close()
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
	for valid := it.First(); valid; valid = it.Next() {
		if !under(it.Key()[1:]) {
			continue
		}
		r, err := DecodeRecord(it.Value())
		if err != nil {
			return Digest{}, fmt.Errorf("store: digest key %q: %w", it.Key()[1:], err)
		}
		if r.Tombstone {
			d.Tombstones++
			continue
		}
		d.Keys++
		scratch = appendDigestEntry(scratch[:0], it.Key()[1:], &r)
		h.Write(scratch)
	}
	if err := it.Error(); err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	// Counters by their per-cluster totals (canonical bytes: sorted).
	cit, err := it.Clone(pebble.CloneOptions{IterOptions: &pebble.IterOptions{LowerBound: []byte{prefixCounter}, UpperBound: []byte{prefixCounter + 1}}})
	if err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	defer cit.Close()
	for valid := cit.First(); valid; valid = cit.Next() {
		if !under(cit.Key()[1:]) {
			continue
		}
		c, err := DecodeCounter(cit.Value())
		if err != nil {
			return Digest{}, fmt.Errorf("store: digest counter %q: %w", cit.Key()[1:], err)
		}
		if !c.Counts() {
			continue // deleted (its floors remove every increment), as a tombstone
		}
		d.Counters++
		scratch = appendCounterDigest(scratch[:0], cit.Key()[1:], appendCounterTotals(nil, &c))
		h.Write(scratch)
	}
	if err := cit.Error(); err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	d.Hash = hex.EncodeToString(h.Sum(nil))
	return d, nil
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
