package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

func makeSnapshot(t *testing.T, st *dirSnapshots, head string, files map[string]string) string {
	t.Helper()
	_, trans := raft.NewInmemTransport("x")
	sink, err := st.Create(1, 10, 2, raft.Configuration{Servers: []raft.Server{{ID: "a1", Address: "x"}}}, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	ts := sink.(TreeSink)
	ts.SetHead([]byte(head))
	if files != nil {
		dir := filepath.Join(t.TempDir(), "checkpoint")
		os.Mkdir(dir, 0o755)
		for n, c := range files {
			os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644)
		}
		if err := ts.AdoptTree(dir); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	return sink.ID()
}

// A snapshot streamed by one store and received by another arrives whole:
// the same head, the same files, the size raft was promised.
func TestSnapshotStreamRoundTrip(t *testing.T) {
	src, _ := openSnapshots(t.TempDir())
	files := map[string]string{"000001.sst": "table", "MANIFEST-000001": "manifest", "empty": ""}
	id := makeSnapshot(t, src, "{\"applied\":7}\n", files)
	meta, rc, err := src.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(stream)) != meta.Size {
		t.Fatalf("streamed %d bytes, meta says %d", len(stream), meta.Size)
	}
	dst, _ := openSnapshots(t.TempDir())
	_, trans := raft.NewInmemTransport("y")
	sink, err := dst.Create(1, meta.Index, meta.Term, meta.Configuration, meta.ConfigurationIndex, trans)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range [][]byte{stream[:5], stream[5:40], stream[40:]} { // as the RPC hands it over
		if _, err := sink.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	got, rc2, err := dst.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer rc2.Close()
	ts := rc2.(TreeSnapshot)
	if string(ts.Head()) != "{\"applied\":7}\n" || got.Size != meta.Size || got.Index != 10 {
		t.Fatalf("received %q, %+v", ts.Head(), got)
	}
	for n, c := range files {
		b, err := os.ReadFile(filepath.Join(ts.TreeDir(), n))
		if err != nil || string(b) != c {
			t.Fatalf("file %s: %q %v", n, b, err)
		}
	}
	// A head alone (a node alone's snapshot) has no tree.
	id = makeSnapshot(t, src, "{\"applied\":9}\n", nil)
	if _, rc, err := src.Open(id); err != nil || rc.(TreeSnapshot).TreeDir() != "" {
		t.Fatalf("a head-only snapshot: %v", err)
	} else {
		rc.Close()
	}
	if metas, _ := src.List(); len(metas) != keepSnaps {
		t.Fatalf("%d snapshots kept, want %d", len(metas), keepSnaps)
	}
}

// A stream cut short, with a hostile name, or with bytes after its end is
// refused, and nothing of it is kept.
func TestSnapshotStreamRefusesDamage(t *testing.T) {
	src, _ := openSnapshots(t.TempDir())
	id := makeSnapshot(t, src, "{}\n", map[string]string{"a": "0123456789"})
	_, rc, _ := src.Open(id)
	good, _ := io.ReadAll(rc)
	rc.Close()
	evil := append([]byte("{}\n\x01"), 0, 5)
	evil = append(evil, "../x"...)
	for name, stream := range map[string][]byte{
		"cut":      good[:len(good)-4],
		"trailing": append(append([]byte(nil), good...), 7),
		"escape":   append(evil, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		"no head":  []byte("no newline"),
		"mark":     []byte("{}\n\x07"),
	} {
		dst, _ := openSnapshots(t.TempDir())
		_, trans := raft.NewInmemTransport("y")
		sink, _ := dst.Create(1, 10, 2, raft.Configuration{}, 1, trans)
		sink.Write(stream)
		if err := sink.Close(); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: closed with %v", name, err)
		}
		if metas, _ := dst.List(); len(metas) != 0 {
			t.Errorf("%s: a damaged snapshot was kept", name)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(dst.dir), "x")); err == nil {
			t.Errorf("%s: a file escaped the snapshot", name)
		}
	}
}

// Issue 25, finding 9: a snapshot stream could carry any number of files
// of any announced size (20,001 files were taken; 64 MiB were written for a
// file announced at 2^62 bytes). A stream over the bound of files, or a
// file announcing more than the free disk, is refused when its header
// arrives, before its bytes are written.
func TestSnapshotStreamBounded(t *testing.T) {
	defer func(n int) { maxFiles = n }(maxFiles)
	maxFiles = 50
	file := func(name string, size uint64, body []byte) []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(len(name)))
		b = append(b, name...)
		b = binary.BigEndian.AppendUint64(b, size)
		return append(b, body...)
	}
	many := []byte("{}\n\x01")
	for i := 0; i <= maxFiles; i++ {
		many = append(many, file(fmt.Sprintf("f%d", i), 1, []byte("x"))...)
	}
	many = append(many, 0, 0)
	huge := append([]byte("{}\n\x01"), file("a", 1<<62, bytes.Repeat([]byte("y"), 1<<20))...)
	for name, stream := range map[string][]byte{"files": many, "size": huge} {
		dst, _ := openSnapshots(t.TempDir())
		_, trans := raft.NewInmemTransport("y")
		sink, _ := dst.Create(1, 10, 2, raft.Configuration{}, 1, trans)
		for off := 0; off < len(stream); off += 64 << 10 {
			if _, err := sink.Write(stream[off:min(off+64<<10, len(stream))]); err != nil {
				break // refused as it arrives
			}
		}
		err := sink.Close()
		if !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: closed with %v", name, err)
		}
		t.Logf("%s: %v", name, err)
		var written int64
		filepath.WalkDir(dst.dir, func(_ string, d fs.DirEntry, _ error) error {
			if d != nil && d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					written += fi.Size()
				}
			}
			return nil
		})
		if metas, _ := dst.List(); len(metas) != 0 || written > 0 {
			t.Fatalf("%s: the refused stream left %d snapshots, %d bytes", name, len(metas), written)
		}
	}
}

func FuzzUnpack(f *testing.F) {
	f.Add([]byte("{}\n\x00"))
	f.Add([]byte("{}\n\x01\x00\x01a\x00\x00\x00\x00\x00\x00\x00\x02hi\x00\x00"))
	f.Add([]byte("{}\n\x01\x00\x02..\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		var head []byte
		if err := unpack(bytes.NewReader(b), dir, &head); err != nil {
			return
		}
		// What unpacked stays inside the directory, and streams back to
		// the same bytes.
		st := &dirSnapshots{dir: t.TempDir()}
		if err := os.WriteFile(filepath.Join(dir, snapHead), head, 0o644); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, snapMeta), []byte(`{"ID":"x"}`), 0o644)
		os.Rename(dir, filepath.Join(st.dir, "x"))
		_, rc, err := st.Open("x")
		if err != nil {
			t.Fatal(err)
		}
		again, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := treeFiles(filepath.Join(st.dir, "x", snapTree)); err != nil {
			t.Fatal(err)
		}
		if len(again) != len(b) {
			t.Fatalf("unpacked %d bytes, streams back %d", len(b), len(again))
		}
	})
}

// A snapshot being sent to a slow follower is whole even when newer
// snapshots reap it meanwhile.
func TestSnapshotStreamOutlivesItsReap(t *testing.T) {
	st, _ := openSnapshots(t.TempDir())
	id := makeSnapshot(t, st, "{}\n", map[string]string{"a": "0123456789", "b": "abc"})
	meta, rc, err := st.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	makeSnapshot(t, st, "{}\n", nil)
	makeSnapshot(t, st, "{}\n", nil) // the first is reaped now
	if _, err := os.Stat(filepath.Join(st.dir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the first snapshot was not reaped: %v", err)
	}
	b, err := io.ReadAll(rc)
	if err != nil || int64(len(b)) != meta.Size {
		t.Fatalf("read %d of %d bytes: %v", len(b), meta.Size, err)
	}
}

// A reap a crash cut short (its meta gone, its tree left) is finished when
// the store opens; whole snapshots stay.
func TestHalfReapedSnapshotRemovedAtOpen(t *testing.T) {
	dir := t.TempDir()
	st, _ := openSnapshots(dir)
	keep := makeSnapshot(t, st, "{}\n", map[string]string{"a": "0123456789"})
	half := makeSnapshot(t, st, "{}\n", map[string]string{"b": "abc"})
	if err := os.Remove(filepath.Join(dir, half, snapMeta)); err != nil {
		t.Fatal(err)
	}
	st, err := openSnapshots(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, half)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the half-reaped snapshot is still there: %v", err)
	}
	metas, err := st.List()
	if err != nil || len(metas) != 1 || metas[0].ID != keep {
		t.Fatalf("List after open = %v, %v; want only %s", metas, err, keep)
	}
	if _, rc, err := st.Open(keep); err != nil {
		t.Fatalf("the whole snapshot cannot be opened: %v", err)
	} else {
		rc.Close()
	}
}
