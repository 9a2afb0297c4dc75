// Package legacywal reads the outbound write-ahead log of a build before
// the cluster's log (docs/CLUSTER.md): a data directory of such a build has
// a wal/ directory beside its store, which the node migrates into its tree
// once, at its first start on this build. Nothing writes this format any
// more; this package only opens and reads it.
//
// The format, on tidwall/wal:
//
//   - each entry is framed as version(1) | CRC-32C(4) | msgpack payload
//     (version 2 adds the first index of its append) and verified on read;
//   - a crash could tear the tail, and tidwall's Open then fails with
//     ErrCorrupt: Open scans the segments itself first, truncates a torn or
//     checksum-failing tail back to the last valid entry (logged), and
//     refuses to open on damage before the last segment, naming the segment
//     and index;
//   - tidwall's Open writes defaults into the options it is given: it only
//     ever sees a private copy.
//
// The log directory holds STREAM (the stream ID) and segments/ (tidwall's
// files).
package legacywal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	twal "github.com/tidwall/wal"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/options"
	"github.com/replicator/replicator/internal/segfile"
	"github.com/replicator/replicator/wire"
)

// Frames. Version 2, written now:
//
//	2 | CRC-32C(first || payload) | first(8, big-endian) | payload
//
// where first is the index of the first entry of the append the frame was
// written by: a torn write is confined to the last append, so valid frames
// found after damage tell a torn tail (they belong to that same append)
// from corruption (a later append completed after the damaged one).
// Version 1 (version | CRC-32C(payload) | payload) is still read.
const (
	frameV1       = 1
	frameV2       = 2
	frameHeaderV1 = 1 + 4
	frameHeaderV2 = 1 + 4 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is the class of errors for damage the log cannot repair (before
// the tail, or a missing stream file). Never retryable.
var ErrCorrupt = errors.New("legacywal: corrupt")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("legacywal: closed")

// ErrNotFound is returned for an index outside [First, Last].
var ErrNotFound = errors.New("legacywal: index not in the log")

// CorruptError locates damage the log refuses to repair.
type CorruptError struct {
	Segment string // file name
	Index   uint64 // the first index that failed
	Err     error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("legacywal: corrupt entry %d in segment %s: %v (not a torn tail: refusing to start; "+
		"move the WAL directory aside and restart, the node then begins a new stream and rejoins its peers, "+
		"see docs/OPERATIONS.md \"A damaged WAL\")", e.Index, e.Segment, e.Err)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Options configures a Log. Zero fields take defaults.
type Options struct {
	// Origin is the local cluster ID. Encoded entries of the local stream
	// leave it out. Required.
	Origin string
	// SegmentSize is the target size of one segment file. tidwall/wal holds
	// the tail segment and SegmentCacheSize others in memory whole, so this
	// bounds the log's memory. Default 8 MiB.
	SegmentSize int
	// SegmentCacheSize is how many non-tail segments stay in memory for
	// readers. Default 2.
	SegmentCacheSize int
	// Logger receives repairs. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.SegmentSize == 0 {
		o.SegmentSize = 8 << 20
	}
	if o.SegmentCacheSize == 0 {
		o.SegmentCacheSize = 2
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Origin == "" {
		errs = append(errs, errors.New("legacywal: Origin is required"))
	}
	if o.SegmentSize < 4096 {
		errs = append(errs, fmt.Errorf("legacywal: SegmentSize %d is below 4096", o.SegmentSize))
	}
	if o.SegmentCacheSize < 1 {
		errs = append(errs, fmt.Errorf("legacywal: SegmentCacheSize %d is below 1", o.SegmentCacheSize))
	}
	return errors.Join(errs...)
}

// Log is an old directory's WAL, open for reading.
type Log struct {
	dir    string
	segDir string
	stream entry.StreamID
	opts   Options
	defs   wire.Defaults

	mu     sync.RWMutex
	tw     *twal.Log
	closed bool

	first atomic.Uint64
	last  atomic.Uint64

	repairs, dropped atomic.Int64
}

// ErrEmpty: the directory holds no stream (a WAL its build never began).
var ErrEmpty = errors.New("legacywal: no stream in the directory")

// Open opens the WAL in dir, repairing a torn tail. A directory without a
// stream file or segments is ErrEmpty.
func Open(dir string, opts *Options) (*Log, error) {
	o, err := options.Resolve(opts)
	if err != nil {
		return nil, err
	}
	l := &Log{
		dir:    dir,
		segDir: filepath.Join(dir, "segments"),
		opts:   o,
	}
	stream, err := l.loadStream()
	if err != nil {
		return nil, err
	}
	l.stream = stream
	l.defs = wire.Defaults{Origin: o.Origin, Stream: stream}
	if err := l.openTidwall(-1); err != nil {
		return nil, err
	}
	return l, nil
}

const streamFile = "STREAM"

func (l *Log) loadStream() (entry.StreamID, error) {
	path := filepath.Join(l.dir, streamFile)
	b, err := os.ReadFile(path)
	if err == nil {
		s, perr := entry.ParseStreamID(strings.TrimSpace(string(b)))
		if perr != nil {
			return s, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, perr)
		}
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return entry.StreamID{}, fmt.Errorf("legacywal: read %s: %w", path, err)
	}
	segs, err := listSegments(l.segDir)
	if err != nil {
		return entry.StreamID{}, err
	}
	if len(segs) > 0 {
		return entry.StreamID{}, fmt.Errorf("%w: %s is missing but %s holds segments; "+
			"the entries cannot be named, remove the WAL directory to start a new stream", ErrCorrupt, path, l.segDir)
	}
	return entry.StreamID{}, fmt.Errorf("%w: %s", ErrEmpty, l.dir)
}

// openTidwall verifies and repairs the segments, then opens tidwall on them.
// keep >= 0 also cuts every entry after index keep (used after a failed
// write, whose entries nobody was told are durable); keep < 0 keeps all.
func (l *Log) openTidwall(keep int64) error {
	if err := os.MkdirAll(l.segDir, 0o755); err != nil {
		return fmt.Errorf("legacywal: open %s: %w", l.segDir, err)
	}
	if err := segfile.FinishPendingTruncation(l.segDir); err != nil {
		return fmt.Errorf("legacywal: %w", err)
	}
	if err := l.verifyAndRepair(keep); err != nil {
		return err
	}
	tw, err := twal.Open(l.segDir, &twal.Options{
		SegmentSize:      l.opts.SegmentSize,
		SegmentCacheSize: l.opts.SegmentCacheSize,
		NoSync:           true, // it is only read (a repair syncs its own truncation)
		NoCopy:           true,
		AllowEmpty:       true,
		LogFormat:        twal.Binary,
		DirPerms:         0o755,
		FilePerms:        0o644,
	})
	if err != nil {
		return fmt.Errorf("legacywal: open segments in %s: %w", l.segDir, err)
	}
	first, err1 := tw.FirstIndex()
	last, err2 := tw.LastIndex()
	if err := errors.Join(err1, err2); err != nil {
		tw.Close()
		return fmt.Errorf("legacywal: open %s: %w", l.segDir, err)
	}
	l.tw = tw
	l.first.Store(first)
	l.last.Store(last)
	return nil
}

type segFile struct {
	name  string
	first uint64
}

func listSegments(segDir string) ([]segFile, error) {
	ents, err := os.ReadDir(segDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("legacywal: list %s: %w", segDir, err)
	}
	var segs []segFile
	for _, e := range ents {
		name := e.Name()
		if len(name) != 20 || e.IsDir() {
			continue
		}
		idx, err := strconv.ParseUint(name, 10, 64)
		if err != nil || idx == 0 {
			continue
		}
		segs = append(segs, segFile{name: name, first: idx})
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].first < segs[j].first })
	return segs, nil
}

// scanSegment walks tidwall's binary framing (uvarint length, data) and our
// frame inside it. It returns how many entries are whole and valid, the byte
// length they cover, and the problem that stopped it (nil at a clean end).
func scanSegment(data []byte, first uint64) (n int, good int, problem error) {
	return scanSegmentSizes(data, first, nil)
}

// scanSegmentSizes is scanSegment telling onEntry the on-disk size of each
// valid entry.
func scanSegmentSizes(data []byte, first uint64, onEntry func(size int)) (n int, good int, problem error) {
	for pos := 0; pos < len(data); {
		size, w := binary.Uvarint(data[pos:])
		if w <= 0 {
			return n, good, errors.New("unreadable length prefix")
		}
		if size > uint64(len(data)-pos-w) {
			return n, good, fmt.Errorf("entry of %d bytes runs past the end of the file", size)
		}
		frame := data[pos+w : pos+w+int(size)]
		payload, _, err := unframe(frame)
		if err != nil {
			return n, good, err
		}
		if idx, ok := peekIndex(payload); !ok || idx != first+uint64(n) {
			return n, good, fmt.Errorf("entry says index %d, position says %d", idx, first+uint64(n))
		}
		if onEntry != nil {
			onEntry(w + int(size))
		}
		pos += w + int(size)
		n++
		good = pos
	}
	return n, good, nil
}

// verifyAndRepair scans every segment. Damage in the last segment is a torn
// tail: cut back to the last valid entry. Damage anywhere else refuses.
// keep >= 0 additionally cuts every entry after index keep.
func (l *Log) verifyAndRepair(keep int64) error {
	segs, err := listSegments(l.segDir)
	if err != nil {
		return err
	}
	if keep >= 0 {
		// Segments that start past keep hold only entries of the failed
		// write; the first segment stays (emptied below) so the log keeps
		// its position.
		for len(segs) > 1 && int64(segs[len(segs)-1].first) > keep {
			last := segs[len(segs)-1]
			if err := os.Remove(filepath.Join(l.segDir, last.name)); err != nil {
				return fmt.Errorf("legacywal: drop unacknowledged segment %s: %w", last.name, err)
			}
			segs = segs[:len(segs)-1]
		}
	}
	for i, s := range segs {
		path := filepath.Join(l.segDir, s.name)
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("legacywal: read segment %s: %w", path, err)
		}
		n, good, problem := scanSegment(data, s.first)
		if i < len(segs)-1 {
			if problem != nil {
				return &CorruptError{Segment: s.name, Index: s.first + uint64(n), Err: problem}
			}
			if next := segs[i+1].first; s.first+uint64(n) != next {
				return &CorruptError{Segment: s.name, Index: s.first + uint64(n),
					Err: fmt.Errorf("segment holds %d entries but the next segment starts at %d", n, next)}
			}
			continue
		}
		if problem != nil {
			damaged := s.first + uint64(n)
			if idx, first, later := laterWrite(data[good:], damaged); later {
				return &CorruptError{Segment: s.name, Index: damaged, Err: fmt.Errorf(
					"%v; entry %d, written by a later append (from index %d), follows whole: "+
						"the damage is not a torn write", problem, idx, first)}
			}
			l.opts.Logger.Warn("legacywal: torn tail repaired", "segment", s.name,
				"first_bad_index", s.first+uint64(n), "kept_bytes", good, "dropped_bytes", len(data)-good,
				"problem", problem.Error())
			l.repairs.Add(1)
			l.dropped.Add(int64(len(data) - good))
		}
		if keep >= 0 {
			if want := keep + 1 - int64(s.first); want < int64(n) {
				if want < 0 {
					want = 0
				}
				good = frameEnd(data, int(want))
			}
		}
		if good < len(data) {
			if err := segfile.TruncateSync(path, int64(good)); err != nil {
				return fmt.Errorf("legacywal: repair segment %s: %w", path, err)
			}
		}
	}
	return nil
}

// frameEnd returns the byte offset after the first k entries of a segment
// already known to hold at least k valid entries.
func frameEnd(data []byte, k int) int {
	pos := 0
	for i := 0; i < k; i++ {
		size, w := binary.Uvarint(data[pos:])
		pos += w + int(size)
	}
	return pos
}

// appendFrame appends a version 2 frame of the payload fill produces, for
// an entry of the append that begins at index first.
func appendFrame(dst []byte, first uint64, fill func([]byte) []byte) []byte {
	start := len(dst)
	dst = append(dst, frameV2, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint64(dst, first)
	dst = fill(dst)
	crc := crc32.Checksum(dst[start+5:], castagnoli)
	binary.BigEndian.PutUint32(dst[start+1:], crc)
	return dst
}

// unframe checks a frame and returns its payload and the first index of the
// append that wrote it (0 for a version 1 frame, which does not say).
func unframe(frame []byte) ([]byte, uint64, error) {
	if len(frame) < frameHeaderV1 {
		return nil, 0, fmt.Errorf("frame of %d bytes", len(frame))
	}
	var payload, covered []byte
	var first uint64
	switch frame[0] {
	case frameV1:
		payload, covered = frame[frameHeaderV1:], frame[frameHeaderV1:]
	case frameV2:
		if len(frame) < frameHeaderV2 {
			return nil, 0, fmt.Errorf("frame of %d bytes", len(frame))
		}
		payload, covered = frame[frameHeaderV2:], frame[5:]
		first = binary.BigEndian.Uint64(frame[5:])
	default:
		return nil, 0, fmt.Errorf("frame version %d, want %d or %d", frame[0], frameV1, frameV2)
	}
	if got, want := crc32.Checksum(covered, castagnoli), binary.BigEndian.Uint32(frame[1:]); got != want {
		return nil, 0, fmt.Errorf("checksum mismatch (crc32c %08x, frame says %08x)", got, want)
	}
	return payload, first, nil
}

// laterWrite looks, at every byte offset of data (what follows damage in
// the last segment), for a whole, valid frame written by an append that
// began after index damaged (the first entry the damage hit). Such a frame
// means a later write completed after the damaged one: the damage is not a
// torn tail. Frames of the damaged append itself (which may span several
// pages, some of which reached the disk) do not count.
func laterWrite(data []byte, damaged uint64) (index, first uint64, found bool) {
	for off := 0; off < len(data); off++ {
		size, w := binary.Uvarint(data[off:])
		if w <= 0 || size < frameHeaderV2+4 || size > uint64(len(data)-off-w) {
			continue
		}
		frame := data[off+w : off+w+int(size)]
		if frame[0] != frameV2 {
			continue
		}
		idx, ok := peekIndex(frame[frameHeaderV2:])
		if !ok {
			continue
		}
		payload, f, err := unframe(frame)
		if err != nil || len(payload) == 0 || f > idx {
			continue
		}
		if f > damaged {
			return idx, f, true
		}
	}
	return 0, 0, false
}

// peekIndex reads the "i" field that every encoded entry starts with, without
// decoding the rest.
func peekIndex(p []byte) (uint64, bool) {
	// fixmap header, then fixstr "i".
	if len(p) < 4 || p[0]&0xf0 != 0x80 || p[1] != 0xa1 || p[2] != 'i' {
		return 0, false
	}
	c, rest := p[3], p[4:]
	switch {
	case c <= 0x7f:
		return uint64(c), true
	case c == 0xcc && len(rest) >= 1:
		return uint64(rest[0]), true
	case c == 0xcd && len(rest) >= 2:
		return uint64(binary.BigEndian.Uint16(rest)), true
	case c == 0xce && len(rest) >= 4:
		return uint64(binary.BigEndian.Uint32(rest)), true
	case c == 0xcf && len(rest) >= 8:
		return binary.BigEndian.Uint64(rest), true
	}
	return 0, false
}

// Stream returns the log's stream ID.
func (l *Log) Stream() entry.StreamID { return l.stream }

// Defaults returns what encoded entries of this log leave out.
func (l *Log) Defaults() wire.Defaults { return l.defs }

// First returns the first retained index (Last()+1 when the log is empty).
func (l *Log) First() uint64 { return l.first.Load() }

// Last returns the last written index, 0 before the first write.
func (l *Log) Last() uint64 { return l.last.Load() }

// ReadRaw returns the verified payload (the msgpack entry) at index. The
// bytes are shared with the log's segment cache: do not modify them.
func (l *Log) ReadRaw(index uint64) ([]byte, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return nil, ErrClosed
	}
	if index < l.first.Load() || index > l.last.Load() {
		return nil, fmt.Errorf("%w: %d (first %d, last %d)", ErrNotFound, index, l.first.Load(), l.last.Load())
	}
	frame, err := l.tw.Read(index)
	if errors.Is(err, twal.ErrNotFound) {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, index)
	}
	if err != nil {
		return nil, fmt.Errorf("legacywal: read %d: %w", index, err)
	}
	payload, _, err := unframe(frame)
	if err != nil {
		return nil, &CorruptError{Segment: "(in memory)", Index: index, Err: err}
	}
	return payload, nil
}

// Read returns the decoded entry at index. Not safe for concurrent use with
// other Read calls on the same codec: pass one codec per goroutine.
func (l *Log) Read(c *wire.Codec, index uint64) (entry.Entry, error) {
	p, err := l.ReadRaw(index)
	if err != nil {
		return entry.Entry{}, err
	}
	e, err := c.DecodeEntry(p, l.defs)
	if err != nil {
		return e, &CorruptError{Segment: "(in memory)", Index: index, Err: err}
	}
	if e.Index != index {
		return e, &CorruptError{Segment: "(in memory)", Index: index, Err: fmt.Errorf("entry says index %d", e.Index)}
	}
	return e, nil
}

// Repaired reports whether Open cut a torn tail, and how many bytes it
// dropped: the migration logs it.
func (l *Log) Repaired() (bool, int64) { return l.repairs.Load() > 0, l.dropped.Load() }

// Close closes the log.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if err := l.tw.Close(); err != nil {
		return fmt.Errorf("legacywal: close: %w", err)
	}
	return nil
}
