package store

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/api"
)

// ScanOptions, Item and the page bounds are the contract's words
// (package api).
type (
	ScanOptions = api.ScanOptions
	Item        = api.Item
)

const (
	DefaultScanLimit = api.DefaultScanLimit
	MaxScanLimit     = api.MaxScanLimit
	DefaultScanBytes = api.DefaultScanBytes
)

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
		if r.Tombstone || (o.Now != 0 && r.Expired(o.Now)) {
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
