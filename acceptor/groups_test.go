package acceptor

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// faultyLog fails its next ApplyInbound: before the part applies (the
// group's leader was unreachable), or after (its answer was lost).
type faultyLog struct {
	Log
	before, after atomic.Int32
	// open fails the next SetOpenStreams.
	open atomic.Int32
}

func (l *faultyLog) SetOpenStreams(peer string, open []entry.StreamID) error {
	if l.open.Add(-1) >= 0 {
		return errors.New("the group's leader is unreachable")
	}
	return l.Log.SetOpenStreams(peer, open)
}

func (l *faultyLog) ApplyInbound(in *wire.Inbound, raw []byte) (*wire.InboundResult, error) {
	if l.before.Add(-1) >= 0 {
		return nil, errors.New("the group's leader is unreachable")
	}
	res, err := l.Log.ApplyInbound(in, raw)
	if err == nil && l.after.Add(-1) >= 0 {
		return nil, errors.New("the group's answer was lost")
	}
	return res, err
}

// TestGroupsReceiveAsOne: a peer's batches posted over HTTP to a receiver
// of three raft groups (real stores, each group its own state machine)
// leave every key as at a receiver of one group, in the group its slot
// names; each acknowledgment names the batch's end. A part whose group
// failed before applying, or whose answer was lost after, fails the
// batch (an unknown outcome for the sender); while one group lags, the
// mark a heartbeat answers is the least of the groups'; the batch sent
// again applies in the lagging group and collapses in the others. A dead
// letter is listed in the acknowledgment from the group that holds it.
func TestGroupsReceiveAsOne(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	clock := hlc.NewClock(pc, 500*time.Millisecond)
	opts := Options{Local: "a", Secrets: map[string]string{"b": "secret-b"},
		MaxBodyBytes: 64 << 10, MaxValueBytes: 64, Logger: quiet, TakesMarkers: func() bool { return true }}
	serve := func(st Store, l Log) *fixture {
		srv := httptest.NewServer(New(st, l, clock, opts))
		t.Cleanup(srv.Close)
		return &fixture{t: t, clock: clock, pc: pc, srv: srv}
	}
	wst, err := store.Open(t.TempDir(), &store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wst.Close() })
	whole := serve(wst, direct(t, wst, "a"))
	whole.st = wst
	slots, err := slot.Initial(3)
	if err != nil {
		t.Fatal(err)
	}
	var stores []*store.Store
	g := &Groups{GroupOf: slots.Group, TakesParts: func() bool { return true }}
	faulty := &faultyLog{}
	for i := range 3 {
		st, err := store.Open(t.TempDir(), &store.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		var l Log = direct(t, st, "a")
		if i == 1 {
			faulty.Log = l
			l = faulty
		}
		stores, g.Stores, g.Logs = append(stores, st), append(g.Stores, st), append(g.Logs, l)
	}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	grouped := serve(g, g)

	keys := make([]string, 30)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	rng := rand.New(rand.NewPCG(51, 1))
	index := uint64(0)
	batch := func() []entry.Entry {
		var ents []entry.Entry
		for range 1 + rng.IntN(10) {
			index++
			k := keys[rng.IntN(len(keys))]
			e := whole.entry(index, k, fmt.Sprint("v", index))
			switch rng.IntN(6) {
			case 0:
				e.Op, e.Value = entry.OpDelete, nil
			case 1:
				from := rng.IntN(len(keys) - 6)
				e.Op, e.Key, e.End, e.Value = entry.OpDeleteRange, keys[from], keys[from+2+rng.IntN(4)], nil
			case 2:
				e.Op, e.Key, e.Value = entry.OpMulti, "", nil
				for range 2 + rng.IntN(3) {
					e.Ops = append(e.Ops, entry.BatchOp{Op: entry.OpSet, Key: keys[rng.IntN(len(keys))], Value: []byte(fmt.Sprint("m", index))})
				}
			case 3:
				e.Value = []byte(strings.Repeat("x", 100)) // over MaxValueBytes: a dead letter
			}
			ents = append(ents, e)
		}
		return ents
	}
	post := func(f *fixture, ents []entry.Entry, wantOK bool) map[string]any {
		t.Helper()
		code, ack := f.postBatch(ents...)
		if wantOK && (code != 200 || uint64(ack["hwm"].(float64)) != ents[len(ents)-1].Last()) {
			t.Fatalf("batch ending at %d: %d %v", ents[len(ents)-1].Last(), code, ack)
		}
		if !wantOK && code == 200 {
			t.Fatalf("batch ending at %d acknowledged while a group failed: %v", ents[len(ents)-1].Last(), ack)
		}
		return ack
	}
	deadListed := 0
	for n := range 40 {
		ents := batch()
		whole.pc.Advance(time.Millisecond)
		post(whole, ents, true)
		switch n % 10 {
		case 4, 7:
			if n%10 == 4 {
				faulty.before.Store(1)
			} else {
				faulty.after.Store(1)
			}
			post(grouped, ents, false)
			// A heartbeat answers the least of the groups' marks: the
			// sender resends from there.
			code, ack := grouped.post(wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}}),
				"X-Replicator-Origin", "b", "Authorization", "Bearer secret-b")
			wantMark := ents[0].Index - 1
			if n%10 == 7 {
				wantMark = ents[len(ents)-1].Last() // the lost answer's part did apply
			}
			if code != 200 || uint64(ack["hwm"].(float64)) != wantMark {
				t.Fatalf("heartbeat after a failed part: %d %v, want mark %d", code, ack, wantMark)
			}
			ack = post(grouped, ents, true)
			if ack["duplicates"].(float64) == 0 && len(ents) > 1 {
				t.Fatalf("the batch sent again collapsed nowhere: %v", ack)
			}
		default:
			ack := post(grouped, ents, true)
			if d, ok := ack["dead_lettered_at"].([]any); ok {
				deadListed += len(d)
			}
		}
	}
	if deadListed == 0 {
		t.Fatal("no acknowledgment listed a dead letter")
	}
	for _, k := range keys {
		want, werr := whole.st.Get(k)
		gi := slots.Group(k)
		got, gerr := stores[gi].Get(k)
		if !errors.Is(werr, gerr) && (werr != nil || gerr != nil) || !reflect.DeepEqual(want, got) {
			t.Fatalf("key %q: one group holds %+v (%v), group %d of three %+v (%v)", k, want, werr, gi, got, gerr)
		}
		for h, st := range stores {
			if rec, err := st.Get(k); h != gi && err == nil && rec.Live(0) {
				t.Fatalf("key %q of group %d holds a value in group %d", k, gi, h)
			}
		}
	}
	wd, err := whole.st.DeadLetters()
	if err != nil {
		t.Fatal(err)
	}
	gd := 0
	for _, st := range stores {
		d, err := st.DeadLetters()
		if err != nil {
			t.Fatal(err)
		}
		gd += len(d)
	}
	if len(wd) == 0 || gd != len(wd) {
		t.Fatalf("%d dead letters in the groups, %d at one group", gd, len(wd))
	}
	h, err := g.HWM("b", streamB)
	if err != nil || h.Index != index {
		t.Fatalf("the groups' mark %d (%v), want %d", h.Index, err, index)
	}

	// A heartbeat telling b's open streams while group 1 fails to record
	// them: group 0, whose record the acceptor reads back, is written last
	// and keeps none, so the next heartbeat records them in every group.
	open := func(st *store.Store) []entry.StreamID {
		ls, err := st.LinkSettings()
		if err != nil {
			t.Fatal(err)
		}
		return ls["b"].Open
	}
	opened := New(g, g, clock, Options{Local: "a", Secrets: map[string]string{"b": "secret-b"}, Logger: quiet,
		TakesMarkers: func() bool { return true }, TakesOpenStreams: func() bool { return true },
		OpenOf: func(string) []entry.StreamID { return open(stores[0]) }})
	osrv := httptest.NewServer(opened)
	t.Cleanup(osrv.Close)
	of := &fixture{t: t, clock: clock, pc: pc, srv: osrv}
	hb := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB, Open: []entry.StreamID{streamB}}})
	faulty.open.Store(1)
	if code, ack := of.post(hb, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b"); code == 200 {
		t.Fatalf("a heartbeat whose open streams one group failed to record was answered: %v", ack)
	}
	if got := open(stores[0]); got != nil {
		t.Fatalf("group 0 recorded open streams %v though group 1 did not", got)
	}
	if code, ack := of.post(hb, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b"); code != 200 {
		t.Fatalf("the heartbeat again: %d %v", code, ack)
	}
	for i, st := range stores {
		if got := open(st); len(got) != 1 || got[0] != streamB {
			t.Fatalf("group %d records open streams %v, want [%s]", i, got, streamB)
		}
	}
}
