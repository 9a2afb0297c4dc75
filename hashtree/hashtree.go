// Package hashtree is anti-entropy's tree of hashes (issue 30): which leaf a
// key falls in, the digest of a live version, and how leaves combine into
// the levels above them. It is part of the protocol between clusters, at
// Version: two clusters compare trees only when they compute them alike, so
// nothing here may change without a new Version.
//
// A leaf's hash is the sum, lane by lane modulo 2^64, of the digests of the
// live versions of its keys: a multiset hash, so a leaf is kept as data
// changes by subtracting the old version's digest and adding the new one,
// in any order, and an interior node is the sum of its children. Equal sums
// mean equal sets of versions, up to 128-bit collisions of a
// non-cryptographic hash: the clusters trust each other (a link is
// authenticated), so the hash guards against accidents (a lost write, a
// flipped bit, a bug), not against an adversary choosing keys. SHA-256
// would cost three times xxhash's 60 ns per 150-byte version on the project
// machine, on every write.
package hashtree

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/replicator/replicator/entry"
)

// Version is the protocol version of the leaf function, the digest and the
// levels.
const Version = 1

const (
	// LeafBits is log2 of the number of leaves.
	//
	// 2^20 leaves (16 MiB of sums a store keeps in memory): at 10,000,000
	// keys a leaf holds about 10, so the keys a comparison lists for a
	// divergent key are about 10 too, whatever the tree's size up to
	// there. 2^16 leaves (1 MiB) held 150 a leaf at that size, and a
	// thousand divergent keys cost some 11 MB of key lists on the wire.
	LeafBits = 20
	// Leaves is the number of leaves: 1,048,576 sums of 16 bytes, 16 MiB.
	Leaves = 1 << LeafBits
	// FanoutBits is log2 of the children of an interior node.
	FanoutBits = 4
	// Depth is the number of levels above the leaves (the root is level 0,
	// the leaves level Depth).
	Depth = LeafBits / FanoutBits
)

// Sum is a multiset hash: the lane-wise sum of version digests.
type Sum struct{ A, B uint64 }

// Add is the sum of s and t (the union of their sets).
func (s Sum) Add(t Sum) Sum { return Sum{s.A + t.A, s.B + t.B} }

// Sub is s without t (t's set removed from s's).
func (s Sum) Sub(t Sum) Sum { return Sum{s.A - t.A, s.B - t.B} }

// IsZero reports whether s is the sum of no version.
func (s Sum) IsZero() bool { return s == Sum{} }

// String is the sum in hex, A then B.
func (s Sum) String() string { return fmt.Sprintf("%016x%016x", s.A, s.B) }

// SumLen is the length of AppendTo's output.
const SumLen = 16

// AppendTo appends s's 16 bytes (big-endian A, then B).
func (s Sum) AppendTo(b []byte) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(b, s.A), s.B)
}

// DecodeSum reads AppendTo's output.
func DecodeSum(b []byte) (Sum, error) {
	if len(b) != SumLen {
		return Sum{}, fmt.Errorf("hashtree: a sum of %d bytes (want %d)", len(b), SumLen)
	}
	return Sum{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}, nil
}

// Leaf is the leaf key falls in: the top LeafBits of its xxhash64, so keys
// spread evenly whatever their prefixes.
func Leaf(key string) int { return int(xxhash.Sum64String(key) >> (64 - LeafBits)) }

// ValueHash is the hash of a version's value that its digest covers (and
// that a diff may exchange instead of the value).
func ValueHash(v []byte) uint64 { return xxhash.Sum64(v) }

// Digester computes version digests with one reused buffer. Not safe for
// concurrent use.
type Digester struct{ buf []byte }

// Digest is the digest of a live version of key: its stamp (origin
// included), its kind (a plain value or a counter's, as the store keeps
// them) and its value's hash. Two lanes of xxhash64 over the same bytes,
// told apart by a leading byte.
func (d *Digester) Digest(key string, st entry.Stamp, kind byte, valueHash uint64) Sum {
	b := append(d.buf[:0], 0)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	enc := st.HLC.Encode()
	b = append(b, enc[:]...)
	b = binary.AppendUvarint(b, uint64(len(st.Origin)))
	b = append(b, st.Origin...)
	b = append(b, kind)
	b = binary.BigEndian.AppendUint64(b, valueHash)
	d.buf = b
	s := Sum{A: xxhash.Sum64(b)}
	b[0] = 1
	s.B = xxhash.Sum64(b)
	return s
}

// Levels derives the interior levels from the leaves: out[0] is the root
// (one sum), out[i] has Fanout^i sums, and out[Depth] is leaves itself.
func Levels(leaves []Sum) ([][]Sum, error) {
	if len(leaves) != Leaves {
		return nil, fmt.Errorf("hashtree: %d leaves (want %d)", len(leaves), Leaves)
	}
	out := make([][]Sum, Depth+1)
	out[Depth] = leaves
	for l := Depth - 1; l >= 0; l-- {
		below := out[l+1]
		lv := make([]Sum, len(below)>>FanoutBits)
		for i := range lv {
			for _, s := range below[i<<FanoutBits : (i+1)<<FanoutBits] {
				lv[i] = lv[i].Add(s)
			}
		}
		out[l] = lv
	}
	return out, nil
}

// Children are the indexes, one level down, of node i's children.
func Children(i int) (first, end int) { return i << FanoutBits, (i + 1) << FanoutBits }
