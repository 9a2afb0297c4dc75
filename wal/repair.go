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

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/segfile"
)

// CorruptError locates damage in the raft log that is not a torn tail: Open
// refuses to start on it and changes nothing on disk.
type CorruptError struct {
	Segment string // the segment file's path
	Offset  int64  // byte offset in Segment of the first damaged record
	Index   uint64 // raft index of the first damaged entry
	Err     error  // what is wrong there, and why it is not a torn tail
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("wal: corrupt entry %d at byte %d of %s: %v (not a torn tail: refusing to start; "+
		"see docs/OPERATIONS.md \"A torn or damaged raft log\")", e.Index, e.Offset, e.Segment, e.Err)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// repairTail makes a log directory openable after a crash: tidwall refuses
// a segment whose last entry is torn.
//
// Only the last append can be torn: each StoreLogs is one write and one
// fsync, and raft is told an append is stored only after its fsync. Only the
// last segment can hold it: tidwall fsyncs a segment before it starts the
// next. So damage in the last segment is cut as a torn tail when nothing
// written later survives after it; a whole record of a later append after
// the damage (laterRecord) means the damaged bytes were fsynced, and entries
// this node acknowledged would go with a cut: that, and damage in any other
// segment, is corruption (*CorruptError), and nothing is changed.
func repairTail(dir string, base uint64, logger *slog.Logger) (dropped int64, err error) {
	if err := segfile.FinishPendingTruncation(dir); err != nil {
		return 0, fmt.Errorf("wal: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("wal: list %s: %w", dir, err)
	}
	type seg struct {
		name  string
		first uint64
	}
	var segs []seg
	for _, e := range ents {
		if e.IsDir() || len(e.Name()) != 20 {
			continue
		}
		if i, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && i > 0 {
			segs = append(segs, seg{e.Name(), i})
		}
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].first < segs[j].first })
	for i, s := range segs {
		path := filepath.Join(dir, s.name)
		data, err := os.ReadFile(path)
		if err != nil {
			return 0, fmt.Errorf("wal: read %s: %w", path, err)
		}
		n, good, problem := scan(data, base+s.first)
		if problem == nil {
			continue
		}
		damaged := base + s.first + uint64(n)
		if i < len(segs)-1 {
			return 0, &CorruptError{Segment: path, Offset: int64(good), Index: damaged,
				Err: fmt.Errorf("%v; a later segment follows, and tidwall synced this one before starting it", problem)}
		}
		if off, idx, first, later := laterRecord(data[good:], damaged); later {
			return 0, &CorruptError{Segment: path, Offset: int64(good), Index: damaged, Err: fmt.Errorf(
				"%v; entry %d, written by a later append (from index %d), follows whole at byte %d: "+
					"the damage was synced before it, and is not a torn write", problem, idx, first, good+off)}
		}
		logger.Warn("wal: torn tail repaired", "segment", path, "first_bad_index", damaged,
			"offset", good, "dropped_bytes", len(data)-good, "problem", problem.Error())
		if err := segfile.TruncateSync(path, int64(good)); err != nil {
			return 0, fmt.Errorf("wal: repair %s: %w", path, err)
		}
		dropped += int64(len(data) - good)
	}
	return dropped, nil
}

// scan walks tidwall's binary framing (uvarint length, data) and the
// records inside: how many are whole, the bytes they cover, and what
// stopped it (nil at a clean end).
func scan(data []byte, first uint64) (n, good int, problem error) {
	var l raft.Log
	for pos := 0; pos < len(data); {
		size, w := binary.Uvarint(data[pos:])
		if w <= 0 {
			return n, good, errors.New("unreadable length prefix")
		}
		if size > uint64(len(data)-pos-w) {
			return n, good, fmt.Errorf("entry of %d bytes runs past the end of the file", size)
		}
		if _, err := decode(data[pos+w:pos+w+int(size)], &l); err != nil {
			return n, good, err
		}
		if want := first + uint64(n); l.Index != want {
			return n, good, fmt.Errorf("entry says index %d, position says %d", l.Index, want)
		}
		pos += w + int(size)
		n++
		good = pos
	}
	return n, good, nil
}

// laterRecord looks, at every byte offset of rest (what follows the last
// whole record of the last segment), for a whole, valid version 2 record
// written by an append that began after index damaged (the first entry the
// damage hit): its offset in rest, its index and its append's first index.
// Records of the damaged append itself (first <= damaged) do not count: that
// append may span several pages, of which some reached the disk and some did
// not. Version 1 records do not count either: they do not say which append
// wrote them.
func laterRecord(rest []byte, damaged uint64) (off int, index, first uint64, found bool) {
	// A record of index k after the damage has the records of damaged..k-1
	// before it in the file, each longer than one byte: k - damaged is
	// below len(rest). That bound throws out nearly every offset before the
	// checksum is computed.
	limit := uint64(len(rest))
	var l raft.Log
	for off := 0; off < len(rest); off++ {
		size, w := binary.Uvarint(rest[off:])
		if w <= 0 || size < headerV2 || size > uint64(len(rest)-off-w) {
			continue
		}
		rec := rest[off+w : off+w+int(size)]
		if rec[0] != recordV2 {
			continue
		}
		f := binary.BigEndian.Uint64(rec[headerV1:])
		if f <= damaged || f-damaged >= limit {
			continue
		}
		// decode checks the checksum, the body, and first <= index.
		if _, err := decode(rec, &l); err != nil || l.Index-damaged >= limit {
			continue
		}
		return off, l.Index, f, true
	}
	return 0, 0, 0, false
}
