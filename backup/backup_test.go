package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/replicator/replicator/backup"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

// TestBackupOfAStoreUnderWrites: a backup taken while writes go on holds
// every write committed before it began and each later one whole or not
// at all; extracted, it is a data directory whose tree opens, with the
// identity files and the manifest. A stream cut short is refused, and a
// target that holds something is never written into.
func TestBackupOfAStoreUnderWrites(t *testing.T) {
	data := t.TempDir()
	st, err := store.Open(filepath.Join(data, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	put := func(i int) {
		k := fmt.Sprintf("k%06d", i)
		if _, err := st.Set(k, []byte(k), entry.Stamp{HLC: hlc.Timestamp{Wall: int64(1e15) + int64(i)}, Origin: "a"}); err != nil {
			t.Error(err)
		}
	}
	for i := range 2000 {
		put(i)
	}
	var written atomic.Int64
	written.Store(2000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 2000; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			put(i)
			written.Store(int64(i + 1))
		}
	}()
	before := written.Load()
	var buf bytes.Buffer
	m, err := backup.Write(context.Background(), &buf, backup.Source{Dir: data, Checkpoint: st.Checkpoint,
		Applied: func() uint64 { return 7 }, Manifest: backup.Manifest{Cluster: "a", Node: "a1", Incarnation: "i1", Servers: 1}})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(data); len(ents) != 1 {
		t.Fatalf("the checkpoint was left in the data directory: %v", ents)
	}
	// Cut short: refused.
	if _, err := backup.Extract(io.LimitReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()/2)), filepath.Join(t.TempDir(), "cut")); err == nil {
		t.Fatal("a backup cut in half was taken")
	}
	dir := filepath.Join(t.TempDir(), "restored")
	got, err := backup.Extract(bytes.NewReader(buf.Bytes()), dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cluster != "a" || got.Node != "a1" || got.Incarnation != "i1" || got.Applied != 7 || got.Files != m.Files || got.Files == 0 {
		t.Fatalf("manifest %+v, wrote %+v", got, m)
	}
	for f, want := range map[string]string{"CLUSTER_ID": "a\n", "NODE_ID": "a1\n"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(b) != want {
			t.Fatalf("%s: %q %v", f, b, err)
		}
	}
	if _, err := backup.Extract(bytes.NewReader(buf.Bytes()), dir); !errors.Is(err, backup.ErrExists) {
		t.Fatalf("extracting over a backup: %v", err)
	}
	cp, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	n := 0
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%06d", i)
		rec, err := cp.Get(k)
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if err != nil || string(rec.Value) != k {
			t.Fatalf("%s in the backup: %q %v", k, rec.Value, err)
		}
		n++
	}
	if int64(n) < before {
		t.Fatalf("the backup holds %d writes, %d were committed before it began", n, before)
	}
	if rec, err := cp.Get(fmt.Sprintf("k%06d", n+1)); err == nil {
		t.Fatalf("the backup holds a write after a gap: %+v", rec)
	}
}
