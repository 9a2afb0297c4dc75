package replica

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

// events records what a replica asked of its node, in order.
type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, s)
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

// fakeTerm is a term's links as the replica sees them.
type fakeTerm struct {
	ev *events
	r  *Replica
}

func (t fakeTerm) Run() {
	// The links of a term run only once writes may be stamped.
	if t.r.Ready() {
		t.ev.add("run (ready)")
	} else {
		t.ev.add("run (not ready)")
	}
}
func (t fakeTerm) Abort() { t.ev.add("abort") }
func (t fakeTerm) End()   { t.ev.add("end") }

// openReplica opens a node alone's replica on dir: real Pebble, a real raft
// log on disk, no listener.
func openReplica(t *testing.T, dir string, ev *events, seal func(entry.StreamID, string) error, tweak ...func(*Deps)) (*Replica, bool) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(dir, "store"), &store.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	var r *Replica
	d := Deps{
		Cluster: "a", NodeID: "n1", Incarnation: "0000000a", Dir: dir, Store: st,
		Clock: hlc.NewClock(hlc.SystemClock{}, time.Second), Logger: log,
		Committer: CommitEnv{MaxGroup: 16, IdemWindow: time.Hour},
		OnFatal:   func(err error) { t.Errorf("fatal: %v", err) },
		Describe:  func() string { return "" },
		Identity: func(checked bool) error {
			ev.add("identity")
			return nil
		},
		BeginTerm: func() (Term, error) {
			if r.Ready() {
				ev.add("links (ready)")
			} else {
				ev.add("links")
			}
			return fakeTerm{ev, r}, nil
		},
		Seal: func(s entry.StreamID, why string) error {
			ev.add("seal")
			if seal != nil {
				return seal(s, why)
			}
			return nil
		},
	}
	for _, f := range tweak {
		f(&d)
	}
	r = New(d)
	created, err := r.Open()
	if err != nil {
		r.Committer().Close()
		st.Close()
		t.Fatal(err)
	}
	var once sync.Once
	closers[r] = func() {
		once.Do(func() {
			r.Committer().Close()
			r.Group().Close()
			st.Close()
		})
	}
	t.Cleanup(closers[r])
	return r, created
}

// closers close each replica the tests opened, once.
var closers = map[*Replica]func(){}

// put writes key through the submitter, as a door does.
func put(t *testing.T, r *Replica, key, value string) api.WriteResult {
	t.Helper()
	b := &Bounds{MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, MaxReplicateBytes: 16 << 20, PinWindow: time.Hour,
		Clock: r.d.Clock, Peers: func() []PeerLimits { return nil }}
	sub := &Submitter{Bounds: b, Com: r.Committer(), Admit: func(context.Context) error { return nil }}
	res, err := sub.Submit(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: []byte(value)}})()
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return res
}

// TestOpenAloneThenReopen: a node alone's replica mints its stream and
// checks its identity before it makes its only term's links and leads; a write it acknowledged is there
// after a reopen, in the same stream, and the reopen mints nothing.
func TestOpenAloneThenReopen(t *testing.T) {
	dir := t.TempDir()
	var ev events
	r, created := openReplica(t, dir, &ev, nil)
	if !created || !r.Ready() || r.Stream().Stream().IsZero() {
		t.Fatalf("first open: created %v, ready %v, stream %v", created, r.Ready(), r.Stream().Stream())
	}
	if got := ev.list(); !slices.Equal(got, []string{"identity", "links"}) {
		t.Fatalf("first open asked %v; want the identity check, then its only term's links", got)
	}
	// Its links run from Run to Stop.
	r.Run()
	res := put(t, r, "k", "v1")
	stream := r.Stream().Stream()
	if res.Stream != stream || res.Index != r.Stream().Last() {
		t.Fatalf("write at %v/%d; the stream is %v ending at %d", res.Stream, res.Index, stream, r.Stream().Last())
	}
	r.Stop()
	if got := ev.list(); !slices.Equal(got, []string{"identity", "links", "run (ready)", "end"}) || r.Ready() {
		t.Fatalf("a node alone's term did %v (ready after Stop: %v); want its links run, then ended", got, r.Ready())
	}
	closers[r]()

	var ev2 events
	r2, created := openReplica(t, dir, &ev2, nil)
	if created || r2.Stream().Stream() != stream {
		t.Fatalf("reopen: created %v, stream %v (was %v)", created, r2.Stream().Stream(), stream)
	}
	rec, err := r2.d.Store.Get("k")
	if err != nil || string(rec.Value) != "v1" {
		t.Fatalf("after reopen: %q, %v", rec.Value, err)
	}
	if r2.Applied() == 0 || r2.StreamApplied() != r2.Stream().Last() {
		t.Fatalf("progress: applied %d, stream applied %d of %d", r2.Applied(), r2.StreamApplied(), r2.Stream().Last())
	}
}

// TestTermOrder: a term makes its links while writes are still refused,
// seals a recovered stream before anything runs, and only then leads and
// runs the links; a term ends by stopping them, and one whose seal fails
// aborts its links and never leads.
func TestTermOrder(t *testing.T) {
	var ev events
	sealErr := errors.New("disk gone")
	var failSeal bool
	r, _ := openReplica(t, t.TempDir(), &ev, func(entry.StreamID, string) error {
		if failSeal {
			return sealErr
		}
		return nil
	})
	// As if elected: the solo term ended and the next begins, the first of
	// a process in a cluster of several (the identity is checked once). A
	// recovery of a build before the record left its SEAL naming this
	// stream.
	r.lead.ready.Store(false)
	r.lead.began = false
	if err := os.WriteFile(r.SealFile(), []byte(r.Stream().Stream().String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.beginTerm(7); err != nil {
		t.Fatal(err)
	}
	want := []string{"identity", "links", "seal", "run (ready)"}
	if got := ev.list()[2:]; !slices.Equal(got, want) {
		t.Fatalf("a term did %v; want %v", got, want)
	}
	if _, err := os.Stat(r.SealFile()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the seal file outlived its seal: %v", err)
	}
	put(t, r, "k", "v") // the term leads
	r.endTerm("test")
	if got := ev.list(); got[len(got)-1] != "end" || r.Ready() {
		t.Fatalf("after the end: %v, ready %v", got, r.Ready())
	}

	// A term whose seal fails: its links are aborted, it never leads.
	failSeal = true
	if err := os.WriteFile(r.SealFile(), []byte(r.Stream().Stream().String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := len(ev.list())
	if err := r.beginTerm(8); !errors.Is(err, sealErr) {
		t.Fatalf("term with a failed seal: %v", err)
	}
	if got := ev.list()[n:]; !slices.Equal(got, []string{"links", "seal", "abort"}) || r.Ready() {
		t.Fatalf("a failed term did %v (ready %v); want its links made, the seal tried, the links aborted", got, r.Ready())
	}
	// Refused, not written, while no term runs.
	b := &Submitter{Bounds: &Bounds{MaxKeyBytes: 1024, MaxValueBytes: 1024, MaxReplicateBytes: 1 << 20, PinWindow: time.Hour, Clock: r.d.Clock,
		Peers: func() []PeerLimits { return nil }}, Com: r.Committer(), Admit: func(context.Context) error { return nil }}
	if _, err := b.Submit(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: "x", Value: []byte("v")}})(); !errors.Is(err, api.ErrNotWritten) {
		t.Fatalf("a write with no term: %v; want not written", err)
	}
}
