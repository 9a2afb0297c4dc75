package store

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// The conflict log: records the machine writes in the batch of the apply
// that discarded a version (entry.Conflict), by key, by time and by ID.
//
//	X<key>\x00<id:16>   the record (JSON, conflictJSON)
//	Y<at:12><id:16>     the record's key: time index, for since and retention
//	W<id:16>            the record's key: ID index, for restore

type conflictJSON struct {
	Key            string        `json:"k"`
	Loser          string        `json:"l"`
	Winner         string        `json:"w"`
	LoserTombstone bool          `json:"lt,omitempty"`
	LoserValue     []byte        `json:"lv,omitempty"`
	LoserLen       int           `json:"ll"`
	LoserHash      []byte        `json:"lh,omitempty"`
	Incoming       bool          `json:"in,omitempty"`
	Peer           string        `json:"p,omitempty"`
	At             hlc.Timestamp `json:"at"`
	Possible       bool          `json:"pos,omitempty"`
	Restored       string        `json:"r,omitempty"`
	LoserExpires   int64         `json:"lx,omitempty"`
	Aliases        []string      `json:"al,omitempty"`
}

func conflictIDBytes(id string) ([]byte, error) {
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != 16 {
		return nil, fmt.Errorf("store: conflict id %q: want 32 hex digits", id)
	}
	return b, nil
}

func conflictKey(key string, id []byte) []byte {
	k := make([]byte, 0, 2+len(key)+16)
	k = append(k, prefixConflict)
	k = append(k, key...)
	k = append(k, 0)
	return append(k, id...)
}

func conflictTimeKey(at hlc.Timestamp, id []byte) []byte {
	k := append([]byte{prefixConflictTime}, at.AppendTo(nil)...)
	return append(k, id...)
}

func conflictIDKey(id []byte) []byte { return append([]byte{prefixConflictID}, id...) }

func encodeConflict(c *entry.Conflict) []byte {
	j := conflictJSON{Key: c.Key, Loser: c.Loser.String(), Winner: c.Winner.String(), LoserTombstone: c.LoserTombstone,
		LoserValue: c.LoserValue, LoserLen: c.LoserLen, LoserHash: c.LoserHash, Incoming: c.Incoming, Peer: c.Peer,
		At: c.At, Possible: c.Possible, LoserExpires: c.LoserExpires, Aliases: c.Aliases}
	if c.Restored.Origin != "" {
		j.Restored = c.Restored.String()
	}
	b, _ := json.Marshal(&j) // nothing in it can fail to encode
	return b
}

func decodeConflict(id []byte, v []byte) (entry.Conflict, error) {
	var j conflictJSON
	if err := json.Unmarshal(v, &j); err != nil {
		return entry.Conflict{}, fmt.Errorf("%w: conflict %x: %v", ErrCorrupt, id, err)
	}
	c := entry.Conflict{ID: hex.EncodeToString(id), Key: j.Key, LoserTombstone: j.LoserTombstone, LoserValue: j.LoserValue,
		LoserLen: j.LoserLen, LoserHash: j.LoserHash, Incoming: j.Incoming, Peer: j.Peer, At: j.At, Possible: j.Possible,
		LoserExpires: j.LoserExpires, Aliases: j.Aliases}
	var err error
	if c.Loser, err = entry.ParseStamp(j.Loser); err != nil {
		return c, fmt.Errorf("%w: conflict %x: %v", ErrCorrupt, id, err)
	}
	if c.Winner, err = entry.ParseStamp(j.Winner); err != nil {
		return c, fmt.Errorf("%w: conflict %x: %v", ErrCorrupt, id, err)
	}
	if j.Restored != "" {
		if c.Restored, err = entry.ParseStamp(j.Restored); err != nil {
			return c, fmt.Errorf("%w: conflict %x: %v", ErrCorrupt, id, err)
		}
	}
	return c, nil
}

// ConflictsOf lists the records of key as this batch sees them: committed,
// and this batch's own additions and removals.
func (b *Batch) ConflictsOf(key string) ([]entry.Conflict, error) {
	out, err := conflictsOf(b.s.db, key)
	if err != nil {
		return nil, err
	}
	pend := b.pendingConflicts[key]
	if len(pend) == 0 {
		return out, nil
	}
	keep := out[:0]
	for _, c := range out {
		if _, touched := pend[c.ID]; !touched {
			keep = append(keep, c)
		}
	}
	for _, c := range pend {
		if c != nil {
			keep = append(keep, *c)
		}
	}
	return keep, nil
}

func conflictsOf(r pebble.Reader, key string) ([]entry.Conflict, error) {
	prefix := conflictKey(key, nil)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []entry.Conflict
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+16 {
			continue // a longer key that shares the prefix
		}
		c, err := decodeConflict(k[len(prefix):], it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, it.Error()
}

// PutConflict writes a record, unless one of the same ID is already there
// (a redelivered discard logs nothing twice). It reports whether it wrote.
func (b *Batch) PutConflict(c *entry.Conflict) (bool, error) {
	id, err := conflictIDBytes(c.ID)
	if err != nil {
		return false, err
	}
	if p, ok := b.pendingConflicts[c.Key][c.ID]; ok && p != nil {
		return false, nil
	}
	if _, ok := b.pendingConflicts[c.Key][c.ID]; !ok {
		_, closer, err := b.s.db.Get(conflictIDKey(id))
		if err == nil {
			closer.Close()
			return false, nil
		}
		if !errors.Is(err, pebble.ErrNotFound) {
			return false, err
		}
	}
	if err := b.putConflictLocked(id, c); err != nil {
		return false, err
	}
	return true, b.addConflictStats(1, conflictSize(c), 0)
}

func (b *Batch) putConflictLocked(id []byte, c *entry.Conflict) error {
	err := errors.Join(
		b.pb.Set(conflictKey(c.Key, id), encodeConflict(c), nil),
		b.pb.Set(conflictTimeKey(c.At, id), []byte(c.Key), nil),
		b.pb.Set(conflictIDKey(id), []byte(c.Key), nil),
	)
	for _, a := range c.Aliases {
		// An alias is indexed as an ID of the key's (ConflictByID).
		if aid, aerr := conflictIDBytes(a); aerr != nil {
			err = errors.Join(err, aerr)
		} else {
			err = errors.Join(err, b.pb.Set(conflictIDKey(aid), []byte(c.Key), nil))
		}
	}
	if err != nil {
		return err
	}
	b.notePendingConflict(c.Key, c.ID, c)
	return nil
}

// DeleteConflict removes a record.
func (b *Batch) DeleteConflict(c *entry.Conflict) error {
	id, err := conflictIDBytes(c.ID)
	if err != nil {
		return err
	}
	err = errors.Join(
		b.pb.Delete(conflictKey(c.Key, id), nil),
		b.pb.Delete(conflictTimeKey(c.At, id), nil),
		b.pb.Delete(conflictIDKey(id), nil),
	)
	for _, a := range c.Aliases {
		if aid, aerr := conflictIDBytes(a); aerr == nil {
			err = errors.Join(err, b.pb.Delete(conflictIDKey(aid), nil))
		}
	}
	if err != nil {
		return err
	}
	b.notePendingConflict(c.Key, c.ID, nil)
	return b.addConflictStats(-1, -conflictSize(c), 0)
}

// ConflictStats are the conflict log's size and what retention dropped.
type ConflictStats struct {
	Records int64
	Bytes   int64
	// Dropped counts the records retention collected (by age or bytes).
	Dropped int64
}

// conflictSize is what a record counts against the log's byte bound: its
// key (stored twice), the value kept, and a fixed part for the rest. It
// does not depend on the restored field, so a restore changes no count.
func conflictSize(c *entry.Conflict) int64 { return int64(2*len(c.Key) + len(c.LoserValue) + 200) }

// ConflictStats reads the log's figures as committed.
func (s *Store) ConflictStats() (ConflictStats, error) { return conflictStats(s.db) }

func conflictStats(r pebble.Reader) (ConflictStats, error) {
	v, closer, err := r.Get(keyConflictStats)
	if errors.Is(err, pebble.ErrNotFound) {
		return ConflictStats{}, nil
	}
	if err != nil {
		return ConflictStats{}, err
	}
	defer closer.Close()
	if len(v) != 24 {
		return ConflictStats{}, fmt.Errorf("%w: conflict stats of %d bytes", ErrCorrupt, len(v))
	}
	return ConflictStats{Records: int64(binary.BigEndian.Uint64(v)), Bytes: int64(binary.BigEndian.Uint64(v[8:])),
		Dropped: int64(binary.BigEndian.Uint64(v[16:]))}, nil
}

// addConflictStats changes the log's figures in the batch.
func (b *Batch) addConflictStats(records, bytes, dropped int64) error {
	if b.conflictStats == nil {
		st, err := conflictStats(b.s.db)
		if err != nil {
			return err
		}
		b.conflictStats = &st
	}
	st := b.conflictStats
	st.Records += records
	st.Bytes += bytes
	st.Dropped += dropped
	v := binary.BigEndian.AppendUint64(nil, uint64(st.Records))
	v = binary.BigEndian.AppendUint64(v, uint64(st.Bytes))
	v = binary.BigEndian.AppendUint64(v, uint64(st.Dropped))
	return b.pb.Set(keyConflictStats, v, nil)
}

// CollectConflicts drops the oldest records, by the time they were logged,
// while they are older than before or the log holds more than maxBytes
// (0: no bound), up to max of them; each counts as dropped.
func (b *Batch) CollectConflicts(before hlc.Timestamp, maxBytes int64, max int) (int, error) {
	if before.IsZero() && maxBytes <= 0 {
		return 0, nil
	}
	st, err := conflictStats(b.s.db)
	if err != nil {
		return 0, err
	}
	if b.conflictStats != nil {
		st = *b.conflictStats
	}
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixConflictTime}, UpperBound: []byte{prefixConflictTime + 1}})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid && n < max; valid = it.Next() {
		k := it.Key()
		if len(k) != 1+hlc.EncodedLen+16 {
			return n, fmt.Errorf("%w: conflict time key of %d bytes", ErrCorrupt, len(k))
		}
		at, err := hlc.Decode(k[1 : 1+hlc.EncodedLen])
		if err != nil {
			return n, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if !at.Less(before) && (maxBytes <= 0 || st.Bytes <= maxBytes) {
			break
		}
		id := bytes.Clone(k[1+hlc.EncodedLen:])
		key := string(it.Value())
		v, closer, err := b.s.db.Get(conflictKey(key, id))
		if err != nil {
			return n, fmt.Errorf("%w: conflict %x indexed by time, not stored: %v", ErrCorrupt, id, err)
		}
		c, err := decodeConflict(id, v)
		closer.Close()
		if err != nil {
			return n, err
		}
		if err := b.DeleteConflict(&c); err != nil {
			return n, err
		}
		if err := b.addConflictStats(0, 0, 1); err != nil {
			return n, err
		}
		st.Bytes -= conflictSize(&c)
		n++
	}
	return n, it.Error()
}

// UpdateConflict rewrites a record in place (its time stays).
func (b *Batch) UpdateConflict(c *entry.Conflict) error {
	id, err := conflictIDBytes(c.ID)
	if err != nil {
		return err
	}
	if err := b.pb.Set(conflictKey(c.Key, id), encodeConflict(c), nil); err != nil {
		return err
	}
	b.notePendingConflict(c.Key, c.ID, c)
	return nil
}

func (b *Batch) notePendingConflict(key, id string, c *entry.Conflict) {
	if b.pendingConflicts == nil {
		b.pendingConflicts = map[string]map[string]*entry.Conflict{}
	}
	if b.pendingConflicts[key] == nil {
		b.pendingConflicts[key] = map[string]*entry.Conflict{}
	}
	if c != nil {
		cc := *c
		c = &cc
	}
	b.pendingConflicts[key][id] = c
}

// ConflictByID returns the record of an ID (ok false: none), or the record
// that took it over as an alias (its ID then differs from idHex).
func (s *Store) ConflictByID(idHex string) (entry.Conflict, bool, error) {
	id, err := conflictIDBytes(idHex)
	if err != nil {
		return entry.Conflict{}, false, err
	}
	key, closer, err := s.db.Get(conflictIDKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return entry.Conflict{}, false, nil
	}
	if err != nil {
		return entry.Conflict{}, false, err
	}
	k := string(key)
	closer.Close()
	v, closer, err := s.db.Get(conflictKey(k, id))
	if errors.Is(err, pebble.ErrNotFound) {
		// An alias: the record of the key that names it.
		recs, err := conflictsOf(s.db, k)
		if err != nil {
			return entry.Conflict{}, false, err
		}
		for _, r := range recs {
			if slices.Contains(r.Aliases, hex.EncodeToString(id)) {
				return r, true, nil
			}
		}
		return entry.Conflict{}, false, fmt.Errorf("%w: conflict %s indexed, not stored", ErrCorrupt, idHex)
	}
	if err != nil {
		return entry.Conflict{}, false, fmt.Errorf("%w: conflict %s indexed, not stored: %v", ErrCorrupt, idHex, err)
	}
	defer closer.Close()
	c, err := decodeConflict(id, v)
	return c, err == nil, err
}

// ConflictQuery selects records of the conflict log, in key order.
type ConflictQuery struct {
	Key    string        // exactly this key
	Prefix string        // keys under this prefix
	Since  hlc.Timestamp // logged at or after
	After  string        // the cursor: a previous page's Next
	Limit  int
}

// Conflicts lists records in key order (then ID), a page at a time: next
// is the cursor of the following page ("" at the end).
func (s *Store) Conflicts(q ConflictQuery) (out []entry.Conflict, next string, err error) {
	lower := []byte{prefixConflict}
	upper := []byte{prefixConflict + 1}
	switch {
	case q.Key != "":
		lower = conflictKey(q.Key, nil)
		upper = prefixEnd(lower)
	case q.Prefix != "":
		lower = append([]byte{prefixConflict}, q.Prefix...)
		upper = prefixEnd(lower)
	}
	if q.After != "" {
		after, err := hex.DecodeString(q.After)
		if err != nil || len(after) < 17 {
			return nil, "", fmt.Errorf("store: conflicts cursor %q", q.After)
		}
		if from := append(append([]byte{prefixConflict}, after...), 0); bytes.Compare(from, lower) > 0 {
			lower = from
		}
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, "", err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) < 1+1+16 {
			return nil, "", fmt.Errorf("%w: conflict key of %d bytes", ErrCorrupt, len(k))
		}
		c, err := decodeConflict(k[len(k)-16:], it.Value())
		if err != nil {
			return nil, "", err
		}
		if q.Key != "" && c.Key != q.Key || q.Prefix != "" && !strings.HasPrefix(c.Key, q.Prefix) || c.At.Less(q.Since) {
			continue
		}
		if len(out) == q.Limit {
			return out, hex.EncodeToString(lastKey(out)), nil
		}
		out = append(out, c)
	}
	return out, "", it.Error()
}

// lastKey is the cursor of a page: the last record's key without its prefix.
func lastKey(page []entry.Conflict) []byte {
	c := page[len(page)-1]
	id, _ := hex.DecodeString(c.ID)
	return conflictKey(c.Key, id)[1:]
}
