package store

import (
	"hash/maphash"
)

// seenKeys is a Bloom filter of every key the tree ever held a record of,
// kept in memory: a tracked merge (Track) of a key it has never seen needs
// no read. That is every local write of a fresh key, and every replicated
// one at its peers: without it each was a negative lookup in Pebble, whose
// filter blocks kept missing a block cache busy with data (one-way writes
// of fresh keys cost 38 % more at format 4; docs/PERFORMANCE.md "The
// conflict log").
//
// A key it says no to has no record: it has no false negatives, because it
// is built by a scan of the data keys when the store opens and when
// ReplaceFrom swaps the tree, and every record a batch writes goes through
// setRecordLocked, which adds its key before the batch commits (a batch that
// then fails leaves a key too many: a read, never a wrong answer). It only
// grows: a key whose record goes (a collected tombstone, a backfill removal)
// stays in, again only a read.
//
// It is a split-block Bloom filter (Putze et al. 2007, as Parquet's): a
// key's bits all sit in one 32-byte block, so a lookup costs one cache miss
// per part, where a classic filter's probes cost one each. It grows without
// a rescan as a scalable Bloom filter (Almeida et al. 2007): when its newest
// part holds its capacity, a part of twice the capacity is added, and a key
// may be in any part. Guarded by the store's applyMu.
type seenKeys struct {
	seed  maphash.Seed
	parts []*bloomPart
}

// bloomPart is one fixed-size split-block filter of seenKeys.
type bloomPart struct {
	blocks   [][8]uint32
	n, limit int // keys added; keys it is sized for
}

const (
	// seenBitsPerKey gives each part about a 1 % false-positive rate with
	// a key's 8 bits in one block.
	seenBitsPerKey = 12
	// seenMinKeys is the first part's size at least (1.5 MiB of bits):
	// a tree's first million keys fit it.
	seenMinKeys = 1 << 20
)

// blockSalt are the odd constants of Parquet's split-block filter: each
// derives one bit of a block's 8 words from a key's hash.
var blockSalt = [8]uint32{0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31}

// newSeenKeys is an empty filter sized for about n keys.
func newSeenKeys(n int) *seenKeys {
	f := &seenKeys{seed: maphash.MakeSeed()}
	f.grow(max(n, seenMinKeys))
	return f
}

// grow adds a part sized for at least n keys.
func (f *seenKeys) grow(n int) {
	blocks := (n*seenBitsPerKey + 255) / 256
	f.parts = append(f.parts, &bloomPart{blocks: make([][8]uint32, blocks), limit: blocks * 256 / seenBitsPerKey})
}

// add records key. A nil filter (a tree being replaced) records nothing.
func (f *seenKeys) add(key []byte) {
	if f != nil {
		f.addHash(maphash.Bytes(f.seed, key))
	}
}

func (f *seenKeys) addHash(h uint64) {
	p := f.parts[len(f.parts)-1]
	if p.n >= p.limit {
		f.grow(2 * p.limit)
		p = f.parts[len(f.parts)-1]
	}
	blk := &p.blocks[(h>>32)*uint64(len(p.blocks))>>32]
	x := uint32(h)
	for i := range blk {
		blk[i] |= 1 << ((x * blockSalt[i]) >> 27)
	}
	p.n++
}

// mayHold reports whether key may have been added; false is certain. A nil
// filter (a tree being replaced) may hold every key.
func (f *seenKeys) mayHold(key []byte) bool {
	if f == nil {
		return true
	}
	h := maphash.Bytes(f.seed, key)
	x := uint32(h)
parts:
	for _, p := range f.parts {
		blk := &p.blocks[(h>>32)*uint64(len(p.blocks))>>32]
		for i := range blk {
			if blk[i]&(1<<((x*blockSalt[i])>>27)) == 0 {
				continue parts
			}
		}
		return true
	}
	return false
}

// seenScan gathers the hashes of the data keys of one pass over a tree (8
// bytes a key, for the pass only), so that the filter's first part is
// sized for twice as many keys as the tree holds, and the writes after it
// fit for a while.
type seenScan struct {
	seed   maphash.Seed
	hashes []uint64
	// counters: the scan notes the counter keys (Store.ctrKeys), not the
	// data keys.
	counters bool
}

// see notes key if it is a data key (a counter key, for a counters scan).
func (sc *seenScan) see(key []byte) {
	want := byte(prefixData)
	if sc.counters {
		want = prefixCounter
	}
	if len(key) == 0 || key[0] != want {
		return
	}
	if sc.hashes == nil {
		sc.seed = maphash.MakeSeed()
	}
	sc.hashes = append(sc.hashes, maphash.Bytes(sc.seed, key))
}

// filter is the filter of the keys seen.
func (sc *seenScan) filter() *seenKeys {
	if sc.hashes == nil {
		sc.seed = maphash.MakeSeed()
	}
	f := &seenKeys{seed: sc.seed}
	f.grow(max(2*len(sc.hashes), seenMinKeys))
	for _, h := range sc.hashes {
		f.addHash(h)
	}
	return f
}
