package store

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
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
// A key's plain record and its counter are read as one (entry.Resolve): a
// counter that counts reads as its decimal value.
func (s *Store) Scan(o ScanOptions) ([]Item, string, error) {
	limit := o.Limit
	if limit <= 0 {
		limit = DefaultScanLimit
	}
	if limit > MaxScanLimit {
		limit = MaxScanLimit
	}
	bounds := func(prefix byte) (lower, upper []byte) {
		key := func(k string) []byte { return append([]byte{prefix}, k...) }
		lower, upper = []byte{prefix}, []byte{prefix + 1}
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
			raise(key(o.Prefix))
			lessen(prefixEnd(key(o.Prefix)))
		}
		if o.Start != "" {
			raise(key(o.Start))
		}
		if o.End != "" {
			lessen(key(o.End))
		}
		if o.After != "" {
			raise(append(key(o.After), 0))
		}
		return lower, upper
	}
	lower, upper := bounds(prefixData)
	if bytes.Compare(lower, upper) >= 0 {
		return nil, "", nil
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, "", fmt.Errorf("store: scan: %w", err)
	}
	defer it.Close()
	var ct *pebble.Iterator
	if s.hasCounters.Load() {
		cl, cu := bounds(prefixCounter)
		if ct, err = s.db.NewIter(&pebble.IterOptions{LowerBound: cl, UpperBound: cu}); err != nil {
			return nil, "", fmt.Errorf("store: scan: %w", err)
		}
		defer ct.Close()
	}
	maxBytes := o.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultScanBytes
	}
	var items []Item
	size := 0
	dv, cv := it.First(), ct != nil && ct.First()
	for dv || cv {
		// The next key of either space; both when they name the same.
		var key []byte
		var rp *Record
		var cp *Counter
		switch {
		case dv && (!cv || bytes.Compare(it.Key()[1:], ct.Key()[1:]) <= 0):
			key = it.Key()[1:]
		default:
			key = ct.Key()[1:]
		}
		if dv && bytes.Equal(it.Key()[1:], key) {
			r, err := DecodeRecord(it.Value())
			if err != nil {
				return nil, "", fmt.Errorf("store: scan key %q: %w", key, err)
			}
			rp = &r
		}
		if cv && bytes.Equal(ct.Key()[1:], key) {
			c, err := DecodeCounter(ct.Value())
			if err != nil {
				return nil, "", fmt.Errorf("store: scan counter %q: %w", key, err)
			}
			cp = &c
		}
		item := Item{Key: string(key)}
		present := false
		if cp == nil {
			present = !rp.Tombstone && (o.Now == 0 || !rp.Expired(o.Now))
			item.Record = *rp
		} else {
			v := entry.Resolve(rp, cp, o.Now)
			present = v.Present
			item.Record = Record{Value: v.Value, Stamp: v.Version, Expires: v.Expires}
			if v.Counted {
				item.Record.Kind = KindCounter
			} else if rp != nil {
				item.Record = *rp
			}
		}
		if rp != nil {
			dv = it.Next()
		}
		if cp != nil {
			cv = ct.Next()
		}
		if !present {
			continue
		}
		if len(items) == limit || (len(items) > 0 && size+len(key)+1+len(item.Record.Value) > maxBytes) {
			return items, items[len(items)-1].Key, errors.Join(it.Error(), iterErr(ct))
		}
		size += len(key) + 1 + len(item.Record.Value)
		item.Record.Value = bytes.Clone(item.Record.Value)
		items = append(items, item)
	}
	return items, "", errors.Join(it.Error(), iterErr(ct))
}

func iterErr(it *pebble.Iterator) error {
	if it == nil {
		return nil
	}
	return it.Error()
}
