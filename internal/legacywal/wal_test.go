package legacywal

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
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTest(t testing.TB, dir string, segSize int) *Log {
	t.Helper()
	create(t, dir)
	l, err := Open(dir, &Options{Origin: "a", SegmentSize: segSize, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mkEntry(i int) *entry.Entry {
	return &entry.Entry{
		Commit: hlc.Timestamp{Wall: int64(1000 + i), Logical: uint32(i % 3)},
		Op:     entry.OpSet,
		Key:    fmt.Sprintf("key-%06d", i),
		Value:  bytes.Repeat([]byte{byte(i)}, 20+i%50),
	}
}

// appendN appends entries numbered from..to-1 in groups of up to 7.
func appendN(t testing.TB, l *Log, from, to int) {
	t.Helper()
	for i := from; i < to; {
		var group []*entry.Entry
		for j := 0; j < 7 && i < to; j++ {
			group = append(group, mkEntry(i))
			i++
		}
		if err := l.Append(group); err != nil {
			t.Fatal(err)
		}
	}
}

func checkEntries(t testing.TB, l *Log, n int) {
	t.Helper()
	if l.Last() != uint64(n) {
		t.Fatalf("last index %d, want %d", l.Last(), n)
	}
	c := wire.NewCodec()
	for i := 1; i <= n; i++ {
		e, err := l.Read(c, uint64(i))
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		want := mkEntry(i - 1)
		if e.Index != uint64(i) || e.Key != want.Key || !bytes.Equal(e.Value, want.Value) ||
			e.Commit != want.Commit || e.Origin != "a" || e.Stream != l.Stream() {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
}

func TestAppendReadReopen(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, 4096)
	stream := l.Stream()
	if stream.IsZero() {
		t.Fatal("zero stream id")
	}
	appendN(t, l, 0, 500)
	checkEntries(t, l, 500)
	if segs, _ := listSegments(l.segDir); len(segs) < 3 {
		t.Fatalf("4 KiB segments should give several files: %d", len(segs))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openTest(t, dir, 4096)
	defer l.Close()
	if l.Stream() != stream {
		t.Fatalf("stream id changed across reopen: %s -> %s", stream, l.Stream())
	}
	checkEntries(t, l, 500)
	appendN(t, l, 500, 510)
	checkEntries(t, l, 510)
	if _, err := l.ReadRaw(511); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read past the end: %v", err)
	}
}

func TestTruncateFront(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, 4096)
	appendN(t, l, 0, 300)
	if err := l.TruncateFront(200); err != nil {
		t.Fatal(err)
	}
	if l.First() != 200 {
		t.Fatalf("first %d", l.First())
	}
	if _, err := l.ReadRaw(199); !errors.Is(err, ErrNotFound) {
		t.Fatalf("truncated entry still readable: %v", err)
	}
	l.Close()
	l = openTest(t, dir, 4096)
	if l.First() != 200 || l.Last() != 300 {
		t.Fatalf("after reopen: first %d last %d", l.First(), l.Last())
	}
	// Emptying the log keeps its position.
	if err := l.TruncateFront(301); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openTest(t, dir, 4096)
	defer l.Close()
	if l.First() != 301 || l.Last() != 300 {
		t.Fatalf("after emptying and reopen: first %d last %d", l.First(), l.Last())
	}
	appendN(t, l, 300, 301)
	if l.Last() != 301 {
		t.Fatalf("append after emptying: last %d", l.Last())
	}
}

func lastSegment(t *testing.T, dir string) string {
	segs, err := listSegments(filepath.Join(dir, "segments"))
	if err != nil || len(segs) == 0 {
		t.Fatal(err, segs)
	}
	return filepath.Join(dir, "segments", segs[len(segs)-1].name)
}

// TestTornTail damages the last segment at random offsets, by truncation and
// by flipping bytes. Damage confined to the last append is a torn tail: the
// log must open, keep every entry before the damage, and take new appends.
// A flipped byte in an earlier append, with whole later appends after it,
// is corruption: the log refuses to open, naming the entry.
func TestTornTail(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for round := 0; round < 60; round++ {
		dir := t.TempDir()
		l := openTest(t, dir, 16384)
		appendN(t, l, 0, 400)
		l.Close()
		path := lastSegment(t, dir)
		data, _ := os.ReadFile(path)
		segFirst := segFirstIndex(t, path)
		lastAppend := lastAppendStart(t, data)
		off := r.IntN(len(data))
		truncate := round%3 == 0
		if round%3 == 2 {
			off = lastAppend + r.IntN(len(data)-lastAppend) // within the last append
		}
		if truncate {
			os.Truncate(path, int64(off))
		} else {
			data[off] ^= byte(1 + r.IntN(255))
			os.WriteFile(path, data, 0o644)
		}
		// Entries whose bytes end at or before off are intact.
		whole, wholeEnd := countWhole(data[:off])
		intact := whole + int(segFirst) - 1
		wantRepair := !truncate || wholeEnd != off

		l, err := Open(dir, &Options{Origin: "a", SegmentSize: 16384, Logger: quiet})
		if !truncate && off < lastAppend {
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Index == 0 {
				t.Fatalf("seed %d round %d: a flipped byte at %d, before the last append (at %d), opened: %v",
					seed, round, off, lastAppend, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("seed %d round %d: open after damage at %d (last append at %d): %v", seed, round, off, lastAppend, err)
		}
		if int(l.Last()) < intact {
			t.Fatalf("seed %d round %d: kept %d entries, %d were intact", seed, round, l.Last(), intact)
		}
		checkEntries(t, l, int(l.Last()))
		if repaired, _ := l.Repaired(); repaired != wantRepair {
			t.Fatalf("seed %d round %d: repaired %v, want a repair: %v", seed, round, repaired, wantRepair)
		}
		n := int(l.Last())
		appendN(t, l, n, n+5)
		checkEntries(t, l, n+5)
		l.Close()
	}
}

// lastAppendStart is the byte offset in a segment where the frames of its
// last append begin.
func lastAppendStart(t *testing.T, data []byte) int {
	t.Helper()
	type fr struct {
		off   int
		first uint64
	}
	var frames []fr
	for pos := 0; pos < len(data); {
		size, w := binary.Uvarint(data[pos:])
		_, first, err := unframe(data[pos+w : pos+w+int(size)])
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, fr{pos, first})
		pos += w + int(size)
	}
	last := frames[len(frames)-1].first
	for _, f := range frames {
		if f.first == last {
			return f.off
		}
	}
	return 0
}

// TestTornMultiPageWrite: the last append spans several 4 KiB pages and the
// crash left a middle page unwritten (zeros) while later pages reached the
// disk. Valid frames follow the damage, but they belong to the same append:
// a torn tail, repaired back to the entry before the damage.
func TestTornMultiPageWrite(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, 1<<20)
	appendN(t, l, 0, 50)
	before := l.Last()
	big := make([]*entry.Entry, 40)
	for i := range big {
		big[i] = mkEntry(int(before) + i)
		big[i].Value = bytes.Repeat([]byte{byte(i)}, 400) // ~17 KiB in all: five pages
	}
	if err := l.Append(big); err != nil {
		t.Fatal(err)
	}
	l.Close()
	path := lastSegment(t, dir)
	data, _ := os.ReadFile(path)
	start := lastAppendStart(t, data)
	page := (start/4096 + 2) * 4096 // a page well inside the last append
	if page+4096 >= len(data) {
		t.Fatalf("the last append [%d, %d) does not span the page at %d", start, len(data), page)
	}
	clear(data[page : page+4096])
	os.WriteFile(path, data, 0o644)
	if _, _, found := laterWrite(data[page+4096:], before+1); found {
		t.Fatal("laterWrite counts frames of the torn append itself")
	}
	l, err := Open(dir, &Options{Origin: "a", SegmentSize: 1 << 20, Logger: quiet})
	if err != nil {
		t.Fatalf("a torn multi-page write refused: %v", err)
	}
	defer l.Close()
	whole, _ := countWhole(data[:page])
	if int(l.Last()) < int(before) || int(l.Last()) > whole {
		t.Fatalf("kept %d entries; %d were written before the torn append, %d whole before the hole", l.Last(), before, whole)
	}
	c := wire.NewCodec()
	for i := uint64(1); i <= l.Last(); i++ {
		if _, err := l.Read(c, i); err != nil {
			t.Fatalf("entry %d after the repair: %v", i, err)
		}
	}
	if repaired, dropped := l.Repaired(); !repaired || dropped == 0 {
		t.Fatalf("repaired %v, dropped %d bytes: want a repair", repaired, dropped)
	}
}

// TestBitFlipBeforeLaterWritesRefuses: a flipped byte in the middle of the
// last segment, with whole appends after it, is not a torn write (those
// appends completed after it): the log refuses to open, and says why and
// where, rather than silently cutting fsynced entries.
func TestBitFlipBeforeLaterWritesRefuses(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, 1<<20)
	appendN(t, l, 0, 200)
	l.Close()
	path := lastSegment(t, dir)
	data, _ := os.ReadFile(path)
	// the 100th entry's payload
	pos := 0
	for i := 0; i < 99; i++ {
		size, w := binary.Uvarint(data[pos:])
		pos += w + int(size)
	}
	data[pos+20] ^= 0x40
	os.WriteFile(path, data, 0o644)
	_, err := Open(dir, &Options{Origin: "a", SegmentSize: 1 << 20, Logger: quiet})
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Index != 100 {
		t.Fatalf("open: %v, want a CorruptError at entry 100", err)
	}
	for _, want := range []string{"not a torn write", "later append", "OPERATIONS.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	// nothing was cut: the segment is as it was
	if after, _ := os.ReadFile(path); !bytes.Equal(after, data) {
		t.Fatal("a refused open changed the segment")
	}
}

func segFirstIndex(t *testing.T, path string) uint64 {
	var idx uint64
	fmt.Sscanf(filepath.Base(path), "%d", &idx)
	return idx
}

// countWhole counts complete tidwall records in a prefix of a segment and
// the byte offset where they end.
func countWhole(data []byte) (n, end int) {
	for pos := 0; pos < len(data); {
		size, w := binary.Uvarint(data[pos:])
		if w <= 0 || int(size) > len(data)-pos-w {
			break
		}
		pos += w + int(size)
		n++
		end = pos
	}
	return n, end
}

func TestDamageBeforeTailRefuses(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, 4096)
	appendN(t, l, 0, 300)
	l.Close()
	segs, _ := listSegments(filepath.Join(dir, "segments"))
	if len(segs) < 3 {
		t.Fatal("want several segments")
	}
	victim := filepath.Join(dir, "segments", segs[1].name)
	data, _ := os.ReadFile(victim)
	data[len(data)/2] ^= 0xff
	os.WriteFile(victim, data, 0o644)
	_, err := Open(dir, &Options{Origin: "a", SegmentSize: 4096, Logger: quiet})
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a damaged middle segment: %v", err)
	}
	if ce.Segment != segs[1].name || ce.Index < segs[1].first || ce.Index >= segs[2].first {
		t.Fatalf("error names segment %s index %d; damage is in %s", ce.Segment, ce.Index, segs[1].name)
	}

	// A missing segment in the middle is refused too.
	dir2 := t.TempDir()
	l = openTest(t, dir2, 4096)
	appendN(t, l, 0, 300)
	l.Close()
	segs, _ = listSegments(filepath.Join(dir2, "segments"))
	os.Remove(filepath.Join(dir2, "segments", segs[1].name))
	if _, err := Open(dir2, &Options{Origin: "a", SegmentSize: 4096, Logger: quiet}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a missing segment: %v", err)
	}
}

func TestMissingStreamFileRefuses(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, 0)
	appendN(t, l, 0, 3)
	l.Close()
	os.Remove(filepath.Join(dir, streamFile))
	if _, err := Open(dir, &Options{Origin: "a", Logger: quiet}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open without STREAM: %v", err)
	}
}

// FuzzScanSegment feeds arbitrary segment bytes to the open-time scanner: it
// must never panic, and what it calls good must re-scan clean.
func FuzzScanSegment(f *testing.F) {
	dir := f.TempDir()
	create(f, dir)
	l, err := Open(dir, &Options{Origin: "a", Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	appendN(f, l, 0, 5)
	l.Close()
	segs, _ := listSegments(filepath.Join(dir, "segments"))
	data, _ := os.ReadFile(filepath.Join(dir, "segments", segs[0].name))
	f.Add(data)
	f.Add(data[:len(data)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		n, good, _ := scanSegment(b, 1)
		n2, good2, problem := scanSegment(b[:good], 1)
		if problem != nil || n2 != n || good2 != good {
			t.Fatalf("prefix the scanner called good does not re-scan clean: %d/%d vs %d/%d %v", n, good, n2, good2, problem)
		}
	})
}

// TestPeekIndex: the index a log segment's scanner reads without decoding is
// the one the codec wrote.
func TestPeekIndex(t *testing.T) {
	c := wire.NewCodec()
	d := wire.Defaults{Origin: "a", Stream: entry.StreamID{9}}
	for _, i := range []uint64{1, 127, 128, 1 << 16, 1 << 40} {
		b := c.AppendEntry(nil, &entry.Entry{Index: i, Origin: "a", Stream: entry.StreamID{9}, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "k"}, d)
		if idx, ok := peekIndex(b); !ok || idx != i {
			t.Fatalf("peekIndex of entry %d: %d %v", i, idx, ok)
		}
	}
}
