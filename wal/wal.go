// Package wal is the cluster's write-ahead log (docs/CLUSTER.md): raft's
// LogStore and StableStore on disk. Every mutation of a cluster, a node
// alone included, is a command in it before it is applied: the log on
// tidwall/wal, each record checksummed and naming the append that wrote it
// (record.go), every append fsynced (it is the redo log), and the stable
// state (term, vote) in one small file replaced atomically. At open, a torn
// last append is cut and other damage refused (repair.go).
//
// tidwall/wal numbers its entries from 1 and only appends at last+1; raft
// indexes start wherever a snapshot left them. A log directory is therefore
// named for its base, log-<base>, and raft index = base + tidwall index. When
// raft deletes every entry (after installing a snapshot) or appends where the
// empty log does not continue, a new directory with the right base replaces
// the old one; at open, the directory with the highest base wins and the
// others are removed (a crash between the two steps leaves both).
package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/raft"
	twal "github.com/tidwall/wal"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/internal/atomicfile"
	"github.com/replicator/replicator/internal/options"
)

// Errors.
var (
	// ErrCorrupt is damage that is not a torn tail: a record before the
	// last segment, or one followed by a later append's whole record, fails
	// its checksum (Open reports a *CorruptError). Not retryable.
	ErrCorrupt = errors.New("wal: corrupt")
	// ErrNotFound is a log index outside the log.
	ErrNotFound = raft.ErrLogNotFound
)

const (
	stableName = "stable"
	dirPrefix  = "log-"
)

// Options configures a Store. Zero fields take defaults.
type Options struct {
	// SegmentSize is the target size of one segment file (default 4 MiB).
	SegmentSize int
	// NoSync skips fsync: benchmarks only.
	NoSync bool
	// Logger receives repairs (default slog.Default()).
	Logger *slog.Logger
	// BeforeWrite, when set, runs before each append and fails it with its
	// error (tests: a disk that fills).
	BeforeWrite func() error
	// AppliedIndex, when set, returns the last raft index the state machine
	// applied. A suffix delete reaching it is refused (ErrAppliedTruncated):
	// raft only cuts entries that were never committed, and only committed
	// entries are applied. It is called without the store's lock held.
	AppliedIndex func() uint64
	// OnFatal, when set, is called once, without the store's lock held, when
	// the store refuses to go on for a reason a restart does not fix
	// (ErrAppliedTruncated): the node must stop.
	OnFatal func(error)
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.SegmentSize == 0 {
		o.SegmentSize = 4 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	if o.SegmentSize < 4096 {
		errs = append(errs, fmt.Errorf("wal: SegmentSize %d is below 4096", o.SegmentSize))
	}
	return errors.Join(errs...)
}

// Store is a raft.LogStore, raft.MonotonicLogStore and raft.StableStore.
// Safe for concurrent use.
type Store struct {
	dir  string
	opts Options

	mu struct {
		sync.Mutex
		tw *twal.Log
		// broken is set when a failed append could not be cut back
		// (ErrBroken) or a suffix delete reached applied entries
		// (ErrAppliedTruncated); every later append returns it.
		broken error
		fatal  bool // OnFatal was called
		// repairs and dropped count torn tails cut at open and their
		// bytes; failures counts failed appends.
		repairs, dropped, failures int64
		base                       uint64 // raft index = base + tidwall index
		first                      uint64 // raft indexes held, 0 when empty
		last                       uint64
		stable                     map[string][]byte
		buf                        []byte
		// recent are the last entries appended, as raft handed them over:
		// a leader reads back what it just stored to send it to its
		// followers, and a read from here costs no checksum and no decode.
		// Oldest first; bounded by recentMax entries and recentBytes.
		recent      []*raft.Log
		recentBytes int
	}
}

// Bounds of the recent entries kept in memory.
const (
	recentMax   = 256
	recentBytes = 16 << 20
)

var (
	_ raft.LogStore          = (*Store)(nil)
	_ raft.MonotonicLogStore = (*Store)(nil)
	_ raft.StableStore       = (*Store)(nil)
)

// Open opens (creating if needed) the raft log and stable state in dir.
func Open(dir string, opts *Options) (*Store, error) {
	o, err := options.Resolve(opts)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	s := &Store{dir: dir, opts: o}
	if err := s.loadStable(); err != nil {
		return nil, err
	}
	bases, err := s.bases()
	if err != nil {
		return nil, err
	}
	base := uint64(0)
	if len(bases) > 0 {
		base = bases[len(bases)-1]
		for _, b := range bases[:len(bases)-1] {
			// A replacement that a crash interrupted: the newer one won.
			if err := os.RemoveAll(s.logDir(b)); err != nil {
				return nil, fmt.Errorf("wal: remove replaced log %s: %w", s.logDir(b), err)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(base); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) logDir(base uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%s%020d", dirPrefix, base))
}

// bases lists the bases of the log directories, ascending.
func (s *Store) bases() ([]uint64, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("wal: list %s: %w", s.dir, err)
	}
	var out []uint64
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		b, err := strconv.ParseUint(strings.TrimPrefix(e.Name(), dirPrefix), 10, 64)
		if err != nil {
			continue
		}
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func (s *Store) openLocked(base uint64) error {
	dir := s.logDir(base)
	dropped, err := repairTail(dir, base, s.opts.Logger)
	if err != nil {
		return err
	}
	if dropped > 0 {
		s.mu.repairs++
		s.mu.dropped += dropped
	}
	tw, err := twal.Open(dir, &twal.Options{
		SegmentSize: s.opts.SegmentSize,
		NoSync:      s.opts.NoSync,
		NoCopy:      true,
		AllowEmpty:  true,
		LogFormat:   twal.Binary,
		DirPerms:    0o755,
		FilePerms:   0o644,
	})
	if err != nil {
		return fmt.Errorf("wal: open %s: %w", dir, err)
	}
	first, err1 := tw.FirstIndex()
	last, err2 := tw.LastIndex()
	if err := errors.Join(err1, err2); err != nil {
		tw.Close()
		return fmt.Errorf("wal: open %s: %w", dir, err)
	}
	s.mu.tw, s.mu.base = tw, base
	s.mu.first, s.mu.last = 0, 0
	if last > 0 {
		s.mu.first, s.mu.last = base+first, base+last
	}
	return nil
}

// resetLocked replaces the log with an empty one whose next index is
// base+1. The new directory is created (and synced) before the old one is
// removed, so a crash leaves one of the two whole.
func (s *Store) resetLocked(base uint64) error {
	s.forgetLocked()
	old := s.mu.base
	if err := s.mu.tw.Close(); err != nil {
		return fmt.Errorf("wal: close %s: %w", s.logDir(old), err)
	}
	s.mu.tw = nil
	if base != old {
		if err := os.RemoveAll(s.logDir(base)); err != nil {
			return err
		}
		if err := os.MkdirAll(s.logDir(base), 0o755); err != nil {
			return err
		}
		if err := atomicfile.SyncDir(s.dir); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(s.logDir(old)); err != nil {
		return fmt.Errorf("wal: remove %s: %w", s.logDir(old), err)
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return err
	}
	return s.openLocked(base)
}

// Stats describe the log's files and what went wrong with them.
type Stats struct {
	Segments      int   // segment files of the current log
	Repairs       int64 // torn tails cut at open
	DroppedBytes  int64 // bytes those cuts dropped
	WriteFailures int64 // appends that failed
}

// Stats reports the log's files and failures.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Repairs: s.mu.repairs, DroppedBytes: s.mu.dropped, WriteFailures: s.mu.failures}
	if ents, err := os.ReadDir(s.logDir(s.mu.base)); err == nil {
		for _, e := range ents {
			if !e.IsDir() && len(e.Name()) == 20 {
				st.Segments++
			}
		}
	}
	return st
}

// FirstIndex is the first index held, 0 when the log is empty.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.first, nil
}

// LastIndex is the last index held, 0 when the log is empty.
func (s *Store) LastIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.last, nil
}

// GetLog reads one entry.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.tw == nil {
		return errClosed
	}
	if s.mu.last == 0 || index < s.mu.first || index > s.mu.last {
		return ErrNotFound
	}
	if r := s.mu.recent; len(r) > 0 && index >= r[0].Index && index <= r[len(r)-1].Index {
		*l = *r[index-r[0].Index]
		return nil
	}
	data, err := s.mu.tw.Read(index - s.mu.base)
	if err != nil {
		return fmt.Errorf("wal: read %d: %w", index, err)
	}
	if _, err := decode(data, l); err != nil {
		return fmt.Errorf("%w: entry %d: %v", ErrCorrupt, index, err)
	}
	if l.Index != index {
		return fmt.Errorf("%w: entry at %d says index %d", ErrCorrupt, index, l.Index)
	}
	return nil
}

// StoreLog appends one entry.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs appends entries, contiguous with the log, in one write and one
// fsync.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.tw == nil {
		return errClosed
	}
	if s.mu.broken != nil {
		return s.mu.broken
	}
	if s.opts.BeforeWrite != nil {
		if err := s.opts.BeforeWrite(); err != nil {
			s.mu.failures++
			return fmt.Errorf("%w: %w", ErrAppendFailed, err)
		}
	}
	for i, l := range logs[1:] {
		if l.Index != logs[i].Index+1 {
			return fmt.Errorf("wal: entries %d and %d are not contiguous", logs[i].Index, l.Index)
		}
	}
	next := logs[0].Index
	switch {
	case s.mu.last == 0 && next != s.mu.base+1:
		// Empty, and raft continues elsewhere (after a snapshot).
		if next == 0 {
			return errors.New("wal: entry index 0")
		}
		if err := s.resetLocked(next - 1); err != nil {
			return err
		}
	case s.mu.last != 0 && next != s.mu.last+1:
		return fmt.Errorf("wal: entry %d does not follow the last, %d", next, s.mu.last)
	}
	var b twal.Batch
	s.mu.buf = s.mu.buf[:0]
	offs := make([]int, 0, len(logs)+1)
	for _, l := range logs {
		offs = append(offs, len(s.mu.buf))
		var err error
		if s.mu.buf, err = encode(s.mu.buf, next, l); err != nil {
			return err
		}
	}
	offs = append(offs, len(s.mu.buf))
	for i, l := range logs {
		b.Write(l.Index-s.mu.base, s.mu.buf[offs[i]:offs[i+1]])
	}
	if err := s.mu.tw.WriteBatch(&b); err != nil {
		return s.recoverWriteLocked(fmt.Errorf("wal: append %d-%d: %w", next, logs[len(logs)-1].Index, err))
	}
	if s.mu.last == 0 {
		s.mu.first = next
	}
	s.mu.last = logs[len(logs)-1].Index
	s.rememberLocked(logs)
	return nil
}

// rememberLocked keeps entries just appended among the recent ones.
func (s *Store) rememberLocked(logs []*raft.Log) {
	if r := s.mu.recent; len(r) > 0 && r[len(r)-1].Index+1 != logs[0].Index {
		s.forgetLocked()
	}
	for _, l := range logs {
		s.mu.recent = append(s.mu.recent, l)
		s.mu.recentBytes += len(l.Data) + len(l.Extensions)
	}
	drop := 0
	for len(s.mu.recent)-drop > recentMax || (s.mu.recentBytes > recentBytes && len(s.mu.recent)-drop > 1) {
		s.mu.recentBytes -= len(s.mu.recent[drop].Data) + len(s.mu.recent[drop].Extensions)
		drop++
	}
	if drop > 0 {
		s.mu.recent = append(s.mu.recent[:0:0], s.mu.recent[drop:]...)
	}
}

// forgetLocked drops the recent entries (the log was cut or replaced).
func (s *Store) forgetLocked() { s.mu.recent, s.mu.recentBytes = nil, 0 }

// DeleteRange deletes [min, max]: a prefix (compaction after a snapshot), a
// suffix (entries a new leader overrides), or everything.
//
// A suffix delete of entries the state machine applied (Options.AppliedIndex)
// is refused with ErrAppliedTruncated, and the store turns broken: see
// ErrAppliedTruncated.
func (s *Store) DeleteRange(min, max uint64) error {
	// Read before taking s.mu: the state machine's locks are its own. The
	// applied index only grows, so a value read early is at most the one at
	// the delete: the check never refuses a delete it should allow.
	var applied uint64
	if s.opts.AppliedIndex != nil {
		applied = s.opts.AppliedIndex()
	}
	fatal, err := s.deleteRange(min, max, applied)
	if fatal && s.opts.OnFatal != nil {
		// Outside s.mu: stopping the node may call back into the store
		// (raft's shutdown).
		s.opts.OnFatal(err)
	}
	return err
}

// deleteRange is DeleteRange under s.mu; fatal says OnFatal is due.
func (s *Store) deleteRange(min, max, applied uint64) (fatal bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.tw == nil {
		return false, errClosed
	}
	if errors.Is(s.mu.broken, ErrAppliedTruncated) {
		// The log is the evidence of what went wrong: nothing changes it.
		return false, s.mu.broken
	}
	if s.mu.last == 0 || max < s.mu.first || min > s.mu.last || min > max {
		return false, nil
	}
	first, last := s.mu.first, s.mu.last
	if s.opts.AppliedIndex != nil && min > first && max >= last && min <= applied {
		// A suffix, not a compaction nor the whole log after a snapshot.
		s.mu.broken = fmt.Errorf("%w: raft asked to delete %d-%d (the log holds %d-%d), but the state machine "+
			"applied through %d: raft only cuts entries never committed, so a voter lost entries it "+
			"acknowledged; the log is left as it was and the node stops", ErrAppliedTruncated, min, max, first, last, applied)
		s.opts.Logger.Error("wal: refusing to delete applied entries", "err", s.mu.broken)
		fatal, s.mu.fatal = !s.mu.fatal, true
		return fatal, s.mu.broken
	}
	s.forgetLocked()
	switch {
	case min <= first && max >= last:
		// Everything: the next entry continues after max (or after the
		// snapshot raft installs, which StoreLogs handles).
		return false, s.resetLocked(max)
	case min <= first:
		if err := s.mu.tw.TruncateFront(max + 1 - s.mu.base); err != nil {
			return false, fmt.Errorf("wal: drop through %d: %w", max, err)
		}
		s.mu.first = max + 1
	case max >= last:
		if err := s.mu.tw.TruncateBack(min - 1 - s.mu.base); err != nil {
			return false, fmt.Errorf("wal: drop from %d: %w", min, err)
		}
		s.mu.last = min - 1
	default:
		return false, fmt.Errorf("wal: delete %d-%d from the middle of %d-%d", min, max, first, last)
	}
	return false, nil
}

// IsMonotonic tells raft that the log holds no gaps: after restoring a
// snapshot it deletes every entry instead of leaving a gap.
func (s *Store) IsMonotonic() bool { return true }

var errClosed = errors.New("wal: closed")

// ErrAppendFailed wraps an append that failed and left the log as it was:
// nothing of it is in the log.
var ErrAppendFailed = errors.New("wal: append failed, nothing appended")

// ErrBroken is returned by every append after one that failed and could not
// be cut back: what the file holds is unknown until a restart repairs it.
var ErrBroken = errors.New("wal: broken after an unrecoverable i/o error; restart the node")

// ErrAppliedTruncated is returned by a suffix delete that reaches entries the
// state machine applied, and by every append and delete after it. Raft only
// cuts a suffix that was never committed, and only committed entries are
// applied: raft's assumptions broke (a voter forgot entries it acknowledged:
// a disk that lied about fsync, a log repaired or replaced by hand), and
// going on could diverge this node's state machine from the others'. Not
// retryable, and a restart does not fix it: the node stops
// (Options.OnFatal).
var ErrAppliedTruncated = errors.New("wal: refusing to delete entries the state machine applied")

// recoverWriteLocked puts the log back to what it held before a failed
// append: tidwall has taken the failed entries into its in-memory segment, so
// only a reopen from disk gets it back in step, and entries the write did
// get to disk are cut (raft was told the append failed, and will write
// those indexes again). If the file cannot be closed (its fsync failed too)
// or reopened, the log turns broken.
//
// REQUIRES: s.mu held.
func (s *Store) recoverWriteLocked(cause error) error {
	s.forgetLocked()
	s.mu.failures++
	first, last, base := s.mu.first, s.mu.last, s.mu.base
	closeErr := s.mu.tw.Close()
	s.mu.tw = nil
	if closeErr != nil && !errors.Is(closeErr, twal.ErrClosed) {
		s.mu.broken = fmt.Errorf("%w: %v, then sync on close failed (%v)", ErrBroken, cause, closeErr)
		return s.mu.broken
	}
	if err := s.openLocked(base); err != nil {
		s.mu.broken = fmt.Errorf("%w: %v, then reopen failed (%v)", ErrBroken, cause, err)
		return s.mu.broken
	}
	if s.mu.last > last {
		var err error
		if last == 0 {
			err = s.resetLocked(base)
		} else {
			err = s.mu.tw.TruncateBack(last - base)
		}
		if err != nil {
			s.mu.broken = fmt.Errorf("%w: %v, then cutting back failed (%v)", ErrBroken, cause, err)
			return s.mu.broken
		}
		s.mu.last = last
		if last == 0 {
			s.mu.first = 0
		}
	}
	if s.mu.first != first || s.mu.last != last {
		s.mu.broken = fmt.Errorf("%w: %v, and the log holds [%d, %d] after repair, want [%d, %d]",
			ErrBroken, cause, s.mu.first, s.mu.last, first, last)
		return s.mu.broken
	}
	s.opts.Logger.Warn("wal: append failed; log cut back to the last entry", "last", last, "err", cause)
	return fmt.Errorf("%w: %w", ErrAppendFailed, cause)
}

// Close closes the log.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.tw == nil {
		return nil
	}
	err := s.mu.tw.Close()
	s.mu.tw = nil
	return err
}

// Set stores one stable value, durably.
func (s *Store) Set(key, val []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string][]byte, len(s.mu.stable)+1)
	for k, v := range s.mu.stable {
		next[k] = v
	}
	next[string(key)] = append([]byte(nil), val...)
	data, err := msgpack.Marshal(next)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(s.dir, stableName), frame(nil, data)); err != nil {
		return fmt.Errorf("wal: write stable state: %w", err)
	}
	s.mu.stable = next
	return nil
}

// Get returns a stable value, empty when never set.
func (s *Store) Get(key []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.mu.stable[string(key)]...), nil
}

// SetUint64 stores a stable number.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns a stable number, 0 when never set.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, _ := s.Get(key)
	if len(v) == 0 {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: stable value %q of %d bytes", ErrCorrupt, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func (s *Store) loadStable() error {
	data, err := os.ReadFile(filepath.Join(s.dir, stableName))
	if errors.Is(err, fs.ErrNotExist) {
		s.mu.stable = map[string][]byte{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("wal: read stable state: %w", err)
	}
	body, _, err := unframe(data)
	if err != nil {
		// Written whole or not at all (atomicfile): damage is not a torn
		// write, and a lost vote could let this node vote twice in a term.
		return fmt.Errorf("%w: stable state: %v", ErrCorrupt, err)
	}
	m := map[string][]byte{}
	if err := msgpack.Unmarshal(body, &m); err != nil {
		return fmt.Errorf("%w: stable state: %v", ErrCorrupt, err)
	}
	s.mu.stable = m
	return nil
}
