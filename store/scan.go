package store

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// ScanOptions selects an ordered range of live keys. Prefix, Start/End and
// After combine (all must hold). Limit 0 means DefaultScanLimit.
type ScanOptions struct {
	Prefix string
	Start  string // inclusive
	End    string // exclusive; "" = no upper bound
	After  string // resume strictly after this key (a previous page's Next)
	Limit  int
	// MaxBytes bounds the keys and values of one page (at least one item
	// is returned); 0 means DefaultScanBytes.
	MaxBytes int
}

// DefaultScanLimit and MaxScanLimit bound one page in items,
// DefaultScanBytes in bytes (10,000 values of 1 MiB are not one answer).
const (
	DefaultScanLimit = 100
	MaxScanLimit     = 10000
	DefaultScanBytes = 4 << 20
)

// Item is one live key of a scan.
type Item struct {
	Key string
	Record
}

// Scan returns up to Limit live keys in order, and the key to resume after
// when more remain ("" when the range is exhausted). Tombstones are skipped.
func (s *Store) Scan(o ScanOptions) ([]Item, string, error) {
	limit := o.Limit
	if limit <= 0 {
		limit = DefaultScanLimit
	}
	if limit > MaxScanLimit {
		limit = MaxScanLimit
	}
	lower := []byte{prefixData}
	upper := []byte{prefixData + 1}
	raise := func(k []byte) {
		if bytes.Compare(k, lower) > 0 {
			lower = k
		}
	}
	lessen := func(k []byte) {
		if k != nil && bytes.Compare(k, upper) < 0 {
			upper = k
		}
	}
	if o.Prefix != "" {
		raise(dataKey(o.Prefix))
		lessen(prefixEnd(dataKey(o.Prefix)))
	}
	if o.Start != "" {
		raise(dataKey(o.Start))
	}
	if o.End != "" {
		lessen(dataKey(o.End))
	}
	if o.After != "" {
		raise(append(dataKey(o.After), 0))
	}
	if bytes.Compare(lower, upper) >= 0 {
		return nil, "", nil
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, "", fmt.Errorf("store: scan: %w", err)
	}
	defer it.Close()
	maxBytes := o.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultScanBytes
	}
	var items []Item
	size := 0
	for valid := it.First(); valid; valid = it.Next() {
		r, err := DecodeRecord(it.Value())
		if err != nil {
			return nil, "", fmt.Errorf("store: scan key %q: %w", it.Key()[1:], err)
		}
		if r.Tombstone {
			continue
		}
		if len(items) == limit || (len(items) > 0 && size+len(it.Key())+len(r.Value) > maxBytes) {
			return items, items[len(items)-1].Key, it.Error()
		}
		size += len(it.Key()) + len(r.Value)
		r.Value = bytes.Clone(r.Value)
		items = append(items, Item{Key: string(it.Key()[1:]), Record: r})
	}
	return items, "", it.Error()
}
