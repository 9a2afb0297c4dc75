package links

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// peerStreams plays a peer cluster b that runs several streams (one per
// raft group, issue 51), applying its batches through the fixture's log.
type peerStreams struct {
	t    *testing.T
	f    *fixture
	last map[entry.StreamID]uint64
}

// send applies one entry of b's stream st: a set of key (a delete when
// value is nil), stamped at stamp and committed at commit.
func (p *peerStreams) send(st entry.StreamID, key string, value []byte, stamp, commit hlc.Timestamp) {
	p.t.Helper()
	p.last[st]++
	e := entry.Entry{Index: p.last[st], Origin: "b", Stream: st, Commit: commit, Stamp: stamp, Op: entry.OpSet, Key: key, Value: value}
	if value == nil {
		e.Op = entry.OpDelete
	}
	in := &machine.Inbound{Sender: "b", MaxStreams: 16, HLC: commit, At: 1,
		Batch: &wire.Batch{Header: wire.Header{Sender: "b", Stream: st}, Entries: []entry.Entry{e}}}
	res, err := p.f.commit(&machine.Command{Inbound: in})
	if err != nil || res.Inbound == nil || res.Inbound.Err != nil || res.Inbound.HWM != e.Index || res.Inbound.Applied+res.Inbound.Stale != 1 {
		p.t.Fatalf("b's entry %d of %s: %+v, %v", e.Index, st, res, err)
	}
}

// TestTombstoneCutoffWaitsForTheLeastAdvancedOpenStream: a peer that runs
// several streams (one per raft group) and told them is as far as the
// least advanced: while one of its streams lags past the retention and the
// others run ahead, a tombstone the lagging stream's late write would
// resurrect stays, and the late write finds it. A stream it told open of
// which nothing is known holds collection back until it idles; a stream no
// longer open (sealed by a restore) is left out; a peer that never told
// its streams (an older build, one stream at a time) is as far as its
// furthest, and the same late write would then bring the key back: the
// hazard the rule exists for.
func TestTombstoneCutoffWaitsForTheLeastAdvancedOpenStream(t *testing.T) {
	fast, lagging, silent := entry.StreamID{1}, entry.StreamID{2}, entry.StreamID{3}
	const h = int64(time.Hour) // the fixture's retention and pin window
	now := time.Now().UnixNano()
	at := func(ago int64) hlc.Timestamp { return hlc.Timestamp{Wall: now - ago} }
	setup := func(t *testing.T, tell bool) (*fixture, *peerStreams) {
		f := newFixture(t, Peer{Name: "b", URL: "http://127.0.0.1:1", Secret: "s"})
		if _, err := f.s.BeginTerm(); err != nil {
			t.Fatal(err)
		}
		if tell {
			if err := f.apply(&machine.Command{Link: &machine.LinkCmd{Peer: "b", SetOpen: true, Open: []entry.StreamID{fast, lagging}}}); err != nil {
				t.Fatal(err)
			}
		}
		f.s.d.Clock.Now() // this node's last stamp: its outbound bound
		p := &peerStreams{t: t, f: f, last: map[entry.StreamID]uint64{}}
		// The lagging stream (another group of b) last brought a write
		// committed five hours ago; the fast one runs up to a minute ago
		// and deleted k three hours ago.
		p.send(lagging, "other", []byte("v"), at(5*h), at(5*h))
		p.send(fast, "k", []byte("v"), at(4*h), at(4*h))
		p.send(fast, "k", nil, at(3*h), at(time.Minute.Nanoseconds()))
		return f, p
	}
	// lateWrite is the lagging stream's write of k, stamped four hours ago
	// (before the delete), arriving only now; it reports whether k holds
	// a value after it.
	lateWrite := func(t *testing.T, f *fixture, p *peerStreams) bool {
		if _, err := f.s.CollectTombstones(); err != nil {
			t.Fatal(err)
		}
		p.send(lagging, "k", []byte("old"), at(4*h), at(5*h-int64(time.Second)))
		r, err := f.st.Get("k")
		if errors.Is(err, store.ErrNotFound) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return r.Live(now)
	}

	t.Run("told", func(t *testing.T) {
		f, p := setup(t, true)
		cut, why, err := f.s.TombstoneCutoff()
		if err != nil || why != "" {
			t.Fatalf("cutoff %v, why %q, %v", cut, why, err)
		}
		if want := at(6 * h); cut != want {
			t.Fatalf("cutoff %v, want the lagging stream's frontier less the pin window %v", cut, want)
		}
		if lateWrite(t, f, p) {
			t.Fatal("the lagging stream's late write brought k back: its tombstone was collected")
		}
		// A stream told open of which nothing is known holds everything
		// back, until its idle frontier comes.
		if err := f.apply(&machine.Command{Link: &machine.LinkCmd{Peer: "b", SetOpen: true, Open: []entry.StreamID{fast, lagging, silent}}}); err != nil {
			t.Fatal(err)
		}
		if cut, why, err := f.s.TombstoneCutoff(); err != nil || !cut.IsZero() || !strings.Contains(why, "open stream "+silent.String()) {
			t.Fatalf("cutoff %v, why %q, %v; want none while b's stream %s is unknown", cut, why, err, silent)
		}
		f.s.NoteIdle("b", silent, at(0))
		// The lagging stream idles too (it sent everything): b is now as
		// far as its fast stream.
		f.s.NoteIdle("b", lagging, at(2*h))
		if cut, _, err := f.s.TombstoneCutoff(); err != nil || cut != at(3*h) {
			t.Fatalf("cutoff %v, %v; want the least of the streams' frontiers, the lagging one's idle bound, less the pin window %v", cut, err, at(3*h))
		}
		// b was restored: its new stream replaced the others, which never
		// advance again and hold nothing back.
		if err := f.apply(&machine.Command{Link: &machine.LinkCmd{Peer: "b", SetOpen: true, Open: []entry.StreamID{silent}}}); err != nil {
			t.Fatal(err)
		}
		if cut, _, err := f.s.TombstoneCutoff(); err != nil || cut.Less(at(h+int64(time.Minute))) {
			t.Fatalf("cutoff %v, %v; want the retention's, about %v, with the old streams left out", cut, err, at(h))
		}
	})
	t.Run("never told", func(t *testing.T) {
		f, p := setup(t, false)
		cut, _, err := f.s.TombstoneCutoff()
		if err != nil || !at(3*h).Less(cut) {
			t.Fatalf("cutoff %v, %v; a peer that never told its streams is as far as its furthest", cut, err)
		}
		if !lateWrite(t, f, p) {
			t.Fatal("k stayed deleted: the scenario no longer shows the hazard the open streams guard against")
		}
	})
}
