package acceptor

import (
	"fmt"
	"slices"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// heartbeat answers an empty batch: where the sender's stream stands here,
// whether this node holds other streams of the sender's cluster (a sender
// that starts empty learns it lost its data), and it records a request for
// a re-seed.
func (a *Acceptor) heartbeat(sender string, b *wire.Batch, ack wire.Ack, dropped int) (wire.Ack, error) {
	hwm, err := a.store.HWM(sender, b.Stream)
	if err != nil {
		return ack, err
	}
	ack.HWM = hwm.Index
	if !hwm.Commit.IsZero() {
		ack.HWMCommit = hwm.Commit.String()
	}
	if ack.OriginFrontier, err = a.originFrontier(sender, b.Stream); err != nil {
		return ack, err
	}
	if hwm.DeadLettered > 0 && !b.Snapshot {
		// Every entry of the stream set aside here, whole: the sender's
		// WAIT counts this node for none of them (a new leader there
		// learns them here).
		dead, err := a.store.DeadIndexes(sender, b.Stream, 1, hwm.Index, wire.MaxDeadListed+1)
		if err != nil {
			return ack, err
		}
		if len(dead) > wire.MaxDeadListed {
			dead, ack.DeadMore = dead[:wire.MaxDeadListed], true
		}
		ack.DeadLettered = dead
	}
	if snap, ok, err := a.store.BegunReseed(sender); err != nil {
		return ack, err
	} else if ok {
		ack.Seeding = snap.String()
	}
	if i := b.Idle; i != nil && a.opts.OnIdle != nil && a.takesOriginFilters() && hwm.Index >= i.Index && a.clock.CheckOffset(i.Bound) == nil {
		// Everything of the stream is here, and nothing older than the
		// bound can follow it (a bound from the future is not taken).
		a.opts.OnIdle(sender, b.Stream, i.Bound)
	}
	if len(b.Open) > 0 && a.takesOpenStreams() && !slices.Equal(a.opts.OpenOf(sender), b.Open) {
		// Recorded before the answer: a stream the sender opens is told
		// by its shipper's first heartbeat, before any entry of it is
		// sent, so collection here never runs without it.
		if err := a.log.SetOpenStreams(sender, b.Open); err != nil {
			return ack, err
		}
		a.opts.Logger.Info("replicate: peer's open streams recorded: tombstone collection waits for the least advanced",
			"sender", sender, "streams", len(b.Open))
	}
	if f := b.OwnFilter; f != nil && a.takesOriginFilters() {
		had := a.opts.FromPeer(sender)
		var onward []entry.TargetSpans
		if a.opts.Onward != nil {
			onward = a.opts.Onward(sender)
		}
		if had == nil || !had.Equal(f.Normal()) || !sameTargetSpans(onward, b.Keeps) {
			if err := a.log.SetFromPeer(sender, f.Normal(), b.Keeps); err != nil {
				return ack, err
			}
			a.opts.Logger.Info("replicate: peer's filters recorded: its writes others relay are kept to it, and its deletes where it keeps them for other links",
				"sender", sender, "filter", f.Normal().String(), "keeps", fmt.Sprint(b.Keeps))
		}
	}
	// The sender's rejoin phase with this node, told in every heartbeat,
	// is what the R record must say: asking (owed a re-seed, and awaited),
	// seeding (awaited), or nothing (a record left from a rejoin that
	// ended, or rolled back by a restore of either side, goes).
	want := byte(0)
	switch b.Rejoining {
	case wire.RejoinRequesting:
		want = entry.ReseedRequested | entry.AwaitRejoin
	case wire.RejoinSeeding:
		want = entry.AwaitRejoin
	}
	flags, err := a.log.UpdateReseed(sender, func(byte) byte { return want })
	if err != nil {
		return ack, err
	}
	if want != flags {
		a.opts.Logger.Warn("replicate: peer's rejoin recorded", "sender", sender, "phase", b.Rejoining,
			"owed", want&entry.ReseedRequested != 0, "awaiting", want&entry.AwaitRejoin != 0)
	}
	ack.ReseedRecorded = want&entry.ReseedRequested != 0
	if (want^flags)&entry.ReseedRequested != 0 && a.opts.OnReseedRequest != nil {
		a.opts.OnReseedRequest(sender, want&entry.ReseedRequested != 0)
	}
	a.count(sender, func(c *Counts) { c.Batches++; c.DroppedOwn += uint64(dropped) })
	return ack, nil
}

// originFrontier is the highest commit HLC of the sender's cluster this
// node applied, over its streams other than this one ("" when none): the
// sender's current stream is its own business (a conflict there is caught
// by index and commit); a later write on another stream than the sender
// remembers means it lost that stream.
func (a *Acceptor) originFrontier(sender string, current entry.StreamID) (string, error) {
	hs, err := a.store.HWMsOfExcept(sender, current)
	var f hlc.Timestamp
	for _, h := range hs {
		if h.Stream != current && f.Less(h.Commit) {
			f = h.Commit
		}
	}
	if f.IsZero() {
		return "", err
	}
	return f.String(), err
}

// sameTargetSpans reports whether a and b name the same ranges of the same
// links.
func sameTargetSpans(a, b []entry.TargetSpans) bool {
	return slices.EqualFunc(a, b, func(x, y entry.TargetSpans) bool {
		return x.Target == y.Target && slices.Equal(x.Spans, y.Spans)
	})
}
