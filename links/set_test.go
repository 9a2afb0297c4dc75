package links

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Every link's goroutine and every loop of the Set ends with its term or
// at Stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a Set over a real tree and state machine, its log a counter
// that applies each command at once (no raft, no listener): its peers'
// URLs lead nowhere, so no batch is ever acknowledged.
type fixture struct {
	s       *Set
	m       *machine.Machine
	st      *store.Store
	leading atomic.Bool
	mu      sync.Mutex
	index   uint64
	cmds    []*machine.Command
}

func newFixture(t *testing.T, peers ...Peer) *fixture {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), &store.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := machine.Open(st, machine.Options{Cluster: "a"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{m: m, st: st}
	if err := f.apply(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
		t.Fatal(err)
	}
	clock := hlc.NewClock(hlc.SystemClock{}, time.Second)
	settings := NewSettings(SettingsDeps{Machine: func() *machine.Machine { return m },
		Stream: func() entry.StreamID { return m.Outbound().Stream() },
		Apply:  f.apply, Commit: f.commit, Leading: f.leading.Load, Logger: log,
		Status: func() []api.LinkStatus { return nil },
		Kept:   func(string) *api.KeptTombstones { return nil }, KeptForPeerLinks: func(string) *api.KeptTombstones { return nil }})
	f.s = New(Deps{
		Local: "a", Peers: peers,
		Stream: m.Outbound, Store: st, Clock: clock, Settings: settings,
		Format: m.Format, LinkOf: m.Link,
		Floor: func() *hlc.Timestamp { return nil }, Applied: func() uint64 { return m.Outbound().Last() },
		Apply: f.apply, Commit: f.commit, Cursors: cursors{st, f.apply},
		Leading: f.leading.Load,
		Client:  &http.Client{Timeout: 50 * time.Millisecond},
		OnAck:   func(string, *wire.Ack) {}, OnConflict: func(string, entry.StreamID, string) {}, OnReseedDone: func(string, bool, bool) {},
		Accepted: func() []string { return nil }, Accept: func(string) {},
		Note:      func(string, bool, string) {},
		PinWindow: time.Hour, TombstoneRetention: time.Hour,
		Logger: log,
	})
	t.Cleanup(f.s.Stop)
	return f
}

func (f *fixture) commit(c *machine.Command) (*machine.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := machine.NewEncoder().Encode(c)
	if err != nil {
		return nil, err
	}
	f.index++
	f.cmds = append(f.cmds, c)
	return f.m.Apply(f.index, data)
}

func (f *fixture) apply(c *machine.Command) error {
	_, err := f.commit(c)
	return err
}

// truncates are the truncation commands the log took.
func (f *fixture) truncates() []*machine.TruncateCmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*machine.TruncateCmd
	for _, c := range f.cmds {
		if c.Truncate != nil {
			out = append(out, c.Truncate)
		}
	}
	return out
}

// cursors keep the links' positions through the fixture's log.
type cursors struct {
	st    *store.Store
	apply func(*machine.Command) error
}

func (c cursors) Cursor(peer string) (entry.Cursor, bool, error) { return c.st.Cursor(peer) }
func (c cursors) SetCursor(peer string, cur entry.Cursor) error {
	return c.apply(&machine.Command{Cursor: &machine.CursorCmd{Peer: peer, At: cur}})
}
func (c cursors) InitCursor(peer string, cur entry.Cursor) error { return c.SetCursor(peer, cur) }

// TestTermLinks: a term's links exist from BeginTerm, run from Run, and are
// gone at End; a link gossip finds between terms waits for the next one
// (ErrNoTerm), which links to it; an aborted term leaves no link.
func TestTermLinks(t *testing.T) {
	f := newFixture(t, Peer{Name: "b", URL: "http://127.0.0.1:1", Secret: "s"})
	f.s.Start()
	defer f.s.Stop()
	if got := f.s.All(); len(got) != 0 {
		t.Fatalf("links before any term: %d", len(got))
	}
	term, err := f.s.BeginTerm()
	if err != nil {
		t.Fatal(err)
	}
	if got := f.s.All(); len(got) != 1 || got[0].Name() != "b" {
		t.Fatalf("a term's links: %v", got)
	}
	f.leading.Store(true)
	term.Run()
	// Gossip finds c while this node leads: linked at once.
	f.s.OnPeer(api.Member{Node: "c1", State: api.LiveAlive, Meta: api.MemberMeta{Cluster: "c", Replicate: "http://127.0.0.1:1"}})
	if _, err := f.s.Get("c"); err == nil {
		t.Fatal("c has no secret and peers are not insecure: it must not be linked")
	}
	f.leading.Store(false)
	term.End()
	if got := f.s.All(); len(got) != 0 {
		t.Fatalf("links after the term: %d", len(got))
	}
	if _, err := f.s.add(Peer{Name: "b", URL: "http://127.0.0.1:1"}); !errors.Is(err, ErrNoTerm) {
		t.Fatalf("a link made between terms: %v; want ErrNoTerm", err)
	}
	if st := f.s.Status(); len(st) != 1 || st[0].State != "follower" {
		t.Fatalf("a follower's view of the links: %+v", st)
	}
	// A term that could not begin: its links go with it.
	term, err = f.s.BeginTerm()
	if err != nil {
		t.Fatal(err)
	}
	term.Abort()
	if got := f.s.All(); len(got) != 0 {
		t.Fatalf("links after an aborted term: %d", len(got))
	}
}

// TestTruncateKeepsWhatAPeerLacks: only the leader cuts the stream, and
// never past what a retaining link acknowledged; with no link it cuts what
// the store applied.
func TestTruncateKeepsWhatAPeerLacks(t *testing.T) {
	f := newFixture(t, Peer{Name: "b", URL: "http://127.0.0.1:1", Secret: "s"})
	if _, err := f.s.BeginTerm(); err != nil {
		t.Fatal(err)
	}
	// Three local writes in the stream.
	clock := hlc.NewClock(hlc.SystemClock{}, time.Second)
	for i := 0; i < 3; i++ {
		e := entry.Entry{Op: entry.OpSet, Key: "k", Value: []byte("v"), Commit: clock.Now()}
		if err := f.apply(&machine.Command{Local: []machine.Proposal{{Entry: e}}}); err != nil {
			t.Fatal(err)
		}
	}
	if last := f.m.Outbound().Last(); last != 3 {
		t.Fatalf("the stream ends at %d after three writes", last)
	}
	if err := f.s.Truncate(); err != nil || len(f.truncates()) != 0 {
		t.Fatalf("a node that does not lead truncated: %v, %v", err, f.truncates())
	}
	f.leading.Store(true)
	if err := f.s.Truncate(); err != nil {
		t.Fatal(err)
	}
	if tr := f.truncates(); len(tr) != 0 {
		t.Fatalf("truncated past what b acknowledged (nothing): %+v", tr[0])
	}
	if err := f.s.Detach("b"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Truncate(); err != nil {
		t.Fatal(err)
	}
	tr := f.truncates()
	if len(tr) != 1 || tr[0].First != f.m.Outbound().Last()+1 {
		t.Fatalf("with b detached the stream is cut to its end: %+v (last %d)", tr, f.m.Outbound().Last())
	}
}

// TestTombstoneCutoffWaitsForPeers: no tombstone goes while a peer this
// node takes writes from has sent nothing, nor while a link is detached.
func TestTombstoneCutoffWaitsForPeers(t *testing.T) {
	f := newFixture(t, Peer{Name: "b", URL: "http://127.0.0.1:1", Secret: "s"})
	if _, err := f.s.BeginTerm(); err != nil {
		t.Fatal(err)
	}
	cut, why, err := f.s.TombstoneCutoff()
	if err != nil || !cut.IsZero() || !strings.Contains(why, "nothing applied from b") {
		t.Fatalf("cutoff %v, why %q, %v; want none until b sent something", cut, why, err)
	}
	if err := f.s.Detach("b"); err != nil {
		t.Fatal(err)
	}
	cut, why, err = f.s.TombstoneCutoff()
	if err != nil || !cut.IsZero() || !strings.Contains(why, "detached") {
		t.Fatalf("cutoff %v, why %q, %v; want none while b is detached", cut, why, err)
	}
}
