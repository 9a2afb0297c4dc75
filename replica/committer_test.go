package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/wal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeLog is the committer's environment without a node: a log that keeps
// the commands it took and a state machine that applies each write (or
// answers as told).
type fakeLog struct {
	mu        sync.Mutex
	cmds      []*machine.Command
	committed []int
	// gate, when set, holds each Commit until it is closed.
	gate chan struct{}
	// err is what the next commits return (nil: applied); encode fails the
	// encoding (nothing reaches the log); applyErr is the machine's error
	// after the log took the command.
	err      error
	encode   bool
	applyErr error
	// replayed keys are answered from their record.
	replayed map[string]*api.IdemRecord
	leading  atomic.Bool
	index    uint64
	pinCalls int
}

func newFake() (*fakeLog, CommitEnv) {
	f := &fakeLog{replayed: map[string]*api.IdemRecord{}}
	f.leading.Store(true)
	clock := hlc.NewClock(hlc.NewManualClock(1_000_000_000_000), time.Second)
	env := CommitEnv{
		MaxGroup: 64, IdemWindow: time.Hour, Clock: clock,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Leading:   f.leading.Load,
		NotLeader: func() error { return fmt.Errorf("%w: %w", api.ErrNotWritten, &api.NotLeaderError{LeaderID: "n2"}) },
		Replays: func(key string, _ []byte, _ int64, e *entry.Entry) bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			_, ok := f.replayed[key]
			return ok
		},
		CheckPin: func(pin, commit hlc.Timestamp) error {
			f.mu.Lock()
			f.pinCalls++
			f.mu.Unlock()
			if pin.Wall < commit.Wall-int64(time.Minute) {
				return fmt.Errorf("%w: too old", api.ErrPinOutOfWindow)
			}
			return nil
		},
		Commit: f.commit,
		Committed: func(n int) {
			f.mu.Lock()
			f.committed = append(f.committed, n)
			f.mu.Unlock()
		},
	}
	return f, env
}

func (f *fakeLog) commit(cmd *machine.Command, _ *machine.Encoder) (any, error) {
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.encode {
		return nil, fmt.Errorf("%w: a value the encoder refuses", ErrEncode)
	}
	f.cmds = append(f.cmds, cmd)
	if f.err != nil {
		return nil, f.err
	}
	if f.applyErr != nil {
		return f.applyErr, nil
	}
	res := &machine.Result{Writes: make([]machine.Write, len(cmd.Local))}
	for i, p := range cmd.Local {
		if p.Keyed != nil {
			if r, ok := f.replayed[p.Keyed.Key]; ok {
				res.Writes[i].Replay = r
				continue
			}
		}
		f.index++
		e := p.Entry
		e.Index = f.index
		res.Writes[i] = machine.Write{Entry: e, Outcome: entry.Applied}
	}
	return res, nil
}

func (f *fakeLog) sizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for _, c := range f.cmds {
		out = append(out, len(c.Local))
	}
	return out
}

func set(key string) *Proposal {
	return &Proposal{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: []byte("v")}}
}

func enqueueAll(t *testing.T, c *Committer, ps []*Proposal) {
	t.Helper()
	for _, p := range ps {
		if err := c.Enqueue(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQueuedWritesShareOneCommand: the writes that queue while a command is
// in the log join the next one, in their order, stamped in that order.
func TestQueuedWritesShareOneCommand(t *testing.T) {
	f, env := newFake()
	f.gate = make(chan struct{})
	c := NewCommitter(env)
	defer c.Close()
	first := set("first")
	enqueueAll(t, c, []*Proposal{first})
	var rest []*Proposal
	for i := range 9 {
		rest = append(rest, set(fmt.Sprintf("k%d", i)))
	}
	// The first command is held in the log: the rest queue behind it.
	for c.Floor() == nil {
		time.Sleep(time.Millisecond)
	}
	enqueueAll(t, c, rest)
	close(f.gate)
	var last hlc.Timestamp
	for i, p := range append([]*Proposal{first}, rest...) {
		if err := c.Await(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		if p.Entry.Index != uint64(i+1) || !last.Less(p.Entry.Commit) || p.Outcome != entry.Applied {
			t.Fatalf("write %d: index %d, commit %v after %v, %v", i, p.Entry.Index, p.Entry.Commit, last, p.Outcome)
		}
		last = p.Entry.Commit
	}
	if got := f.sizes(); len(got) != 2 || got[0] != 1 || got[1] != 9 {
		t.Fatalf("commands of %v writes, want [1 9]", got)
	}
	// The committer reports a group's writes after it answered them: wait
	// for the second report (read under the fake's lock).
	var committed []int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		f.mu.Lock()
		committed = append([]int(nil), f.committed...)
		f.mu.Unlock()
		if len(committed) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if len(committed) != 2 || committed[0]+committed[1] != 10 {
		t.Fatalf("committed %v", committed)
	}
}

// TestLingerTakesTheWritersBack: after a group of several, the next group
// takes the writers coming back, up to as many as were answered, and no
// more; a writer alone does not wait for anyone.
func TestLingerTakesTheWritersBack(t *testing.T) {
	_, env := newFake()
	c := &Committer{env: env, in: make(chan *Proposal, 8)}
	for i := range 5 {
		c.in <- set(fmt.Sprint(i))
	}
	c.pending = []*Proposal{set("p")}
	c.prev = 3
	c.linger()
	if len(c.pending) != 3 || len(c.in) != 3 {
		t.Fatalf("lingered to %d writes with %d left queued; want 3 and 3", len(c.pending), len(c.in))
	}
	c.pending, c.prev = c.pending[:1], 0
	c.linger()
	if len(c.pending) != 1 {
		t.Fatalf("a writer alone waited for %d others", len(c.pending)-1)
	}
}

// TestDeposedLeaderStampsNothing: a group taken after the node lost the
// lead is refused whole as not written, and nothing reaches the log.
func TestDeposedLeaderStampsNothing(t *testing.T) {
	f, env := newFake()
	c := NewCommitter(env)
	defer c.Close()
	f.leading.Store(false)
	ps := []*Proposal{set("a"), set("b")}
	enqueueAll(t, c, ps)
	for _, p := range ps {
		err := c.Await(context.Background(), p)
		var nl *api.NotLeaderError
		if !errors.Is(err, api.ErrNotWritten) || !errors.As(err, &nl) {
			t.Fatalf("%v", err)
		}
	}
	if got := f.sizes(); len(got) != 0 {
		t.Fatalf("a deposed leader logged %v", got)
	}
}

// TestReplayIsAnsweredFromTheRecord: a retry whose record exists is
// answered from it, before its pin is judged (the first attempt applied,
// perhaps under another leader's clock); another write of the same group
// whose pin is out of the window is refused alone.
func TestReplayIsAnsweredFromTheRecord(t *testing.T) {
	f, env := newFake()
	rec := &api.IdemRecord{Key: "retry", Status: 200, Body: []byte("{}\n"), Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: 5}, Origin: "a"}}
	f.replayed["retry"] = rec
	c := NewCommitter(env)
	defer c.Close()
	old := hlc.Timestamp{Wall: 1}
	retry := set("k")
	retry.Pin, retry.Idem = old, &api.Keyed{Key: "retry", Fingerprint: []byte{1}, Answer: api.AnswerWrite}
	stale := set("j")
	stale.Pin = old
	fresh := set("m")
	enqueueAll(t, c, []*Proposal{retry, stale, fresh})
	if err := c.Await(context.Background(), retry); err != nil || retry.Replay != rec {
		t.Fatalf("the retry: %v, replay %v", err, retry.Replay)
	}
	if err := c.Await(context.Background(), stale); !errors.Is(err, api.ErrPinOutOfWindow) {
		t.Fatalf("a pin out of the window: %v", err)
	}
	if err := c.Await(context.Background(), fresh); err != nil || fresh.Entry.Index == 0 {
		t.Fatalf("the fresh write beside them: %v", err)
	}
	if f.pinCalls != 1 {
		t.Fatalf("the pin was checked %d times; only the write without a record is", f.pinCalls)
	}
	var keyed int
	for _, cmd := range f.cmds {
		for _, p := range cmd.Local {
			if p.Keyed != nil {
				keyed++
				if p.Entry.Stamp != old || p.Keyed.Expires != p.Entry.Commit.Wall+int64(time.Hour) {
					t.Fatalf("the retry's proposal %+v", p)
				}
			}
		}
	}
	if keyed != 1 {
		t.Fatalf("%d keyed proposals logged", keyed)
	}
}

// TestAFailedCommitAnswersEveryWriter: what a failed commit means to each
// writer of the group: not written when the command never reached the log
// (an append the log refused and cut back, a leader lost before it took
// the command, an encoding that failed), an unknown outcome when it may
// yet apply (an fsync error, a command in the log the machine did not
// apply).
func TestAFailedCommitAnswersEveryWriter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		set      func(f *fakeLog)
		want     error
		notWant  error
		inTheLog bool
	}{
		{"an append the log refused", func(f *fakeLog) { f.err = fmt.Errorf("%w: ENOSPC", wal.ErrAppendFailed) }, api.ErrNotWritten, api.ErrUnknownOutcome, true},
		{"the lead lost before the log took it", func(f *fakeLog) { f.err = &cluster.NotLeaderError{} }, api.ErrNotWritten, api.ErrUnknownOutcome, true},
		{"an fsync that failed", func(f *fakeLog) { f.err = errors.New("fsync: input/output error") }, api.ErrUnknownOutcome, api.ErrNotWritten, true},
		{"a log that broke", func(f *fakeLog) { f.err = fmt.Errorf("%w: %w", wal.ErrAppendFailed, wal.ErrBroken) }, api.ErrUnknownOutcome, api.ErrNotWritten, true},
		{"in the log, not applied", func(f *fakeLog) { f.applyErr = errors.New("pebble: disk") }, api.ErrUnknownOutcome, api.ErrNotWritten, true},
		{"an encoding that failed", func(f *fakeLog) { f.encode = true }, api.ErrNotWritten, api.ErrUnknownOutcome, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, env := newFake()
			tc.set(f)
			c := NewCommitter(env)
			defer c.Close()
			ps := []*Proposal{set("a"), set("b"), set("c")}
			enqueueAll(t, c, ps)
			for _, p := range ps {
				err := c.Await(context.Background(), p)
				if !errors.Is(err, tc.want) || errors.Is(err, tc.notWant) {
					t.Fatalf("%s: %v", p.Entry.Key, err)
				}
			}
			if got := f.sizes(); tc.inTheLog != (len(got) > 0) {
				t.Fatalf("the log holds commands of %v", got)
			}
		})
	}
}

// TestCancelledWhileQueuedIsNotWritten: a writer that gives up before its
// proposal was taken into a group is told not written, and the proposal
// never reaches the log; one that gives up once it was taken is told the
// outcome is unknown.
func TestCancelledWhileQueuedIsNotWritten(t *testing.T) {
	f, env := newFake()
	f.gate = make(chan struct{})
	c := NewCommitter(env)
	defer c.Close()
	held := set("held")
	enqueueAll(t, c, []*Proposal{held})
	for c.Floor() == nil {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	queued := set("queued")
	if err := c.Enqueue(ctx, queued); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := c.Await(ctx, queued); !errors.Is(err, api.ErrNotWritten) {
		t.Fatalf("cancelled while queued: %v", err)
	}
	hctx, hcancel := context.WithCancel(context.Background())
	hcancel()
	if err := c.Await(hctx, held); !errors.Is(err, api.ErrUnknownOutcome) {
		t.Fatalf("cancelled while in the log: %v", err)
	}
	close(f.gate)
	after := set("after")
	enqueueAll(t, c, []*Proposal{after})
	if err := c.Await(context.Background(), after); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range f.cmds {
		for _, p := range cmd.Local {
			if p.Entry.Key == "queued" {
				t.Fatal("a cancelled proposal reached the log")
			}
		}
	}
}

// TestFailedWritePathRefusesUntilRestart: once Fail is called, every write
// is refused as not written, queued or new; Close answers what is queued
// and the goroutine exits.
func TestFailedWritePathRefusesUntilRestart(t *testing.T) {
	_, env := newFake()
	c := NewCommitter(env)
	cause := errors.New("the tree refused a batch")
	c.Fail(cause)
	if !errors.Is(c.Failed(), cause) {
		t.Fatalf("Failed: %v", c.Failed())
	}
	if err := c.Enqueue(context.Background(), set("x")); !errors.Is(err, api.ErrNotWritten) || !errors.Is(err, cause) {
		t.Fatalf("%v", err)
	}
	c.Close()
	if err := c.Enqueue(context.Background(), set("y")); !errors.Is(err, api.ErrNotWritten) {
		t.Fatalf("after close: %v", err)
	}
}

// TestExclusiveWaitsForTheGroupInFlight: a stream replaced under Exclusive
// never sees a group between its stamping and its apply.
func TestExclusiveWaitsForTheGroupInFlight(t *testing.T) {
	f, env := newFake()
	f.gate = make(chan struct{})
	c := NewCommitter(env)
	defer c.Close()
	p := set("a")
	enqueueAll(t, c, []*Proposal{p})
	for c.Floor() == nil {
		time.Sleep(time.Millisecond)
	}
	ran := make(chan int, 1)
	go c.Exclusive(func() { ran <- len(f.sizes()) })
	select {
	case <-ran:
		t.Fatal("Exclusive ran with a group in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(f.gate)
	if n := <-ran; n != 1 {
		t.Fatalf("Exclusive ran with %d commands logged, want the group's", n)
	}
	if err := c.Await(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}
