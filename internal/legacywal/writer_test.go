package legacywal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	twal "github.com/tidwall/wal"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/wire"
)

// The write side of the format, which production no longer has: tests write
// old directories with it, as the builds before the cluster's log did.

// create begins a WAL in dir (its stream file), unless one is there.
func create(t testing.TB, dir string) entry.StreamID {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, streamFile)); err == nil {
		s, err := entry.ParseStreamID(string(b[:len(b)-1]))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := entry.NewStreamID()
	if err := os.MkdirAll(filepath.Join(dir, "segments"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, streamFile), []byte(s.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// Append gives entries the next indexes and the log's origin and stream,
// and writes them as one append (version 2 frames).
func (l *Log) Append(entries []*entry.Entry) error {
	if l.closed {
		return ErrClosed
	}
	prev := l.last.Load()
	codec := wire.NewCodec()
	var batch twal.Batch
	for i, e := range entries {
		e.Index = prev + uint64(i) + 1
		e.Origin, e.Stream = l.defs.Origin, l.defs.Stream
		batch.Write(e.Index, appendFrame(nil, prev+1, func(dst []byte) []byte { return codec.AppendEntry(dst, e, l.defs) }))
	}
	if err := l.tw.WriteBatch(&batch); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	l.last.Store(prev + uint64(len(entries)))
	return nil
}

// TruncateFront drops every entry before index (index may be Last()+1).
func (l *Log) TruncateFront(index uint64) error {
	if index <= l.first.Load() {
		return nil
	}
	if last := l.last.Load(); index > last+1 {
		index = last + 1
	}
	if err := l.tw.TruncateFront(index); err != nil && !errors.Is(err, twal.ErrOutOfRange) {
		return err
	}
	l.first.Store(index)
	return nil
}
