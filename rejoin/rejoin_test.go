package rejoin

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

type fakeLink struct {
	name     string
	rebased  int
	phase    uint8
	owed     bool
	reseeded bool
}

func (l *fakeLink) Name() string             { return l.name }
func (l *fakeLink) Rebase()                  { l.rebased++ }
func (l *fakeLink) SetRejoining(phase uint8) { l.phase = phase }
func (l *fakeLink) Owe()                     { l.owed = true }
func (l *fakeLink) Disown()                  { l.owed = false }
func (l *fakeLink) RejoinSeed()              { l.reseeded = true }

type fakeNode struct {
	mu        sync.Mutex
	stream    entry.StreamID
	links     []*fakeLink
	applied   []*machine.Command
	records   map[string]byte
	exclusive int
}

func newRejoiner(t *testing.T, f *fakeNode, now int64) *Rejoiner {
	clock := hlc.NewClock(hlc.NewManualClock(now), time.Second)
	clock.Now()
	var names []string
	for _, l := range f.links {
		names = append(names, l.name)
	}
	return New(Deps{
		Cluster: "a", Clock: clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Configured: names, IdentityCheckWait: time.Hour,
		Stream: func() entry.StreamID { f.mu.Lock(); defer f.mu.Unlock(); return f.stream },
		Epoch:  func() uint32 { return 1 },
		Links: func() []Link {
			out := make([]Link, len(f.links))
			for i, l := range f.links {
				out[i] = l
			}
			return out
		},
		Link: func(peer string) (Link, bool) {
			for _, l := range f.links {
				if l.name == peer {
					return l, true
				}
			}
			return nil, false
		},
		Apply: func(c *machine.Command) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.applied = append(f.applied, c)
			if c.Mint != nil {
				f.stream = c.Mint.Stream
			}
			return nil
		},
		UpdateRecord: func(peer string, record byte, fn func(byte) byte) (byte, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			old := f.records[peer]
			f.records[peer] = fn(old)
			return old, nil
		},
		Exclusive: func(fn func()) { f.exclusive++; fn() },
		Failed:    func() error { return nil },
		Closing:   func() bool { return false },
	})
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestFenceWaitsForEveryPeer: a reopened stream stamps no write before
// every peer answered once; a new one stamps at once.
func TestFenceWaitsForEveryPeer(t *testing.T) {
	f := &fakeNode{stream: entry.NewStreamID(), links: []*fakeLink{{name: "b"}, {name: "c"}}, records: map[string]byte{}}
	fresh := newRejoiner(t, f, 1e18)
	fresh.InitIdentity(true)
	if !closed(fresh.Fence()) {
		t.Fatal("a new stream waits")
	}
	j := newRejoiner(t, f, 1e18)
	j.InitIdentity(false)
	j.OnAck("b", &wire.Ack{})
	if closed(j.Fence()) {
		t.Fatal("writes go ahead before c answered")
	}
	j.OnAck("c", &wire.Ack{})
	if !closed(j.Fence()) {
		t.Fatal("every peer answered, and writes still wait")
	}
	if len(f.applied) != 0 {
		t.Fatalf("commands %v without a loss", f.applied)
	}
}

// TestAPeerHoldingALaterWriteSealsTheStream: a peer that holds a write of
// this cluster stamped after anything the directory remembers proves it
// lost data: the stream is sealed between the committer's groups (a new
// one minted through the log), every link ships the new stream, and the
// rejoin is recorded and asked of every peer.
func TestAPeerHoldingALaterWriteSealsTheStream(t *testing.T) {
	old := entry.NewStreamID()
	f := &fakeNode{stream: old, links: []*fakeLink{{name: "b"}, {name: "c"}}, records: map[string]byte{}}
	j := newRejoiner(t, f, 1e18)
	j.InitIdentity(false)
	later := hlc.Timestamp{Wall: 2e18}
	j.OnAck("b", &wire.Ack{OriginFrontier: later.String()})
	if f.stream == old || f.exclusive != 1 || len(f.applied) != 1 || f.applied[0].Mint == nil {
		t.Fatalf("stream %v (was %v), %d exclusive, applied %+v", f.stream, old, f.exclusive, f.applied)
	}
	for _, l := range f.links {
		if l.rebased != 1 || l.phase != store.RejoinRequesting || f.records[l.name] != store.RejoinRequesting {
			t.Fatalf("link %s: rebased %d, phase %d, record %d", l.name, l.rebased, l.phase, f.records[l.name])
		}
	}
	// A second proof of the same loss seals nothing more.
	j.OnAck("c", &wire.Ack{OriginFrontier: later.String()})
	if len(f.applied) != 1 || !closed(j.Fence()) {
		t.Fatalf("applied %d commands; fence open %v", len(f.applied), closed(j.Fence()))
	}
}
