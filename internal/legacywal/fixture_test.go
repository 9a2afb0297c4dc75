package legacywal

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

var updateFixture = flag.Bool("update-fixture", false, "write replica/testdata/legacy-wal, the old directory replica's migration test starts from")

// fixtureDir is the WAL of an old data directory that node's migration test
// (TestMigrateWALInPlace) starts from: ten writes of cluster "a", the first
// two shipped and cut.
const fixtureDir = "../../replica/testdata/legacy-wal"

// fixtureEntries are its writes; node's test builds the same ten.
func fixtureEntries() []*entry.Entry {
	var ents []*entry.Entry
	for i := 0; i < 10; i++ {
		ents = append(ents, &entry.Entry{Commit: hlc.Timestamp{Wall: 1_764_000_000_000_000_000 + int64(i)}, Op: entry.OpSet,
			Key: fmt.Sprintf("k%d", i), Value: []byte("old")})
	}
	return ents
}

// TestOldDirectoryFixture: the committed fixture reads as the writes it was
// made of (run with -update-fixture to write it again).
func TestOldDirectoryFixture(t *testing.T) {
	if *updateFixture {
		os.RemoveAll(fixtureDir)
		if err := os.MkdirAll(filepath.Join(fixtureDir, "segments"), 0o755); err != nil {
			t.Fatal(err)
		}
		stream := entry.StreamID{0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0}
		os.WriteFile(filepath.Join(fixtureDir, streamFile), []byte(stream.String()+"\n"), 0o644)
		l, err := Open(fixtureDir, &Options{Origin: "a", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Append(fixtureEntries()); err != nil {
			t.Fatal(err)
		}
		if err := l.TruncateFront(3); err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	// Opened from a copy: an open may repair, and the fixture stays as made.
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(fixtureDir)); err != nil {
		t.Fatal(err)
	}
	l, err := Open(dir, &Options{Origin: "a", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.First() != 3 || l.Last() != 10 {
		t.Fatalf("fixture holds [%d, %d], want [3, 10]", l.First(), l.Last())
	}
	c := wire.NewCodec()
	for i, want := range fixtureEntries()[2:] {
		e, err := l.Read(c, uint64(i+3))
		if err != nil || e.Key != want.Key || !bytes.Equal(e.Value, want.Value) || e.Commit != want.Commit || e.Origin != "a" {
			t.Fatalf("entry %d: %+v %v, want %+v", i+3, e, err, want)
		}
	}
	if repaired, _ := l.Repaired(); repaired {
		t.Fatal("the fixture needed a repair")
	}
}
