package transport_test

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
)

// TestFloorsHeldBackFromAPeerThatCannotKeepThem: a delete of a counter (its
// floors) waits, with what follows it, while the peer's cluster does not
// keep floors (an older build: it would drop them and count the deleted
// increments for ever); the link says why, and ships them once the peer
// can.
func TestFloorsHeldBackFromAPeerThatCannotKeepThem(t *testing.T) {
	var takes atomic.Bool
	l := newLink(t, acceptor.Options{TakesExpiry: func() bool { return true }, TakesFloors: takes.Load}, http.DefaultTransport, 100)
	clock := hlc.NewClock(nil, 0)
	stop := l.run()
	defer stop()
	if err := l.log.apply(&machine.Command{Format: &machine.FormatCmd{Version: machine.FormatCounterFloors}}); err != nil {
		t.Fatal(err)
	}
	if err := l.log.apply(&machine.Command{Local: []machine.Proposal{
		{Entry: entry.Entry{Commit: clock.Now(), Op: entry.OpCounter, Key: "c"}, Delta: 3},
		{Entry: entry.Entry{Commit: clock.Now(), Op: entry.OpDelete, Key: "c"}},
		{Entry: entry.Entry{Commit: clock.Now(), Op: entry.OpSet, Key: "after", Value: []byte("v")}},
	}}); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, l.sh, 1)
	time.Sleep(300 * time.Millisecond)
	if got := l.sh.Acked(); got != 1 {
		t.Fatalf("acked %d: the delete's floors went to a peer that cannot keep them", got)
	}
	if _, err := l.dst.Get("after"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the peer holds what follows the held delete (%v)", err)
	}
	if st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false }); !strings.Contains(st.LastError, "floors") {
		t.Fatalf("the link's last error %q does not say it waits for floors", st.LastError)
	}
	takes.Store(true)
	waitAcked(t, l.sh, 3)
	if v, _, _, err := l.dst.Read("c", 0); err != nil || v.Present {
		t.Fatalf("the peer reads the deleted counter as %+v %v", v, err)
	}
}

// TestReseedRelaysFloors: a re-seed's snapshot carries a counter's floors
// with its totals, so the peer reads a deleted counter as deleted and one
// counted on after a delete as what was counted after it, and its tree
// hashes as the source's.
func TestReseedRelaysFloors(t *testing.T) {
	var l *link
	l = newLinkOpts(t, acceptor.Options{TakesExpiry: func() bool { return true }, TakesFloors: func() bool { return true }}, http.DefaultTransport, 100,
		func(o *transport.Options) {
			o.Applied = func() uint64 { return l.log.Last() }
			o.Snapshots = snapshotsOf{&l}
		})
	clock := hlc.NewClock(nil, 0)
	if err := l.log.apply(&machine.Command{Format: &machine.FormatCmd{Version: machine.FormatCounterFloors}}); err != nil {
		t.Fatal(err)
	}
	incr := func(key string, d int64) machine.Proposal {
		return machine.Proposal{Entry: entry.Entry{Commit: clock.Now(), Op: entry.OpCounter, Key: key}, Delta: d}
	}
	del := func(key string) machine.Proposal {
		return machine.Proposal{Entry: entry.Entry{Commit: clock.Now(), Op: entry.OpDelete, Key: key}}
	}
	if err := l.log.apply(&machine.Command{Local: []machine.Proposal{incr("c", 3), del("c"), incr("c", 2), incr("d", 1), del("d")}}); err != nil {
		t.Fatal(err)
	}
	l.sh.Reseed("asked by the test")
	stop := l.run()
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for st := l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false }); st.Reseed.Runs < 1 || st.Reseed.Running; st = l.sh.Status(transport.Thresholds{}, func(uint64) (int64, bool) { return 0, false }) {
		if time.Now().After(deadline) {
			t.Fatalf("no re-seed ran: %+v", st.Reseed)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v, _, _, err := l.dst.Read("c", 0); err != nil || string(v.Value) != "2" {
		t.Fatalf("the re-seeded peer reads c as %+v %v, want 2 (counted after its delete)", v, err)
	}
	if v, _, _, err := l.dst.Read("d", 0); err != nil || v.Present {
		t.Fatalf("the re-seeded peer reads the deleted d as %+v %v", v, err)
	}
	src, _ := l.log.st.Digest()
	dst, _ := l.dst.Digest()
	if src.Hash != dst.Hash || src.Counters != 1 {
		t.Fatalf("digests after the re-seed: %+v and %+v", src, dst)
	}
}
