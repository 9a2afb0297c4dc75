package wal

import (
	"sort"
	"sync"
)

// markEvery is the spacing of the byte index's marks: 2,000,000 entries
// cost ~2,000 marks (32 KiB), not a size per entry.
const markEvery = 1024

// byteIndex answers "how many bytes of WAL lie after index i" for backlog
// accounting, from sparse marks of cumulative on-disk size.
type byteIndex struct {
	mu struct {
		sync.Mutex
		marks []byteMark // ascending; marks[0] is at or before First-1
		cum   int64      // cumulative bytes through last
		last  uint64
	}
}

type byteMark struct {
	index uint64
	cum   int64 // cumulative bytes of every entry up to and including index
}

// reset starts the index at base (the index before the first entry).
func (b *byteIndex) reset(base uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.marks = append(b.mu.marks[:0], byteMark{index: base})
	b.mu.cum, b.mu.last = 0, base
}

// add records the next entry's size.
func (b *byteIndex) add(size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.last++
	b.mu.cum += int64(size)
	if b.mu.last%markEvery == 0 {
		b.mu.marks = append(b.mu.marks, byteMark{index: b.mu.last, cum: b.mu.cum})
	}
}

// cutBefore forgets marks no longer needed once entries before first are
// gone; it keeps the last mark at or before first-1.
func (b *byteIndex) cutBefore(first uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.mu.marks
	i := sort.Search(len(m), func(i int) bool { return m[i].index > first-1 }) - 1
	if i > 0 {
		b.mu.marks = append(m[:0], m[i:]...)
	}
}

// after estimates the bytes of the entries after index i: exact at marks,
// interpolated between them.
func (b *byteIndex) after(i uint64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i >= b.mu.last {
		return 0
	}
	m := b.mu.marks
	j := sort.Search(len(m), func(j int) bool { return m[j].index > i }) - 1
	if j < 0 {
		return b.mu.cum
	}
	lo := m[j]
	hiIdx, hiCum := b.mu.last, b.mu.cum
	if j+1 < len(m) {
		hiIdx, hiCum = m[j+1].index, m[j+1].cum
	}
	at := lo.cum
	if hiIdx > lo.index {
		at += (hiCum - lo.cum) * int64(i-lo.index) / int64(hiIdx-lo.index)
	}
	return b.mu.cum - at
}
