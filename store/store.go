// Package store is the Pebble tree: versioned values resolved last-writer-wins
// on their stamps, tombstones kept for a retention window, and the bookkeeping
// that must commit atomically with the data (the last applied WAL index and
// the HLC high-water mark).
//
// Every key space of the tree (one byte of prefix per space), of this
// package and of the packages that keep keys in the same tree, is listed in
// keys.go with the layout of its keys and values.
package store

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/options"
)

// Options configures a Store. The zero value of a field means its default.
type Options struct {
	// Logger receives Pebble's messages. Default slog.Default().
	Logger *slog.Logger
	// CacheSize is Pebble's block cache in bytes. Default 256 MiB.
	CacheSize int64
	// MemTableSize is Pebble's memtable size in bytes. Default 64 MiB: a
	// write's outbound entry is cut once every peer has it, usually while
	// it is still in the memtable, and then never reaches a table.
	MemTableSize uint64
	// VersionCacheKeys bounds the keys whose newest version (without its
	// value) the store keeps in memory for the write path (versions.go).
	// Default 262,144 (about 45 MiB once full); negative: no cache.
	VersionCacheKeys int
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
		o.CacheSize = 256 << 20
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = 64 << 20
	}
	if o.VersionCacheKeys == 0 {
		o.VersionCacheKeys = 1 << 18
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
	// closed: Close began. Reports that may be read after a node stopped
	// (RemovedNodes) answer ErrClosed instead of reaching a closed Pebble.
	closed atomic.Bool

	// applyMu serialises batches from first read to commit, so that two
	// concurrent merges of one key cannot both read the old stamp and both
	// write: LWW must compare against what is really stored.
	applyMu sync.Mutex
	// checkMu serialises CheckLeaves: two checks correcting the same leaf
	// by what each found it off would correct it twice.
	checkMu sync.Mutex
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
	// seen holds every data key the tree ever held a record of, maybe
	// more (seen.go). Guarded by applyMu.
	seen *seenKeys
	// versions holds the newest versions of recently written keys,
	// without values (versions.go). Guarded by applyMu.
	versions *versionCache
	// ctrKeys is the keys filter of the counters (seen.go): a read or a
	// decision about a key it says no to needs no counter lookup (most
	// keys never held one). Built with seen; putCounter adds a key before
	// its batch commits. Unlike seen it is read outside applyMu: ctrMu
	// guards it (nil: every key may hold a counter).
	ctrMu   sync.RWMutex
	ctrKeys *seenKeys
	// leaves are the kept leaf sums (leaves.go); leavesValid is false
	// while ReplaceFrom copies (and after it failed) until RebuildLeaves.
	// Guarded by applyMu.
	leaves      []hashtree.Sum
	leavesValid bool
	leavesGen   uint64 // moves when the leaves are replaced whole
	// live counts the live plain keys and counters (Live).
	live atomic.Int64
	// collected is the collection cutoff (CollectedBelow), kept in memory.
	collected atomic.Pointer[hlc.Timestamp]
	// marks are the committed high-water marks by origin and stream, the
	// same as their Pebble records (loaded at open, changed only by batch
	// commits). Every inbound batch reads its sender's marks; from Pebble
	// that was an iterator and seeks per batch (a tenth of a receiver's
	// CPU at 1,000 writes/s). Guarded by applyMu.
	marks map[string]map[[16]byte]entry.HWM
}

// Open opens (creating if needed) the tree in dir.
func Open(dir string, opts *Options) (*Store, error) {
	o, err := options.Resolve(opts)
	if err != nil {
		return nil, err
	}
	cache := pebble.NewCache(o.CacheSize)
	po := &pebble.Options{
		Cache:              cache,
		MemTableSize:       o.MemTableSize,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{o.Logger},
	}
	// Bloom filters on every level: from command format 4 every merge
	// reads its key (store.Batch.Track), and most local writes are of a
	// key no table holds, which a filter answers without reading a block.
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		cache.Unref()
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	s := &Store{db: db, cache: cache, opts: o, versions: newVersionCache(o.VersionCacheKeys)}
	if err := errors.Join(s.loadMaxStamp(), s.loadRanges(), s.checkCounters(), s.loadHLC(), s.loadMarks(), s.loadCollected()); err != nil {
		s.Close()
		return nil, err
	}
	var live int64
	if s.seen, s.ctrKeys, s.leaves, live, err = scanTree(db); err != nil {
		s.Close()
		return nil, err
	}
	s.live.Store(live)
	s.leavesValid = true
	return s, nil
}

// Close flushes nothing extra (every commit already went through Pebble's WAL)
// and releases the tree.
func (s *Store) Close() error {
	s.closed.Store(true)
	err := s.db.Close()
	s.cache.Unref()
	if err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
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
	// Ctx is the version's causal context, stored with it in a batch that
	// tracks versions; for a Local write the merge computes it.
	Ctx entry.Context
	// Local: a write of this cluster, whose context is what the key holds
	// now and its own stamp.
	Local bool
	// Range: the tombstone a range delete writes on one key of its range.
	Range bool
	// Also is a version a Local write descends from besides what its key
	// holds: the loser a restore brings back.
	Also entry.Stamp
	// Expires is when the version expires (Record.Expires).
	Expires int64
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
