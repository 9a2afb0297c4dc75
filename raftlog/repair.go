package raftlog

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

// repairTail makes a log directory openable after a crash: tidwall refuses
// a segment whose last entry is torn. An entry is appended and fsynced
// before raft is told it is stored, so a damaged last segment's tail was
// never acknowledged and is cut; damage anywhere else is corruption.
func repairTail(dir string, base uint64, logger *slog.Logger) (dropped int64, err error) {
	if err := segfile.FinishPendingTruncation(dir); err != nil {
		return 0, fmt.Errorf("raftlog: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("raftlog: list %s: %w", dir, err)
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
			return 0, fmt.Errorf("raftlog: read %s: %w", path, err)
		}
		n, good, problem := scan(data, base+s.first)
		if problem == nil {
			continue
		}
		if i < len(segs)-1 {
			return 0, fmt.Errorf("%w: segment %s, entry %d: %v", ErrCorrupt, path, base+s.first+uint64(n), problem)
		}
		logger.Warn("raftlog: torn tail repaired", "segment", path, "first_bad_index", base+s.first+uint64(n),
			"dropped_bytes", len(data)-good, "problem", problem.Error())
		if err := segfile.TruncateSync(path, int64(good)); err != nil {
			return 0, fmt.Errorf("raftlog: repair %s: %w", path, err)
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
		if err := decode(data[pos+w:pos+w+int(size)], &l); err != nil {
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
