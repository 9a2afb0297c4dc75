package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// Idempotency records live in key space i, with an expiry index in x
// (keys.go).
const (
	idemVersion = 1
)

// IdemRecord is what an Idempotency-Key answered (api.IdemRecord).
type IdemRecord = api.IdemRecord

// appendIdem encodes: version(1) | hlc(12) | len(origin)(1) | origin |
// expires(8) | status(2) | len(fp)(1) | fp | body
func appendIdem(dst []byte, r *IdemRecord) []byte {
	dst = append(dst, idemVersion)
	dst = r.Stamp.HLC.AppendTo(dst)
	dst = append(dst, byte(len(r.Stamp.Origin)))
	dst = append(dst, r.Stamp.Origin...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Expires))
	dst = binary.BigEndian.AppendUint16(dst, uint16(r.Status))
	dst = append(dst, byte(len(r.Fingerprint)))
	dst = append(dst, r.Fingerprint...)
	return append(dst, r.Body...)
}

// DecodeIdem parses a stored idempotency record.
func DecodeIdem(key string, b []byte) (IdemRecord, error) {
	r := IdemRecord{Key: key}
	bad := func(what string) (IdemRecord, error) {
		return IdemRecord{}, fmt.Errorf("%w: idempotency record %q: %s", ErrCorrupt, key, what)
	}
	st, b, what := decodeStampHead(b, idemVersion, 8+2+1)
	if what != "" {
		return bad(what)
	}
	r.Stamp = st
	r.Expires = int64(binary.BigEndian.Uint64(b))
	r.Status = int(binary.BigEndian.Uint16(b[8:]))
	fl := int(b[10])
	if len(b) < 11+fl {
		return bad("fingerprint")
	}
	r.Fingerprint = bytes.Clone(b[11 : 11+fl])
	r.Body = bytes.Clone(b[11+fl:])
	return r, nil
}

// Idem returns the record of an idempotency key (ok false when none).
func (s *Store) Idem(key string) (IdemRecord, bool, error) {
	v, closer, err := s.db.Get(idemKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return IdemRecord{}, false, nil
	}
	if err != nil {
		return IdemRecord{}, false, fmt.Errorf("store: read idempotency record: %w", err)
	}
	defer closer.Close()
	r, err := DecodeIdem(key, v)
	return r, err == nil, err
}

// MergeIdem stores r unless the key holds a record of a higher stamp.
func (b *Batch) MergeIdem(r *IdemRecord) (entry.Outcome, error) {
	k := idemKey(r.Key)
	cur, found := b.pendingIdem[r.Key]
	if !found {
		v, closer, err := b.s.db.Get(k)
		switch {
		case errors.Is(err, pebble.ErrNotFound):
		case err != nil:
			return 0, err
		default:
			c, derr := DecodeIdem(r.Key, v)
			closer.Close()
			if derr != nil {
				return 0, derr
			}
			cur, found = &c, true
		}
	}
	if found {
		switch c := r.Stamp.Compare(cur.Stamp); {
		case c == 0:
			return entry.Duplicate, nil
		case c < 0:
			return entry.Stale, nil
		}
		if err := b.pb.Delete(idemExpiryKey(cur.Expires, r.Key), nil); err != nil {
			return 0, err
		}
	}
	if err := b.pb.Set(k, appendIdem(nil, r), nil); err != nil {
		return 0, err
	}
	if err := b.pb.Set(idemExpiryKey(r.Expires, r.Key), nil, nil); err != nil {
		return 0, err
	}
	if b.pendingIdem == nil {
		b.pendingIdem = map[string]*IdemRecord{}
	}
	b.pendingIdem[r.Key] = r
	return entry.Applied, nil
}

// CollectIdem removes records expired before now (at most max per call).
func (s *Store) CollectIdem(now int64, max int) (int, error) {
	b := s.NewBatch()
	defer b.Close()
	n, err := b.CollectIdem(now, max)
	if err != nil {
		return n, err
	}
	return n, b.Commit(false)
}

// CollectIdem is Store.CollectIdem in the batch (a command of the cluster's
// log: every node collects the same).
func (b *Batch) CollectIdem(now int64, max int) (int, error) {
	if max <= 0 {
		max = 10000
	}
	upper := idemExpiryKey(now, "")
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixIdemExpiry}, UpperBound: upper})
	if err != nil {
		return 0, err
	}
	n := 0
	for valid := it.First(); valid && n < max; valid = it.Next() {
		ik := bytes.Clone(it.Key())
		key := string(ik[9:])
		if err := b.pb.Delete(ik, nil); err != nil {
			it.Close()
			return n, err
		}
		if err := b.pb.Delete(idemKey(key), nil); err != nil {
			it.Close()
			return n, err
		}
		n++
	}
	return n, it.Close()
}
