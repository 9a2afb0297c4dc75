package wal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	twal "github.com/tidwall/wal"

	"github.com/replicator/replicator/internal/raftfsm"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, &Options{SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func entry(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: 1 + i/10, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd-%d-%s", i, bytes.Repeat([]byte("x"), int(i%50)))),
		Extensions: []byte{byte(i)}, AppendedAt: time.Unix(1764546000, int64(i))}
}

func store(t *testing.T, s *Store, from, to uint64) {
	t.Helper()
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, entry(i))
		if len(logs) == 7 || i == to {
			if err := s.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
			logs = nil
		}
	}
}

// holds checks the log holds exactly [first, last], each entry as written.
func holds(t *testing.T, s *Store, first, last uint64) {
	t.Helper()
	f, _ := s.FirstIndex()
	l, _ := s.LastIndex()
	if f != first || l != last {
		t.Fatalf("log holds %d-%d, want %d-%d", f, l, first, last)
	}
	if first == 0 {
		return
	}
	for i := first; i <= last; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		want := entry(i)
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) ||
			!bytes.Equal(got.Extensions, want.Extensions) || !got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("entry %d: got %+v want %+v", i, got, *want)
		}
	}
	var l0 raft.Log
	if err := s.GetLog(last+1, &l0); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("entry past the end: %v", err)
	}
	if first > 1 {
		if err := s.GetLog(first-1, &l0); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("entry before the start: %v", err)
		}
	}
}

func TestLogRoundTripAndReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	holds(t, s, 0, 0)
	store(t, s, 1, 300) // several 4 KiB segments
	holds(t, s, 1, 300)
	if err := s.StoreLogs([]*raft.Log{entry(302)}); err == nil {
		t.Fatal("a gap was stored")
	}
	s.Close()
	s = open(t, dir)
	holds(t, s, 1, 300)
}

func TestDeleteRange(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	store(t, s, 1, 300)
	if err := s.DeleteRange(1, 120); err != nil { // compaction
		t.Fatal(err)
	}
	holds(t, s, 121, 300)
	if err := s.DeleteRange(251, 300); err != nil { // a new leader's conflict
		t.Fatal(err)
	}
	holds(t, s, 121, 250)
	store(t, s, 251, 260)
	holds(t, s, 121, 260)
	s.Close()
	s = open(t, dir)
	holds(t, s, 121, 260)
	// A snapshot installed at 1,000: everything goes, the log continues there.
	if err := s.DeleteRange(121, 260); err != nil {
		t.Fatal(err)
	}
	holds(t, s, 0, 0)
	store(t, s, 1001, 1050)
	holds(t, s, 1001, 1050)
	s.Close()
	s = open(t, dir)
	holds(t, s, 1001, 1050)
	if dirs, _ := filepath.Glob(filepath.Join(dir, "log-*")); len(dirs) != 1 {
		t.Fatalf("log directories: %v", dirs)
	}
}

// TestInterruptedReplacement: a crash between creating the replacement log
// and removing the old one leaves both; the newer (higher base) wins.
func TestInterruptedReplacement(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	store(t, s, 1, 50)
	s.Close()
	if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("log-%020d", 1000)), 0o755); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	holds(t, s, 0, 0)
	store(t, s, 1001, 1010)
	holds(t, s, 1001, 1010)
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("log-%020d", 0))); !os.IsNotExist(err) {
		t.Fatalf("the replaced log is still there: %v", err)
	}
}

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "log-*", "0*"))
	if len(segs) == 0 {
		t.Fatal("no segments")
	}
	return segs[len(segs)-1]
}

// TestTornTailRepaired: the last append was cut short by a crash (a partial
// frame, or a whole frame whose bytes did not all reach the disk): the
// entries before it are kept and the log takes appends again.
func TestTornTailRepaired(t *testing.T) {
	for name, tear := range map[string]func(data []byte) []byte{
		"partial frame":  func(d []byte) []byte { return append(d, 0x40, recordV1, 1, 2) },
		"zeroed bytes":   func(d []byte) []byte { copy(d[len(d)-6:], make([]byte, 6)); return d },
		"half the frame": func(d []byte) []byte { return d[:len(d)-10] },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			store(t, s, 1, 100)
			s.Close()
			seg := lastSegment(t, dir)
			data, _ := os.ReadFile(seg)
			if err := os.WriteFile(seg, tear(data), 0o644); err != nil {
				t.Fatal(err)
			}
			s = open(t, dir)
			last, _ := s.LastIndex()
			if last != 100 && last != 99 {
				t.Fatalf("after repair the log ends at %d", last)
			}
			holds(t, s, 1, last)
			store(t, s, last+1, last+10)
			holds(t, s, 1, last+10)
		})
	}
}

// severalSegments writes entries 1-300 into a log of 4 KiB segments and
// returns its directory and segment files (at least three).
func severalSegments(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	s := open(t, dir)
	store(t, s, 1, 300)
	s.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "log-*", "0*"))
	if len(segs) < 3 {
		t.Fatalf("want several segments, have %d", len(segs))
	}
	return dir, segs
}

func TestCorruptMiddleRefused(t *testing.T) {
	dir, segs := severalSegments(t)
	data, _ := os.ReadFile(segs[0])
	data[len(data)/2] ^= 0xff
	os.WriteFile(segs[0], data, 0o644)
	if _, err := Open(dir, &Options{SegmentSize: 4096}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged first segment: %v", err)
	}
}

func TestStable(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if v, err := s.GetUint64([]byte("CurrentTerm")); v != 0 || err != nil {
		t.Fatalf("unset term: %d %v", v, err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); len(v) != 0 || err != nil {
		t.Fatalf("unset vote: %q %v", v, err)
	}
	s.SetUint64([]byte("CurrentTerm"), 7)
	s.Set([]byte("LastVoteCand"), []byte("a2"))
	s.Close()
	s = open(t, dir)
	if v, _ := s.GetUint64([]byte("CurrentTerm")); v != 7 {
		t.Fatalf("term after reopen: %d", v)
	}
	if v, _ := s.Get([]byte("LastVoteCand")); string(v) != "a2" {
		t.Fatalf("vote after reopen: %q", v)
	}
	s.Close()
	path := filepath.Join(dir, stableName)
	data, _ := os.ReadFile(path)
	data[len(data)-1] ^= 1
	os.WriteFile(path, data, 0o644)
	if _, err := Open(dir, nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged stable file: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, i := range []uint64{1, 77, 1 << 40} {
		for _, first := range []uint64{i, i - i/2} {
			rec, _ := encode(nil, first, entry(i))
			f.Add(rec)
		}
		f.Add(frame(nil, appendBody(nil, entry(i)))) // version 1
	}
	f.Add([]byte{recordV1, 0, 0, 0, 0})
	f.Add(append([]byte{recordV2}, make([]byte, headerV2-1)...))
	f.Fuzz(func(t *testing.T, rec []byte) {
		var l raft.Log
		first, err := decode(rec, &l)
		if err != nil {
			return
		}
		if rec[0] == recordV1 && first != 0 || first > l.Index {
			t.Fatalf("version %d record of entry %d decoded with its append at %d", rec[0], l.Index, first)
		}
		again, err := encode(nil, first, &l)
		if err != nil {
			t.Fatal(err)
		}
		var l2 raft.Log
		first2, err := decode(again, &l2)
		if err != nil || first2 != first || l2.Index != l.Index || l2.Term != l.Term || l2.Type != l.Type ||
			!bytes.Equal(l2.Data, l.Data) || !bytes.Equal(l2.Extensions, l.Extensions) || !l2.AppendedAt.Equal(l.AppendedAt) {
			t.Fatalf("a decoded entry does not round-trip: %v", err)
		}
	})
}

// TestRaftRestart: hashicorp/raft on this store, a group of one: what it
// committed before a restart is applied again from the log after it (the
// state machine's skip of already-applied indexes is its own job), and the
// term it persisted does not go back.
func TestRaftRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() (*raft.Raft, *raftfsm.Recorder, *Store, raft.Transport) {
		s, err := Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		addr, trans := raft.NewInmemTransport("n1")
		cfg := raft.DefaultConfig()
		cfg.LocalID = "n1"
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
		cfg.Logger = hclog.NewNullLogger()
		c := &raftfsm.Recorder{}
		if ok, _ := raft.HasExistingState(s, s, raft.NewDiscardSnapshotStore()); !ok {
			if err := raft.BootstrapCluster(cfg, s, s, raft.NewDiscardSnapshotStore(), trans,
				raft.Configuration{Servers: []raft.Server{{ID: "n1", Address: addr}}}); err != nil {
				t.Fatal(err)
			}
		}
		r, err := raft.NewRaft(cfg, c, s, s, raft.NewDiscardSnapshotStore(), trans)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); r.State() != raft.Leader; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no leader")
			}
		}
		return r, c, s, trans
	}
	r, c, s, _ := start()
	for i := 0; i < 50; i++ {
		if err := r.Apply([]byte(fmt.Sprint("w", i)), time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.Applied()) != 50 {
		t.Fatalf("applied %d of 50", len(c.Applied()))
	}
	term, _ := s.GetUint64([]byte("CurrentTerm"))
	if err := r.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	s.Close()

	r, c, s, _ = start()
	defer func() { r.Shutdown().Error(); s.Close() }()
	if err := r.Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if len(c.Applied()) != 50 {
		t.Fatalf("after the restart %d of the 50 commands were applied again", len(c.Applied()))
	}
	if t2, _ := s.GetUint64([]byte("CurrentTerm")); t2 < term || t2 == 0 {
		t.Fatalf("term went from %d to %d", term, t2)
	}
}

// A refused append (a full disk) leaves the log as it was, and raft can
// write the same indexes once the disk has room.
func TestFailedAppendLeavesNothing(t *testing.T) {
	full := errors.New("no space left on device")
	var failing bool
	dir := t.TempDir()
	s, err := Open(dir, &Options{SegmentSize: 4096, BeforeWrite: func() error {
		if failing {
			return full
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	store(t, s, 1, 5)
	failing = true
	if err := s.StoreLogs([]*raft.Log{entry(6)}); !errors.Is(err, full) {
		t.Fatalf("append on a full disk: %v", err)
	}
	holds(t, s, 1, 5)
	failing = false
	store(t, s, 6, 9)
	holds(t, s, 1, 9)
}

// An append whose write reached the file but reported failure (an fsync
// that failed) is cut back: the log holds what it held before, on disk too,
// and the indexes can be written again.
func TestFailedWriteCutBack(t *testing.T) {
	for _, before := range []uint64{0, 5} {
		t.Run(fmt.Sprint(before), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			if before > 0 {
				store(t, s, 1, before)
			}
			// The failed write: entries reach tidwall, the caller sees an error.
			s.mu.Lock()
			var b twal.Batch
			for i := before + 1; i <= before+3; i++ {
				buf, err := encode(nil, before+1, entry(i))
				if err != nil {
					t.Fatal(err)
				}
				b.Write(i-s.mu.base, buf)
			}
			if err := s.mu.tw.WriteBatch(&b); err != nil {
				t.Fatal(err)
			}
			cause := errors.New("fsync: input/output error")
			err := s.recoverWriteLocked(cause)
			s.mu.Unlock()
			if !errors.Is(err, cause) || errors.Is(err, ErrBroken) {
				t.Fatalf("recover: %v", err)
			}
			if before == 0 {
				holds(t, s, 0, 0)
			} else {
				holds(t, s, 1, before)
			}
			store(t, s, before+1, before+4)
			holds(t, s, 1, before+4)
			s.Close()
			holds(t, open(t, dir), 1, before+4)
		})
	}
}

// Entries a new leader overrides are read back as rewritten, from memory
// and from disk: the recent entries kept in memory never outlive a cut.
func TestRecentEntriesFollowCuts(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	store(t, s, 1, 20)
	holds(t, s, 1, 20)
	if err := s.DeleteRange(15, 20); err != nil {
		t.Fatal(err)
	}
	other := func(i uint64) *raft.Log {
		l := entry(i)
		l.Term, l.Data = 9, []byte(fmt.Sprintf("new-%d", i))
		return l
	}
	if err := s.StoreLogs([]*raft.Log{other(15), other(16)}); err != nil {
		t.Fatal(err)
	}
	check := func(s *Store) {
		for i := uint64(15); i <= 16; i++ {
			var got raft.Log
			if err := s.GetLog(i, &got); err != nil || got.Term != 9 || string(got.Data) != fmt.Sprintf("new-%d", i) {
				t.Fatalf("entry %d after the cut: %+v %v", i, got, err)
			}
		}
		var got raft.Log
		if err := s.GetLog(14, &got); err != nil || !bytes.Equal(got.Data, entry(14).Data) {
			t.Fatalf("entry 14: %+v %v", got, err)
		}
		if err := s.GetLog(17, &got); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("entry 17 is cut: %v", err)
		}
	}
	check(s)
	s.Close()
	check(open(t, dir))
	// More than the recent bound: the oldest are read from disk.
	s2 := open(t, t.TempDir())
	store(t, s2, 1, recentMax+50)
	holds(t, s2, 1, recentMax+50)
}
