// Package store is the Pebble tree: versioned values resolved last-writer-wins
// on their stamps, tombstones kept for a retention window, and the bookkeeping
// that must commit atomically with the data (the last applied WAL index and
// the HLC high-water mark).
//
// Key layout in Pebble (one byte of prefix per space):
//
//	d<key>               data record (see AppendRecord)
//	t<hlc:12><key>       tombstone index, ordered by stamp, for collection
//	m<name>              node metadata (applied index, HLC high-water)
package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

const (
	prefixData      = 'd'
	prefixTombstone = 't'
	prefixMeta      = 'm'
)

var (
	keyLocalApplied = []byte("m\x00applied")
	keyHLC          = []byte("m\x00hlc")
	keyMaxStamp     = []byte("m\x00maxstamp")
)

// Options configures a Store. The zero value of a field means its default.
type Options struct {
	// Logger receives Pebble's messages. Default slog.Default().
	Logger *slog.Logger
	// CacheSize is Pebble's block cache in bytes. Default 32 MiB.
	CacheSize int64
	// MemTableSize is Pebble's memtable size in bytes. Default 64 MiB: a
	// write's outbound entry is cut once every peer has it, usually while
	// it is still in the memtable, and then never reaches a table.
	MemTableSize uint64
}

// DefaultOptions returns the options Open uses for zero fields.
func DefaultOptions() *Options {
	o := &Options{}
	o.EnsureDefaults()
	return o
}

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CacheSize == 0 {
		o.CacheSize = 32 << 20
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = 64 << 20
	}
}

// Validate reports every problem with o at once.
func (o *Options) Validate() error {
	var errs []error
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("store: CacheSize %d is negative", o.CacheSize))
	}
	if o.MemTableSize > 0 && o.MemTableSize < 1<<20 {
		errs = append(errs, fmt.Errorf("store: MemTableSize %d is below 1 MiB", o.MemTableSize))
	}
	return errors.Join(errs...)
}

// Store is the Pebble tree of one node. Safe for concurrent use.
type Store struct {
	db    *pebble.DB
	cache interface{ Unref() }
	opts  Options

	// applyMu serialises batches from first read to commit, so that two
	// concurrent merges of one key cannot both read the old stamp and both
	// write: LWW must compare against what is really stored.
	applyMu sync.Mutex
	// maxStamp is at least every stamp ever merged into the tree (persisted
	// with each batch that raises it). A write stamped above it beats
	// whatever the key holds, so it needs no read: that is the common case
	// of local writes, whose commit HLCs only grow. Guarded by applyMu.
	maxStamp entry.Stamp
	// hasCounters turns true at the first counter (or at open if any).
	hasCounters atomic.Bool
	// ranges are the range tombstones kept (few: collected like
	// tombstones). Guarded by applyMu.
	ranges []RangeTombstone
	// hlcHigh is the persisted clock high-water mark. Batches only ever
	// raise it (RaiseHLC): a local group and an inbound batch commit in
	// either order, and the later commit must not write a lower value over
	// the higher one. Guarded by applyMu.
	hlcHigh hlc.Timestamp
	// marks are the committed high-water marks by origin and stream, the
	// same as their Pebble records (loaded at open, changed only by batch
	// commits). Every inbound batch reads its sender's marks; from Pebble
	// that was an iterator and seeks per batch (a tenth of a receiver's
	// CPU at 1,000 writes/s). Guarded by applyMu.
	marks map[string]map[[16]byte]entry.HWM
}

// Open opens (creating if needed) the tree in dir.
func Open(dir string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	cache := pebble.NewCache(o.CacheSize)
	db, err := pebble.Open(dir, &pebble.Options{
		Cache:              cache,
		MemTableSize:       o.MemTableSize,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{o.Logger},
	})
	if err != nil {
		cache.Unref()
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	s := &Store{db: db, cache: cache, opts: o}
	if err := errors.Join(s.loadMaxStamp(), s.loadRanges(), s.checkCounters(), s.loadHLC(), s.loadMarks()); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) loadHLC() error {
	ts, err := s.HLCHighWater()
	s.hlcHigh = ts
	return err
}

func (s *Store) loadMaxStamp() error {
	v, closer, err := s.db.Get(keyMaxStamp)
	if errors.Is(err, pebble.ErrNotFound) {
		return s.deriveMaxStamp()
	}
	if err != nil {
		return fmt.Errorf("store: read max stamp: %w", err)
	}
	defer closer.Close()
	if len(v) < hlc.EncodedLen {
		return fmt.Errorf("%w: max stamp of %d bytes", ErrCorrupt, len(v))
	}
	ts, err := hlc.Decode(v[:hlc.EncodedLen])
	if err != nil {
		return fmt.Errorf("%w: max stamp: %v", ErrCorrupt, err)
	}
	s.maxStamp = entry.Stamp{HLC: ts, Origin: string(v[hlc.EncodedLen:])}
	return nil
}

// deriveMaxStamp scans the data once when no max stamp is recorded (an
// empty tree, or one whose record was lost with Pebble's unsynced tail).
func (s *Store) deriveMaxStamp() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		st, _, err := decodeStampOnly(it.Value())
		if err != nil {
			return fmt.Errorf("store: key %q: %w", it.Key()[1:], err)
		}
		if s.maxStamp.Compare(st) < 0 {
			s.maxStamp = st
		}
	}
	return it.Error()
}

// Close flushes nothing extra (every commit already went through Pebble's WAL)
// and releases the tree.
func (s *Store) Close() error {
	err := s.db.Close()
	s.cache.Unref()
	if err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}

// DB exposes the Pebble handle to packages that keep their own key spaces in
// the same tree (cursors, high-water marks).
func (s *Store) DB() *pebble.DB { return s.db }

func dataKey(key string) []byte {
	k := make([]byte, 0, 1+len(key))
	k = append(k, prefixData)
	return append(k, key...)
}

func tombstoneKey(ts hlc.Timestamp, key string) []byte {
	k := make([]byte, 0, 1+hlc.EncodedLen+len(key))
	k = append(k, prefixTombstone)
	k = ts.AppendTo(k)
	return append(k, key...)
}

// Get returns the record stored at key, tombstones included (check
// Record.Tombstone). ErrNotFound means nothing at all is stored.
func (s *Store) Get(key string) (Record, error) {
	v, closer, err := s.db.Get(dataKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("store: get %q: %w", key, err)
	}
	defer closer.Close()
	r, err := DecodeRecord(v)
	if err != nil {
		return Record{}, fmt.Errorf("store: get %q: %w", key, err)
	}
	r.Value = bytes.Clone(r.Value)
	return r, nil
}

// Write is one single-key mutation with its LWW stamp.
type Write struct {
	Key       string
	Value     []byte
	Tombstone bool
	Kind      Kind
	Stamp     entry.Stamp
}

// Set merges a value under stamp in its own synced batch.
func (s *Store) Set(key string, value []byte, stamp entry.Stamp) (entry.Outcome, error) {
	return s.mergeOne(Write{Key: key, Value: value, Stamp: stamp})
}

// Delete merges a tombstone under stamp in its own synced batch.
func (s *Store) Delete(key string, stamp entry.Stamp) (entry.Outcome, error) {
	return s.mergeOne(Write{Key: key, Tombstone: true, Stamp: stamp})
}

// Merge applies w last-writer-wins in its own synced batch.
func (s *Store) Merge(w Write) (entry.Outcome, error) { return s.mergeOne(w) }

func (s *Store) mergeOne(w Write) (entry.Outcome, error) {
	b := s.NewBatch()
	defer b.Close()
	out, err := b.Merge(w)
	if err != nil {
		return 0, err
	}
	return out, b.Commit(true)
}

// Batch gathers merges and bookkeeping that commit atomically. It holds the
// store's apply lock from NewBatch to Close, so reads inside it see every
// committed write and the batch's own earlier merges. Not safe for concurrent
// use; always Close it.
type Batch struct {
	s       *Store
	pb      *pebble.Batch
	pending map[string]pendingRecord
	expect  int // keys the batch expects to write (Reserve)
	closed  bool
	buf     []byte
	// max is the highest stamp stored or merged so far, as this batch sees;
	// maxOwn says a blind write of this batch set it.
	max    entry.Stamp
	maxOwn bool
	// pendingIdem holds idempotency records merged in this batch.
	pendingIdem map[string]*IdemRecord
	// pendingCtr holds counters merged in this batch.
	pendingCtr map[string]*Counter
	// pendingRanges are range tombstones added by this batch.
	pendingRanges []RangeTombstone
	// replaceRanges, when set, is the store's range list after collection.
	replaceRanges *[]RangeTombstone
	// hlc is the clock high-water mark this batch raises the store's to
	// (zero: it does not).
	hlc hlc.Timestamp
	// marks are the high-water marks this batch sets (deleted: a zero
	// Origin), for the store's copy once it commits.
	marks []markChange
}

type pendingRecord struct {
	stamp entry.Stamp
	flags byte
}

// NewBatch starts a batch and takes the apply lock.
func (s *Store) NewBatch() *Batch {
	s.applyMu.Lock()
	return &Batch{s: s, pb: s.db.NewBatch(), max: s.maxStamp}
}

// Close releases the batch and the apply lock; committed or not.
func (b *Batch) Close() {
	if b.closed {
		return
	}
	b.closed = true
	b.pb.Close()
	b.s.applyMu.Unlock()
}

// Len is the number of Pebble operations in the batch.
func (b *Batch) Len() int { return int(b.pb.Count()) }

// currentLocked returns the stamp and flags stored for key, looking at the
// batch's own pending writes first.
func (b *Batch) currentLocked(key string, dk []byte) (entry.Stamp, byte, bool, error) {
	if p, ok := b.pending[key]; ok {
		return p.stamp, p.flags, true, nil
	}
	v, closer, err := b.s.db.Get(dk)
	if errors.Is(err, pebble.ErrNotFound) {
		return entry.Stamp{}, 0, false, nil
	}
	if err != nil {
		return entry.Stamp{}, 0, false, fmt.Errorf("store: get %q: %w", key, err)
	}
	st, flags, err := decodeStampOnly(v)
	closer.Close()
	if err != nil {
		return entry.Stamp{}, 0, false, fmt.Errorf("store: key %q: %w", key, err)
	}
	return st, flags, true, nil
}

// Stored returns the stamp stored for key as this batch would see it, and
// whether the key holds a tombstone. ok is false when nothing is stored.
func (b *Batch) Stored(key string) (st entry.Stamp, tombstone, ok bool, err error) {
	st, flags, ok, err := b.currentLocked(key, dataKey(key))
	return st, flags&flagTombstone != 0, ok, err
}

// Merge applies w last-writer-wins and reports what it did. A tombstone is
// written even for a key that was never stored: it keeps an older write that
// arrives later from resurrecting the key.
func (b *Batch) Merge(w Write) (entry.Outcome, error) {
	if w.Stamp.Origin == "" || len(w.Stamp.Origin) > maxOriginLen {
		return 0, fmt.Errorf("store: merge %q: origin %q out of range", w.Key, w.Stamp.Origin)
	}
	dk := dataKey(w.Key)
	var (
		cur      entry.Stamp
		curFlags byte
		ok       bool
		err      error
		blind    bool
	)
	c := b.max.Compare(w.Stamp)
	if c == 0 && b.maxOwn {
		// b.max is this batch's own stamp (an atomic batch writes many
		// keys under one): above everything stored, so only the keys this
		// batch wrote need a look.
		if _, mine := b.pending[w.Key]; !mine {
			c = -1
		}
	}
	if c >= 0 {
		// Something stored may be newer: compare with what the key holds.
		// (Above b.max the write beats everything, unread. A tombstone
		// overwritten that way leaves its index entry behind, which
		// collection recognises as stale.)
		cur, curFlags, ok, err = b.currentLocked(w.Key, dk)
		if err != nil {
			return 0, err
		}
	} else {
		b.max = w.Stamp
		b.maxOwn = true
		blind = true
	}
	if ok {
		switch c := w.Stamp.Compare(cur); {
		case c == 0:
			return entry.Duplicate, nil
		case c < 0:
			return entry.Stale, nil
		}
	}
	if !blind && b.coveredLocked(w.Key, w.Stamp) {
		// A range delete newer than this write covers its key.
		return entry.Stale, nil
	}
	if ok {
		if curFlags&flagTombstone != 0 {
			// The old tombstone's index entry is dropped with it.
			if err := b.pb.Delete(tombstoneKey(cur.HLC, w.Key), nil); err != nil {
				return 0, err
			}
		}
	}
	r := Record{Stamp: w.Stamp, Tombstone: w.Tombstone, Kind: w.Kind, Value: w.Value}
	if w.Tombstone && w.Kind == KindPlain {
		r.Value = nil
	}
	b.buf = AppendRecord(b.buf[:0], &r)
	if err := b.pb.Set(dk, b.buf, nil); err != nil {
		return 0, err
	}
	var flags byte
	if w.Tombstone {
		flags |= flagTombstone
		if err := b.pb.Set(tombstoneKey(w.Stamp.HLC, w.Key), nil, nil); err != nil {
			return 0, err
		}
	}
	if b.pending == nil {
		b.pending = make(map[string]pendingRecord, b.expect)
	}
	b.pending[w.Key] = pendingRecord{stamp: w.Stamp, flags: flags}
	return entry.Applied, nil
}

// AppliedIndex is how far the local stream is applied to the tree: every entry
// of Stream up to Index, the last of which was committed at Commit.
type AppliedIndex struct {
	Stream [16]byte
	Index  uint64
	Commit hlc.Timestamp
}

// Reserve tells the batch it is about to write about n keys, so that it
// sizes its bookkeeping once (a group of thousands of keys grew it a
// little at a time).
func (b *Batch) Reserve(n int) {
	if b.pending == nil {
		b.expect = n
	}
}

// SetLocalApplied records that the local WAL stream has been applied up to
// index (committed at commit). It commits with the data, so recovery knows
// exactly where to resume, and a re-seed snapshot knows which entry its
// state corresponds to.
func (b *Batch) SetLocalApplied(a AppliedIndex) error {
	v := make([]byte, 0, 24+hlc.EncodedLen)
	v = append(v, a.Stream[:]...)
	v = binary.BigEndian.AppendUint64(v, a.Index)
	v = a.Commit.AppendTo(v)
	return b.pb.Set(keyLocalApplied, v, nil)
}

func decodeApplied(v []byte) (AppliedIndex, error) {
	var a AppliedIndex
	if len(v) != 24 && len(v) != 24+hlc.EncodedLen {
		return a, fmt.Errorf("%w: applied index of %d bytes", ErrCorrupt, len(v))
	}
	copy(a.Stream[:], v[:16])
	a.Index = binary.BigEndian.Uint64(v[16:24])
	if len(v) > 24 {
		ts, err := hlc.Decode(v[24:])
		if err != nil {
			return a, fmt.Errorf("%w: applied index: %v", ErrCorrupt, err)
		}
		a.Commit = ts
	}
	return a, nil
}

// RaiseHLC raises the persisted clock high-water mark to ts, never lowers
// it: a restarted node stamps above the highest value any committed batch
// recorded, whichever batch committed last.
func (b *Batch) RaiseHLC(ts hlc.Timestamp) error {
	if !b.s.hlcHigh.Less(ts) || !b.hlc.Less(ts) {
		return nil
	}
	b.hlc = ts
	enc := ts.Encode()
	return b.pb.Set(keyHLC, enc[:], nil)
}

// SetRaw writes a key of another package's key space in this batch.
func (b *Batch) SetRaw(key, value []byte) error { return b.pb.Set(key, value, nil) }

// DeleteRaw deletes a key of another package's key space in this batch.
func (b *Batch) DeleteRaw(key []byte) error { return b.pb.Delete(key, nil) }

// Commit writes the batch atomically. sync asks Pebble to fsync its own WAL;
// the node's local write path passes false because the outbound WAL, already
// fsynced, is the redo log; the acceptor passes true because nothing else
// holds what it applies.
func (b *Batch) Commit(sync bool) error {
	if b.pb.Empty() {
		return nil
	}
	raised := b.s.maxStamp.Compare(b.max) < 0
	if raised {
		v := b.max.HLC.AppendTo(make([]byte, 0, hlc.EncodedLen+len(b.max.Origin)))
		if err := b.pb.Set(keyMaxStamp, append(v, b.max.Origin...), nil); err != nil {
			return err
		}
	}
	wo := pebble.NoSync
	if sync {
		wo = pebble.Sync
	}
	if err := b.pb.Commit(wo); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	if raised {
		b.s.maxStamp = b.max
	}
	if b.s.hlcHigh.Less(b.hlc) {
		b.s.hlcHigh = b.hlc
	}
	if b.replaceRanges != nil {
		b.s.ranges = *b.replaceRanges
	}
	if len(b.pendingCtr) > 0 {
		b.s.hasCounters.Store(true)
	}
	for _, c := range b.marks {
		b.s.setMarkLocked(c)
	}
	b.s.ranges = append(b.s.ranges, b.pendingRanges...)
	return nil
}

// LocalApplied returns how far the local stream is applied. A zero stream
// means nothing was ever applied.
func (s *Store) LocalApplied() (AppliedIndex, error) {
	v, closer, err := s.db.Get(keyLocalApplied)
	if errors.Is(err, pebble.ErrNotFound) {
		return AppliedIndex{}, nil
	}
	if err != nil {
		return AppliedIndex{}, fmt.Errorf("store: read applied index: %w", err)
	}
	defer closer.Close()
	return decodeApplied(v)
}

// HLCHighWater returns the persisted clock high-water mark (zero if none).
func (s *Store) HLCHighWater() (hlc.Timestamp, error) {
	v, closer, err := s.db.Get(keyHLC)
	if errors.Is(err, pebble.ErrNotFound) {
		return hlc.Timestamp{}, nil
	}
	if err != nil {
		return hlc.Timestamp{}, fmt.Errorf("store: read hlc high-water: %w", err)
	}
	defer closer.Close()
	ts, err := hlc.Decode(v)
	if err != nil {
		return hlc.Timestamp{}, fmt.Errorf("%w: hlc high-water: %v", ErrCorrupt, err)
	}
	return ts, nil
}

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

// prefixEnd returns the smallest key above every key with prefix p, or nil.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Digest summarises the live state.
type Digest struct {
	// Hash is the hex SHA-256 over every live key in order with its value,
	// kind and stamp. Two stores have equal hashes exactly when they hold
	// the same live data (up to SHA-256 collisions).
	Hash string
	// Keys is the number of live keys.
	Keys int
	// Tombstones is the number of tombstones not yet collected. It is not in
	// the hash: clusters collect tombstones at different times.
	Tombstones int
	// Counters is the number of PN-counters (in the hash by their totals).
	Counters int
}

// Digest hashes the live state from one consistent snapshot.
func (s *Store) Digest() (Digest, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	defer it.Close()
	h := sha256.New()
	var d Digest
	var scratch []byte
	for valid := it.First(); valid; valid = it.Next() {
		r, err := DecodeRecord(it.Value())
		if err != nil {
			return Digest{}, fmt.Errorf("store: digest key %q: %w", it.Key()[1:], err)
		}
		if r.Tombstone {
			d.Tombstones++
			continue
		}
		d.Keys++
		scratch = appendDigestEntry(scratch[:0], it.Key()[1:], &r)
		h.Write(scratch)
	}
	if err := it.Error(); err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	// Counters by their per-cluster totals (canonical bytes: sorted).
	cit, err := it.Clone(pebble.CloneOptions{IterOptions: &pebble.IterOptions{LowerBound: []byte{prefixCounter}, UpperBound: []byte{prefixCounter + 1}}})
	if err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	defer cit.Close()
	for valid := cit.First(); valid; valid = cit.Next() {
		c, err := DecodeCounter(cit.Value())
		if err != nil {
			return Digest{}, fmt.Errorf("store: digest counter %q: %w", cit.Key()[1:], err)
		}
		d.Counters++
		scratch = appendCounterDigest(scratch[:0], cit.Key()[1:], appendCounterTotals(nil, &c))
		h.Write(scratch)
	}
	if err := cit.Error(); err != nil {
		return Digest{}, fmt.Errorf("store: digest: %w", err)
	}
	d.Hash = hex.EncodeToString(h.Sum(nil))
	return d, nil
}

// appendDigestEntry frames one live key unambiguously (lengths before bytes).
func appendDigestEntry(dst, key []byte, r *Record) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = append(dst, byte(r.Kind))
	dst = r.Stamp.HLC.AppendTo(dst)
	dst = binary.AppendUvarint(dst, uint64(len(r.Stamp.Origin)))
	dst = append(dst, r.Stamp.Origin...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
	return append(dst, r.Value...)
}

// CollectTombstones removes tombstones whose stamp is below cutoff and reports
// how many it removed. The caller picks cutoff so that no write older than a
// collected tombstone can still arrive (see DESIGN.md "Replication"). At most
// max tombstones go per call, so a large backlog does not hold the apply lock
// for long; max <= 0 means 10,000.
func (s *Store) CollectTombstones(cutoff hlc.Timestamp, max int) (int, error) {
	b := s.NewBatch()
	defer b.Close()
	n, err := b.CollectTombstones(cutoff, max)
	if err != nil {
		return n, err
	}
	return n, b.Commit(true)
}

// CollectTombstones is Store.CollectTombstones in the batch (a command of
// the cluster's log: every node collects the same).
func (b *Batch) CollectTombstones(cutoff hlc.Timestamp, max int) (int, error) {
	if max <= 0 {
		max = 10000
	}
	upper := tombstoneKey(cutoff, "")
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTombstone}, UpperBound: upper})
	if err != nil {
		return 0, fmt.Errorf("store: collect tombstones: %w", err)
	}
	n := 0
	for valid := it.First(); valid && n < max; valid = it.Next() {
		ik := it.Key()
		ts, err := hlc.Decode(ik[1 : 1+hlc.EncodedLen])
		if err != nil {
			it.Close()
			return n, fmt.Errorf("store: tombstone index: %w: %v", ErrCorrupt, err)
		}
		key := string(ik[1+hlc.EncodedLen:])
		if err := b.pb.Delete(bytes.Clone(ik), nil); err != nil {
			it.Close()
			return n, err
		}
		st, flags, ok, err := b.currentLocked(key, dataKey(key))
		if err != nil {
			it.Close()
			return n, err
		}
		// Only the very tombstone this index entry names goes; a key that
		// was written again since keeps its newer state.
		if ok && flags&flagTombstone != 0 && st.HLC == ts {
			if err := b.pb.Delete(dataKey(key), nil); err != nil {
				it.Close()
				return n, err
			}
			n++
		}
	}
	if err := it.Close(); err != nil {
		return n, fmt.Errorf("store: collect tombstones: %w", err)
	}
	rn, err := b.collectRanges(cutoff)
	return n + rn, err
}

type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
	panic(fmt.Sprintf(format, args...))
}

// Sync makes every batch committed so far durable (Pebble's WAL fsynced).
// The local write path commits without sync because the outbound WAL is the
// redo log; before that WAL is cut back, what it held must be durable here.
func (s *Store) Sync() error {
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("store: sync: %w", err)
	}
	return nil
}

// Snapshot is a consistent view of every key (tombstones included) with the
// local applied index at that view: what a re-seed streams to a peer.
type Snapshot struct {
	snap    *pebble.Snapshot
	it      *pebble.Iterator
	applied AppliedIndex
	started bool
}

// Counters lists the snapshot's counters.
func (sn *Snapshot) Counters() (map[string]Counter, error) {
	it, err := sn.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixCounter}, UpperBound: []byte{prefixCounter + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[string]Counter{}
	for valid := it.First(); valid; valid = it.Next() {
		c, err := DecodeCounter(it.Value())
		if err != nil {
			return nil, err
		}
		out[string(it.Key()[1:])] = c
	}
	return out, it.Error()
}

// Marks lists the snapshot's high-water marks of real streams (a re-seed's
// own snapshot streams, which record no commit, are left out).
func (sn *Snapshot) Marks() ([]entry.HWM, error) {
	all, err := hwmsIn(sn.snap, nil, []byte{prefixHWM}, []byte{prefixHWM + 1}, 0)
	out := all[:0]
	for _, h := range all {
		if !h.Commit.IsZero() {
			out = append(out, h)
		}
	}
	return out, err
}

// Ranges lists the snapshot's range tombstones.
func (sn *Snapshot) Ranges() ([]RangeTombstone, error) {
	it, err := sn.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRange}, UpperBound: []byte{prefixRange + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []RangeTombstone
	for valid := it.First(); valid; valid = it.Next() {
		r, err := decodeRange(it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, it.Error()
}

// NewSnapshot opens a snapshot. Close it.
func (s *Store) NewSnapshot() (*Snapshot, error) {
	snap := s.db.NewSnapshot()
	sn := &Snapshot{snap: snap}
	v, closer, err := snap.Get(keyLocalApplied)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		snap.Close()
		return nil, fmt.Errorf("store: snapshot: %w", err)
	default:
		a, derr := decodeApplied(v)
		closer.Close()
		if derr != nil {
			snap.Close()
			return nil, derr
		}
		sn.applied = a
	}
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		snap.Close()
		return nil, fmt.Errorf("store: snapshot: %w", err)
	}
	sn.it = it
	return sn, nil
}

// LocalApplied is how far the local stream is applied in the snapshot.
func (sn *Snapshot) LocalApplied() AppliedIndex { return sn.applied }

// Next returns the next key's record; ok is false at the end.
func (sn *Snapshot) Next() (key string, r Record, ok bool, err error) {
	var valid bool
	if !sn.started {
		valid, sn.started = sn.it.First(), true
	} else {
		valid = sn.it.Next()
	}
	if !valid {
		return "", Record{}, false, sn.it.Error()
	}
	r, err = DecodeRecord(sn.it.Value())
	if err != nil {
		return "", Record{}, false, fmt.Errorf("store: snapshot key %q: %w", sn.it.Key()[1:], err)
	}
	r.Value = bytes.Clone(r.Value)
	return string(sn.it.Key()[1:]), r, true, nil
}

// Count counts the snapshot's keys (tombstones included) without moving Next.
func (sn *Snapshot) Count() (int, error) {
	it, err := sn.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixData}, UpperBound: []byte{prefixData + 1}})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		n++
	}
	return n, it.Error()
}

// Close releases the snapshot.
func (sn *Snapshot) Close() {
	sn.it.Close()
	sn.snap.Close()
}
