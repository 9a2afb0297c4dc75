// Package byteindex answers how many bytes of a log lie after an index.
package byteindex

import (
	"sync"
)

// Index answers "how many bytes of WAL lie after index i" exactly, for
// backlog accounting (it decides throttling, so an estimate will not do: an
// average over a bulk load of large entries once made thirty one-byte writes
// read as a megabyte). It keeps the cumulative on-disk size through each
// retained entry: 8 bytes per entry, dropped as the WAL is truncated.
type Index struct {
	mu struct {
		sync.Mutex
		base uint64  // the index before the first entry kept
		cum  []int64 // cum[k]: bytes of entries base+1 .. base+1+k
		off  int64   // bytes of entries cut before base+1 (cum values include them)
	}
}

// Reset starts the index at base (the index before the first entry).
func (b *Index) Reset(base uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.base, b.mu.cum, b.mu.off = base, b.mu.cum[:0], 0
}

// Add records the next entry's size.
func (b *Index) Add(size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	last := b.mu.off
	if n := len(b.mu.cum); n > 0 {
		last = b.mu.cum[n-1]
	}
	b.mu.cum = append(b.mu.cum, last+int64(size))
}

// CutBefore forgets the entries before first.
func (b *Index) CutBefore(first uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if first <= b.mu.base+1 {
		return
	}
	drop := int(min(first-1-b.mu.base, uint64(len(b.mu.cum))))
	if drop > 0 {
		b.mu.off = b.mu.cum[drop-1]
		// Copy down once the dropped part dominates, so the backing array
		// does not grow without bound.
		if drop > len(b.mu.cum)/2 {
			b.mu.cum = append(b.mu.cum[:0], b.mu.cum[drop:]...)
		} else {
			b.mu.cum = b.mu.cum[drop:]
		}
	}
	b.mu.base = first - 1
}

// After returns the bytes of the entries after index i.
func (b *Index) After(i uint64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.mu.cum)
	if n == 0 {
		return 0
	}
	total := b.mu.cum[n-1]
	switch {
	case i <= b.mu.base:
		return total - b.mu.off
	case i >= b.mu.base+uint64(n):
		return 0
	}
	return total - b.mu.cum[i-b.mu.base-1]
}
