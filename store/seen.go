package store

import (
	"errors"
	"fmt"
	"hash/maphash"

	"github.com/cockroachdb/pebble/v2"
)

// seenKeys is a Bloom filter of every key the tree ever held a record of,
// kept in memory: a tracked merge (Track) of a key it has never seen, stamped
// above everything stored, needs no read. That is every local write of a
// fresh key, and every replicated one at its peers: without it each was a
// negative lookup in Pebble, whose filter blocks kept missing a block cache
// busy with data (one-way writes of fresh keys cost 38 % more at format 4;
// docs/PERFORMANCE.md "The conflict log").
//
// It only grows: a key whose record goes (a collected tombstone, a backfill
// removal) stays in, which costs a read, never a wrong answer. It is built
// by a scan of the data keys when the store opens and when ReplaceFrom
// swaps the tree, and every record a batch writes adds its key before the
// batch commits (a batch that then fails leaves a key too many, again only
// a read). A key it misses would cost the conflict log, not the data:
// the blind path is taken only above the tree's max stamp, where
// last-writer-wins needs no read anyway (store.Batch.Merge).
//
// It grows without a rescan as a scalable Bloom filter (Almeida et al.
// 2007): when its newest part holds its capacity, a part of twice the
// capacity is added, and a key may be in any part. Guarded by the store's
// applyMu.
type seenKeys struct {
	seed  maphash.Seed
	parts []*bloomPart
}

// bloomPart is one fixed-size Bloom filter of seenKeys.
type bloomPart struct {
	bits     []uint64
	mask     uint64 // len(bits)*64 - 1: the size is a power of two
	n, limit int    // keys added; keys it is sized for
}

const (
	// seenBitsPerKey gives each part about a 1 % false-positive rate with
	// seenProbes probes.
	seenBitsPerKey = 10
	seenProbes     = 7
	// seenMinKeys is the first part's size at least (160 KiB of bits).
	seenMinKeys = 1 << 17
)

// newSeenKeys is an empty filter sized for about n keys.
func newSeenKeys(n int) *seenKeys {
	f := &seenKeys{seed: maphash.MakeSeed()}
	f.grow(n)
	return f
}

// grow adds a part sized for at least n keys.
func (f *seenKeys) grow(n int) {
	n = max(n, seenMinKeys)
	words := 1
	for words*64 < n*seenBitsPerKey {
		words <<= 1
	}
	f.parts = append(f.parts, &bloomPart{bits: make([]uint64, words), mask: uint64(words*64 - 1), limit: words * 64 / seenBitsPerKey})
}

// add records key.
func (f *seenKeys) add(key []byte) { f.addHash(maphash.Bytes(f.seed, key)) }

func (f *seenKeys) addHash(h uint64) {
	p := f.parts[len(f.parts)-1]
	if p.n >= p.limit {
		f.grow(2 * p.limit)
		p = f.parts[len(f.parts)-1]
	}
	h1, h2 := h, h>>33|h<<31|1
	for i := 0; i < seenProbes; i++ {
		bit := h1 & p.mask
		p.bits[bit>>6] |= 1 << (bit & 63)
		h1 += h2
	}
	p.n++
}

// mayHold reports whether key may have been added; false is certain.
func (f *seenKeys) mayHold(key []byte) bool {
	h := maphash.Bytes(f.seed, key)
	h2 := h>>33 | h<<31 | 1
parts:
	for _, p := range f.parts {
		h1 := h
		for i := 0; i < seenProbes; i++ {
			bit := h1 & p.mask
			if p.bits[bit>>6]&(1<<(bit&63)) == 0 {
				continue parts
			}
			h1 += h2
		}
		return true
	}
	return false
}

// Bytes is the memory the filter holds.
func (f *seenKeys) Bytes() int {
	n := 0
	for _, p := range f.parts {
		n += 8 * len(p.bits)
	}
	return n
}

// scanSeenKeys builds the filter of every data key db holds: one pass over
// the keys (about a second per few million), holding their hashes (8 bytes
// a key, for the pass only) so that the first part is sized for twice as
// many keys as the tree holds, and the writes after it fit for a while.
func scanSeenKeys(db pebble.Reader) (*seenKeys, error) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return nil, fmt.Errorf("store: scan keys: %w", err)
	}
	seed := maphash.MakeSeed()
	var hashes []uint64
	for valid := it.First(); valid; valid = it.Next() {
		hashes = append(hashes, maphash.Bytes(seed, it.Key()))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, fmt.Errorf("store: scan keys: %w", err)
	}
	f := &seenKeys{seed: seed}
	f.grow(2 * len(hashes))
	for _, h := range hashes {
		f.addHash(h)
	}
	return f, nil
}
