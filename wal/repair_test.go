package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	twal "github.com/tidwall/wal"
)

// quiet swallows the repairs' warnings of tests that make many.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// rec is one record of a segment file as the test reads it, from the
// framing and the header bytes (not through the package's decoder).
type rec struct {
	start, end int    // byte span in the file, length prefix included
	index      uint64 // by position: the segment's first index + ordinal
	version    byte
	first      uint64 // version 2: the first index of the append that wrote it
}

// layout reads the records of a segment of a log whose base is 0.
func layout(t testing.TB, path string) []rec {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	segFirst, err := strconv.ParseUint(filepath.Base(path), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	var out []rec
	for pos := 0; pos < len(data); {
		size, w := binary.Uvarint(data[pos:])
		if w <= 0 || size < headerV1 || size > uint64(len(data)-pos-w) {
			t.Fatalf("%s: bad framing at byte %d", path, pos)
		}
		r := rec{start: pos, end: pos + w + int(size), index: segFirst + uint64(len(out)), version: data[pos+w]}
		if r.version == recordV2 {
			r.first = binary.BigEndian.Uint64(data[pos+w+headerV1:])
		}
		out = append(out, r)
		pos = r.end
	}
	return out
}

// appendOnce stores entries from-to in one StoreLogs call: one append.
func appendOnce(t testing.TB, s *Store, from, to uint64) {
	t.Helper()
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, entry(i))
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
}

// holdsPrefix checks the log holds exactly entries 1-kept (none for 0).
func holdsPrefix(t *testing.T, s *Store, kept uint64) {
	t.Helper()
	if kept == 0 {
		holds(t, s, 0, 0)
		return
	}
	holds(t, s, 1, kept)
}

// writeV1 writes entries from-to as the previous build did: version 1
// records, one tidwall batch per 7 entries.
func writeV1(t *testing.T, dir string, segSize int, from, to uint64) {
	t.Helper()
	tw, err := twal.Open(filepath.Join(dir, fmt.Sprintf("%s%020d", dirPrefix, 0)), &twal.Options{
		SegmentSize: segSize, LogFormat: twal.Binary, NoCopy: true, AllowEmpty: true})
	if err != nil {
		t.Fatal(err)
	}
	var b twal.Batch
	for i := from; i <= to; i++ {
		b.Write(i, frame(nil, appendBody(nil, entry(i))))
		if (i-from)%7 == 6 || i == to {
			if err := tw.WriteBatch(&b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// refusedAt checks that opening dir fails as corruption at the record r of
// the segment at path, and that the segment still holds data.
func refusedAt(t *testing.T, dir, path string, r rec, data []byte) {
	t.Helper()
	_, err := Open(dir, &Options{SegmentSize: 4096, Logger: quiet})
	var ce *CorruptError
	if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
		t.Fatalf("open: %v, want a *CorruptError", err)
	}
	if ce.Segment != path || ce.Offset != int64(r.start) || ce.Index != r.index {
		t.Fatalf("the error names %s byte %d entry %d; the damage is in %s at byte %d, entry %d",
			ce.Segment, ce.Offset, ce.Index, path, r.start, r.index)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, data) {
		t.Fatal("a refused open changed the segment")
	}
}

// TestBitFlipBeforeLaterAppendRefused: a flipped bit in the last segment,
// with whole records of later appends after it, is not a torn write (those
// appends were fsynced after it, and raft was told they were stored): Open
// refuses, says where and why, and cuts nothing.
func TestBitFlipBeforeLaterAppendRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	store(t, s, 1, 300) // appends of 7 entries
	s.Close()
	if segs, _ := filepath.Glob(filepath.Join(dir, "log-*", "0*")); len(segs) < 3 {
		t.Fatalf("want several segments, have %d", len(segs))
	}
	path := lastSegment(t, dir)
	recs := layout(t, path)
	victim := recs[len(recs)/3]
	if last := recs[len(recs)-1]; victim.first >= last.first {
		t.Fatalf("entry %d is of the last append (from %d)", victim.index, last.first)
	}
	data, _ := os.ReadFile(path)
	data[victim.end-2] ^= 0x10
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	refusedAt(t, dir, path, victim, data)
	_, err := Open(dir, &Options{SegmentSize: 4096, Logger: quiet})
	for _, want := range []string{path, fmt.Sprintf("byte %d", victim.start), "not a torn", "later append",
		`docs/OPERATIONS.md "A torn or damaged raft log"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}

// TestDamagedMiddleSegmentLocated: damage before the last segment is
// corruption, located by file and offset.
func TestDamagedMiddleSegmentLocated(t *testing.T) {
	dir, segs := severalSegments(t)
	path := segs[1]
	recs := layout(t, path)
	victim := recs[len(recs)-1] // the segment's last record: nothing of it follows in this file
	data, _ := os.ReadFile(path)
	data[victim.end-1] ^= 0x01
	os.WriteFile(path, data, 0o644)
	refusedAt(t, dir, path, victim, data)
}

// TestTornLastAppendRepaired: damage confined to the last append is a torn
// tail, whatever of that append reached the disk after it (an append spans
// several pages, and segments): the log holds exactly the entries before the
// damage and takes appends again.
func TestTornLastAppendRepaired(t *testing.T) {
	for _, segSize := range []int{4096, 1 << 20} { // the last append spans segments; pages of one
		for _, kind := range []string{"truncated", "bit flipped", "zeroed"} {
			t.Run(fmt.Sprintf("%s/%d", kind, segSize), func(t *testing.T) {
				dir := t.TempDir()
				opts := &Options{SegmentSize: segSize, Logger: quiet}
				s, err := Open(dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				store(t, s, 1, 50)
				appendOnce(t, s, 51, 400)
				s.Close()
				path := lastSegment(t, dir)
				recs := layout(t, path)
				victim := recs[len(recs)/2]
				if victim.first != 51 || recs[len(recs)-1].first != 51 {
					t.Fatalf("entry %d (append from %d) is not of the last append", victim.index, victim.first)
				}
				data, _ := os.ReadFile(path)
				switch kind {
				case "truncated":
					data = data[:(victim.start+victim.end)/2]
				case "bit flipped":
					data[victim.end-2] ^= 0x04
				case "zeroed": // a page that did not reach the disk, with later ones that did
					clear(data[victim.start+1 : min(victim.start+4096, recs[len(recs)-2].start)])
				}
				if err := os.WriteFile(path, data, 0o644); err != nil {
					t.Fatal(err)
				}
				s, err = Open(dir, opts)
				if err != nil {
					t.Fatalf("a torn last append refused: %v", err)
				}
				defer s.Close()
				kept := victim.index - 1
				holds(t, s, 1, kept)
				if st := s.Stats(); st.Repairs != 1 || st.DroppedBytes != int64(len(data)-victim.start) {
					t.Fatalf("stats %+v, want 1 repair of %d bytes", st, len(data)-victim.start)
				}
				store(t, s, kept+1, kept+10)
				holds(t, s, 1, kept+10)
				s.Close()
				s, err = Open(dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				holds(t, s, 1, kept+10)
			})
		}
	}
}

// TestVersion1Log: a log the previous build wrote (version 1 records, which
// do not say which append wrote them) opens and reads; appends after it are
// version 2; damage in a version 1 tail is a torn tail unless a version 2
// record of a later append follows it.
func TestVersion1Log(t *testing.T) {
	t.Run("read and extended", func(t *testing.T) {
		dir := t.TempDir()
		writeV1(t, dir, 4096, 1, 120)
		s := open(t, dir)
		holds(t, s, 1, 120)
		store(t, s, 121, 160) // appends from 121, 128, 135, ...
		holds(t, s, 1, 160)
		s.Close()
		segs, _ := filepath.Glob(filepath.Join(dir, "log-*", "0*"))
		if len(segs) < 2 {
			t.Fatalf("want several segments, have %d", len(segs))
		}
		n := 0
		for _, path := range segs {
			for _, r := range layout(t, path) {
				n++
				switch {
				case r.index <= 120 && r.version != recordV1:
					t.Fatalf("entry %d of the old log is now version %d", r.index, r.version)
				case r.index > 120 && (r.version != recordV2 || r.first != 121+(r.index-121)/7*7):
					t.Fatalf("entry %d written as version %d of an append from %d", r.index, r.version, r.first)
				}
			}
		}
		if n != 160 {
			t.Fatalf("the segments hold %d records", n)
		}
		holds(t, open(t, dir), 1, 160)
	})
	t.Run("torn tail", func(t *testing.T) {
		dir := t.TempDir()
		writeV1(t, dir, 1<<20, 1, 40)
		path := lastSegment(t, dir)
		victim := layout(t, path)[29]
		data, _ := os.ReadFile(path)
		data[victim.end-2] ^= 0x20 // entries 31-40 follow whole, and say nothing of their appends
		os.WriteFile(path, data, 0o644)
		s, err := Open(dir, &Options{SegmentSize: 1 << 20, Logger: quiet})
		if err != nil {
			t.Fatalf("damage in a version 1 tail refused: %v", err)
		}
		defer s.Close()
		holds(t, s, 1, 29)
		if st := s.Stats(); st.Repairs != 1 {
			t.Fatalf("repairs %d", st.Repairs)
		}
	})
	t.Run("damage before a later append", func(t *testing.T) {
		dir := t.TempDir()
		writeV1(t, dir, 1<<20, 1, 40)
		s, err := Open(dir, &Options{SegmentSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		store(t, s, 41, 50)
		s.Close()
		path := lastSegment(t, dir)
		victim := layout(t, path)[29]
		data, _ := os.ReadFile(path)
		data[victim.end-2] ^= 0x20
		os.WriteFile(path, data, 0o644)
		refusedAt(t, dir, path, victim, data)
	})
}

// TestRandomDamageInLastSegment truncates, flips a byte of, or zeroes a
// range of the last segment of logs written by appends of random sizes. A
// torn tail is repaired to exactly the entries before the first damaged
// record, which holds every entry of every append before the damaged one;
// the damage is refused as corruption exactly when a whole record of a
// later append survives after it.
func TestRandomDamageInLastSegment(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 15))
	rounds := 120
	if testing.Short() {
		rounds = 30
	}
	var refused, repaired, clean int
	for round := 0; round < rounds; round++ {
		dir := t.TempDir()
		opts := &Options{SegmentSize: 4096, Logger: quiet}
		if round%4 == 3 {
			opts.SegmentSize = 1 << 16
		}
		firstOf := map[uint64]uint64{} // index -> first index of its append
		next := uint64(1)
		batch := func(s *Store) {
			k := uint64(1 + rng.IntN(25))
			appendOnce(t, s, next, next+k-1)
			for i := next; i < next+k; i++ {
				firstOf[i] = next
			}
			next += k
		}
		s, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		for total := uint64(60 + rng.IntN(200)); next <= total; {
			batch(s)
		}
		s.Close()
		path := lastSegment(t, dir)
		for fi, _ := os.Stat(path); fi.Size() == 0; fi, _ = os.Stat(path) {
			// tidwall started a segment the last append did not reach.
			if s, err = Open(dir, opts); err != nil {
				t.Fatal(err)
			}
			batch(s)
			s.Close()
			path = lastSegment(t, dir)
		}
		recs := layout(t, path)
		for _, r := range recs {
			if r.version != recordV2 || r.first != firstOf[r.index] {
				t.Fatalf("entry %d: version %d record of an append from %d; it was appended from %d",
					r.index, r.version, r.first, firstOf[r.index])
			}
		}
		orig, _ := os.ReadFile(path)
		data := bytes.Clone(orig)
		var what string
		switch rng.IntN(3) {
		case 0:
			off := rng.IntN(len(data))
			data, what = data[:off], fmt.Sprintf("cut at %d", off)
		case 1:
			off := rng.IntN(len(data))
			data[off] ^= byte(1 + rng.IntN(255))
			what = fmt.Sprintf("byte %d flipped", off)
		case 2:
			a := rng.IntN(len(data))
			b := min(len(data), a+1+rng.IntN(4096))
			clear(data[a:b])
			what = fmt.Sprintf("bytes %d-%d zeroed", a, b)
		}
		what = fmt.Sprintf("seed %d round %d: %s of %s (%d bytes)", seed, round, what, path, len(orig))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		intact := func(r rec) bool { return r.end <= len(data) && bytes.Equal(orig[r.start:r.end], data[r.start:r.end]) }
		v := -1 // the first record whose bytes changed or went
		for i, r := range recs {
			if !intact(r) {
				v = i
				break
			}
		}
		kept := next - 1
		wantRepair, wantRefusal := false, false
		if v >= 0 {
			kept = recs[v].index - 1
			wantRepair = recs[v].start < len(data) // a cut at a record's start leaves a clean end
			for _, r := range recs[v+1:] {
				if intact(r) && r.first > recs[v].index {
					wantRefusal = true
				}
			}
		}
		if wantRefusal {
			refusedAt(t, dir, path, recs[v], data)
			refused++
			continue
		}
		s, err = Open(dir, opts)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		holdsPrefix(t, s, kept)
		if v >= 0 && kept+1 < firstOf[recs[v].index] {
			t.Fatalf("%s: kept %d, the damaged append began at %d", what, kept, firstOf[recs[v].index])
		}
		st := s.Stats()
		if wantRepair {
			repaired++
			if st.Repairs != 1 || st.DroppedBytes != int64(len(data)-recs[v].start) {
				t.Fatalf("%s: stats %+v, want 1 repair of %d bytes", what, st, len(data)-recs[v].start)
			}
		} else if clean++; st.Repairs != 0 {
			t.Fatalf("%s: stats %+v, want no repair", what, st)
		}
		store(t, s, kept+1, kept+5)
		holdsPrefix(t, s, kept+5)
		s.Close()
	}
	t.Logf("%d refused, %d repaired, %d clean", refused, repaired, clean)
	if rounds >= 100 && (refused == 0 || repaired == 0) {
		t.Fatalf("seed %d: %d refused, %d repaired: the rounds did not try both", seed, refused, repaired)
	}
}

// TestAppliedTruncationRefused: raft cuts a suffix only of entries never
// committed, and only committed entries are applied: a suffix delete at or
// below the applied index is refused, the log is left as it was, the store
// takes no more appends, and the node is told to stop, once. Compaction and
// the whole-log delete after a snapshot install go on whatever was applied.
func TestAppliedTruncationRefused(t *testing.T) {
	var applied atomic.Uint64
	var fatals []error
	openApplied := func(dir string) *Store {
		t.Helper()
		s, err := Open(dir, &Options{SegmentSize: 4096, Logger: quiet, AppliedIndex: applied.Load,
			OnFatal: func(err error) { fatals = append(fatals, err) }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	dir := t.TempDir()
	s := openApplied(dir)
	store(t, s, 1, 100)
	applied.Store(80)
	// Above the applied index: entries a new leader overrides.
	if err := s.DeleteRange(81, 100); err != nil {
		t.Fatal(err)
	}
	holds(t, s, 1, 80)
	store(t, s, 81, 100)
	err := s.DeleteRange(80, 100)
	if !errors.Is(err, ErrAppliedTruncated) {
		t.Fatalf("a suffix delete of an applied entry: %v", err)
	}
	for _, want := range []string{"80-100", "applied through 80", "node stops"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	holds(t, s, 1, 100)
	if err := s.StoreLogs([]*raft.Log{entry(101)}); !errors.Is(err, ErrAppliedTruncated) {
		t.Fatalf("an append after the refusal: %v", err)
	}
	// raft retries; the log stays the evidence, even of a delete that
	// would now be allowed.
	for _, min := range []uint64{50, 95} {
		if err := s.DeleteRange(min, 100); !errors.Is(err, ErrAppliedTruncated) {
			t.Fatalf("delete %d-100 after the refusal: %v", min, err)
		}
	}
	holds(t, s, 1, 100)
	if len(fatals) != 1 || !errors.Is(fatals[0], ErrAppliedTruncated) {
		t.Fatalf("OnFatal calls: %v", fatals)
	}
	s.Close()
	holds(t, openApplied(dir), 1, 100)

	for _, a := range []uint64{0, 30, 100} {
		applied.Store(a)
		s := openApplied(t.TempDir())
		store(t, s, 1, 100)
		if err := s.DeleteRange(1, 60); err != nil { // compaction
			t.Fatalf("applied %d: %v", a, err)
		}
		holds(t, s, 61, 100)
		if err := s.DeleteRange(1, 100); err != nil { // a snapshot installed
			t.Fatalf("applied %d: %v", a, err)
		}
		holds(t, s, 0, 0)
		store(t, s, 1001, 1010)
		holds(t, s, 1001, 1010)
	}
	if len(fatals) != 1 {
		t.Fatalf("OnFatal calls: %v", fatals)
	}
}

// FuzzRepair writes arbitrary bytes as the last segment of a log whose
// first segment holds entries 1-10, and opens it: Open never panics, and
// either refuses as corruption (the segment left as it was) or opens a log
// that keeps entries 1-10, every entry of which reads back, and that takes
// the next append.
func FuzzRepair(f *testing.F) {
	framed := func(dst, rec []byte) []byte { return append(binary.AppendUvarint(dst, uint64(len(rec))), rec...) }
	v2 := func(dst []byte, first, from, to uint64) []byte {
		for i := from; i <= to; i++ {
			rec, _ := encode(nil, first, entry(i))
			dst = framed(dst, rec)
		}
		return dst
	}
	prefix := v2(v2(nil, 1, 1, 5), 6, 6, 10)
	tail := v2(v2(v2(nil, 11, 11, 17), 18, 18, 25), 26, 26, 30)
	var v1 []byte
	for i := uint64(11); i <= 30; i++ {
		v1 = framed(v1, frame(nil, appendBody(nil, entry(i))))
	}
	f.Add(tail)
	f.Add(tail[:len(tail)/2])
	f.Add(v1)
	f.Add(v1[:len(v1)-3])
	flipped := bytes.Clone(tail)
	flipped[len(tail)/3] ^= 0x08 // a later append follows
	f.Add(flipped)
	flipped = bytes.Clone(tail)
	flipped[len(tail)-20] ^= 0x08 // within the last append
	f.Add(flipped)
	f.Add([]byte{})
	f.Add([]byte{0x40, recordV2, 1, 2})
	f.Fuzz(func(t *testing.T, last []byte) {
		dir := t.TempDir()
		logDir := filepath.Join(dir, fmt.Sprintf("%s%020d", dirPrefix, 0))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(logDir, fmt.Sprintf("%020d", 1)), prefix, 0o644); err != nil {
			t.Fatal(err)
		}
		lastPath := filepath.Join(logDir, fmt.Sprintf("%020d", 11))
		if err := os.WriteFile(lastPath, last, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, &Options{SegmentSize: 4096, NoSync: true, Logger: quiet})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: %v", err)
			}
			if after, _ := os.ReadFile(lastPath); !bytes.Equal(after, last) {
				t.Fatal("a refused open changed the segment")
			}
			return
		}
		defer s.Close()
		first, _ := s.FirstIndex()
		lastIdx, _ := s.LastIndex()
		if first != 1 || lastIdx < 10 {
			t.Fatalf("the log holds %d-%d; entries 1-10 were whole", first, lastIdx)
		}
		for i := first; i <= lastIdx; i++ {
			var l raft.Log
			if err := s.GetLog(i, &l); err != nil || l.Index != i {
				t.Fatalf("entry %d: %v (index %d)", i, err, l.Index)
			}
		}
		if err := s.StoreLogs([]*raft.Log{entry(lastIdx + 1)}); err != nil {
			t.Fatalf("append after the repair: %v", err)
		}
	})
}
