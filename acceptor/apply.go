package acceptor

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// Lag is one applied entry's replication lag and, when Staged, its parts:
// Ship, on the sender's clock, from the entry's commit to the batch leaving
// (the local fsync, the shipper's wait for the link, encoding); Wire, from
// the sender's clock to this one once the body was read (the network, and
// any clock skew between the two); Apply, on this clock, from then to the
// synced apply (the permit queue, the apply lock, the fsync).
type Lag struct {
	Total, Ship, Wire, Apply time.Duration
	Staged                   bool
}

// Apply runs the acceptor's steps on a decoded batch from an authenticated
// sender. Nothing is applied unless everything is: a refusal leaves the store
// as it was.
func (a *Acceptor) Apply(sender string, b *wire.Batch) (wire.Ack, error) {
	lim := a.Limits()
	ack := wire.Ack{Accepted: len(b.Entries), Now: a.opts.Now(), Limits: &lim, Version: a.opts.Version}
	a.hints(&ack, len(b.Entries))
	if b.Sender != sender {
		return ack, fmt.Errorf("%w: batch declares sender %q, credentials are for %q", ErrForbidden, b.Sender, sender)
	}
	sc, err := a.screen(sender, b)
	if err != nil {
		return ack, err
	}
	dropped := sc.dropped
	ack.Duplicates = dropped
	if len(sc.ents) == 0 && b.End == nil && b.Begin == nil && b.BackfillEnd == nil {
		// A heartbeat (or a batch of our own entries only): report where
		// the stream stands here, and record a request for a re-seed.
		return a.heartbeat(sender, b, ack, dropped)
	}
	// A batch that does not continue the stream here is refused without
	// a command of the log (the machine would refuse it the same way, at
	// the cost of an append): the batch before it is often still on its
	// way, and ServeHTTP asks again as the sender's requests move.
	if len(sc.ents) > 0 && !b.Snapshot {
		if err := a.continues(sender, b.Stream, sc.ents[0].Index); err != nil {
			return ack, err
		}
	}
	// Local writes stamped after this batch must sort above it.
	a.clock.Observe(sc.maxTS)
	res, err := a.commit(sender, b, sc)
	if err != nil {
		return ack, err
	}
	if res.Resent {
		ack.Duplicates += res.Duplicates
		ack.HWM = res.HWM
		a.count(sender, func(c *Counts) { c.Batches++; c.Duplicates += uint64(res.Duplicates) })
		return ack, nil
	}
	a.observeLag(sender, b, sc.ents, res)
	if b.End != nil && a.opts.OnTrailer != nil {
		a.opts.OnTrailer(sender, res.Requested, res.Rejoin)
	}
	ack.Applied = res.Applied + res.Stale
	ack.Duplicates += res.Duplicates
	ack.HWM = res.HWM
	if b.Snapshot && res.DeadLettered > 0 {
		// Versions of a snapshot set aside: the sender does not count
		// this node as holding anything the snapshot covered (WAIT).
		ack.DeadMore = true
	}
	if !b.Snapshot && len(sc.ents) > 0 && (res.DeadLettered > 0 || res.Duplicates > 0) {
		// The entries of this stream set aside here, now or by an
		// earlier delivery whose answer was lost: the mark passed them,
		// and the sender's WAIT must not count this node for them.
		first, last := sc.ents[0].Index, sc.ents[len(sc.ents)-1].Index
		dead, err := a.store.DeadIndexes(sender, b.Stream, first, last, wire.MaxDeadListed+1)
		if err != nil {
			// Applied already: say nothing of it rather than fail the ack,
			// and count the whole batch as not held.
			a.opts.Logger.Warn("replicate: listing the batch's dead letters for the ack", "sender", sender, "err", err)
			ack.DeadMore = true
		}
		if len(dead) > wire.MaxDeadListed {
			dead, ack.DeadMore = dead[:wire.MaxDeadListed], true
		}
		ack.DeadLettered = dead
	}
	if !res.HWMCommit.IsZero() {
		ack.HWMCommit = res.HWMCommit.String()
	}
	if !res.OriginFrontier.IsZero() {
		ack.OriginFrontier = res.OriginFrontier.String()
	}
	a.count(sender, func(c *Counts) {
		c.Batches++
		c.Applied += uint64(res.Applied)
		c.Stale += uint64(res.Stale)
		c.Duplicates += uint64(res.Duplicates)
		c.DroppedOwn += uint64(dropped + res.DroppedOwn)
		// A withheld entry the machine found a duplicate (a resent
		// snapshot batch) is not among its drops.
		withheld := min(sc.withheld, res.DroppedUnknown)
		c.DroppedUnknown += uint64(res.DroppedUnknown - withheld)
		c.Withheld += uint64(withheld + res.DroppedWithheld)
		c.WithheldUnheard += uint64(res.DroppedUnheard)
		c.DeadLettered += uint64(res.DeadLettered)
		c.Filtered += res.Filtered
		c.Conflicts += uint64(res.Conflicts)
		c.RangeDiscards += uint64(res.RangeDiscards)
		c.Resurrections += uint64(res.Resurrections)
	})
	return ack, nil
}

// screened is what the checks of a batch's entries found.
type screened struct {
	ents        []*entry.Entry    // the entries to apply: all but this cluster's own
	maxTS       hlc.Timestamp     // the highest commit or stamp among them
	deadReasons map[uint64]string // entries set aside as dead letters, and why
	// own and unknown mark snapshot entries authored by this cluster and
	// by clusters this node does not know, or whose author's filter toward
	// this cluster keeps them home (see screen): withheld counts those.
	own, unknown map[uint64]bool
	dropped      int // this cluster's own entries, shipped back
	withheld     int
}

// screen checks every entry of b against its sender, its stream, this
// node's limits and the clock, and sets this cluster's own entries aside.
// An error refuses the whole batch.
func (a *Acceptor) screen(sender string, b *wire.Batch) (*screened, error) {
	var maxTS hlc.Timestamp
	var deadReasons map[uint64]string
	ents := make([]*entry.Entry, 0, len(b.Entries))
	// own marks snapshot entries authored by this cluster: applied only in
	// a re-seed this node asked for.
	var own, unknown map[uint64]bool
	dropped, withheld := 0, 0
	if (b.Begin != nil || b.Backfill) && !a.takesMarkers() {
		// Both come with command format 3: a node of an older build
		// could not apply them as the others do.
		return nil, fmt.Errorf("%w: a re-seed's begin or a backfill, which this cluster does not take yet (a node of it runs an older build)", ErrBadBatch)
	}
	ctxOK, expiryOK, floorsOK := a.takesContexts(), a.takesExpiry(), a.takesFloors()
	for i := range b.Entries {
		e := &b.Entries[i]
		switch {
		case !expiryOK && e.HasExpiry():
			// A member of an older build could not read it, and dropping
			// the expiry would keep the key for ever.
			return nil, fmt.Errorf("%w: entry %d carries an expiry, which this cluster does not take yet (a node of it runs an older build)", ErrBadBatch, e.Index)
		case !floorsOK && e.HasFloors():
			return nil, fmt.Errorf("%w: entry %d carries counter floors, which this cluster does not take yet (a node of it runs an older build)", ErrBadBatch, e.Index)
		case e.StampOrigin != "" && !b.Snapshot:
			return nil, fmt.Errorf("%w: entry %d carries a stamp of %q outside a re-seed snapshot", ErrForbidden, e.Index, e.StampOrigin)
		case e.Origin == a.opts.Local:
			// Our own write, shipped back: it is here already.
			dropped++
			continue
		case e.Origin != sender:
			return nil, fmt.Errorf("%w: entry %d claims origin %q, sender is %q", ErrForbidden, e.Index, e.Origin, sender)
		case e.Stream != b.Stream:
			return nil, fmt.Errorf("%w: entry %d is of stream %s, batch of %s", ErrBadBatch, e.Index, e.Stream, b.Stream)
		case e.CtrComp != "" && !b.Snapshot && entry.ComponentCluster(e.CtrComp) != sender:
			return nil, fmt.Errorf("%w: entry %d carries totals of %q, sender is %q", ErrForbidden, e.Index, e.CtrComp, sender)
		case e.IsMarker() && !a.takesMarkers():
			return nil, fmt.Errorf("%w: entry %d is a filtered marker, which this cluster does not take yet (a node of it runs an older build)", ErrBadBatch, e.Index)
		case e.IsMarker() && b.Snapshot:
			return nil, fmt.Errorf("%w: entry %d is a filtered marker in a re-seed snapshot (a snapshot leaves keys out, it has no indexes to skip)", ErrBadBatch, e.Index)
		}
		if !ctxOK {
			// This cluster's log does not keep contexts yet: a member of
			// an older build could not read them.
			stripContexts(e)
		}
		if b.Snapshot && a.authoredHere(e) {
			if own == nil {
				own = map[uint64]bool{}
			}
			own[e.Index] = true
		} else if b.Snapshot && !a.known(a.author(e)) {
			// A snapshot relays writes of the clusters of this mesh; one
			// of a cluster this node does not know is nobody's it can
			// check, and is not taken.
			if unknown == nil {
				unknown = map[uint64]bool{}
			}
			unknown[e.Index] = true
		} else if b.Snapshot && a.withheldBy(e, sender) {
			// A relay of a third cluster's write that cluster's own filter
			// toward this one keeps home: it would never send it here, and
			// a copy taken from another cluster would go stale.
			if unknown == nil {
				unknown = map[uint64]bool{}
			}
			unknown[e.Index] = true
			withheld++
		}
		if err := a.checkEntry(e, b.Snapshot); err != nil {
			// The entry is well-formed but breaks one of this node's own
			// limits: set it aside for an operator rather than wedge the
			// link behind it.
			if deadReasons == nil {
				deadReasons = map[uint64]string{}
			}
			deadReasons[e.Index] = err.Error()
		}
		for _, ts := range []hlc.Timestamp{e.Commit, e.Stamp} {
			if err := a.clock.CheckOffset(ts); err != nil {
				return nil, fmt.Errorf("%w: entry %d: %w", ErrClockOffset, e.Index, err)
			}
			if maxTS.Less(ts) {
				maxTS = ts
			}
		}
		if n := len(ents); n > 0 && e.Index != ents[n-1].Last()+1 {
			return nil, fmt.Errorf("%w: entry indexes %d then %d are not consecutive", ErrBadBatch, ents[n-1].Last(), e.Index)
		}
		ents = append(ents, e)
	}
	// A trailer's, a begin's and a backfill's stamps move marks and the
	// horizon below which the receiver drops keys: none from the future.
	for _, st := range []struct {
		what string
		ts   *hlc.Timestamp
	}{{"snapshot end", endCommit(b.End)}, {"snapshot begin", endCommit(b.Begin)}, {"backfill horizon", horizonOf(b.BackfillEnd)}} {
		if st.ts == nil {
			continue
		}
		if err := a.clock.CheckOffset(*st.ts); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrClockOffset, st.what, err)
		}
	}
	return &screened{ents: ents, maxTS: maxTS, deadReasons: deadReasons, own: own, unknown: unknown, dropped: dropped, withheld: withheld}, nil
}

func endCommit(e *wire.SnapshotEnd) *hlc.Timestamp {
	if e == nil {
		return nil
	}
	return &e.Commit
}

func horizonOf(e *wire.BackfillEnd) *hlc.Timestamp {
	if e == nil {
		return nil
	}
	return &e.Horizon
}

// continues refuses a batch of stream whose first entry does not follow
// the sender's high-water mark here.
func (a *Acceptor) continues(sender string, stream entry.StreamID, first uint64) error {
	hwm, err := a.store.HWM(sender, stream)
	if err != nil {
		return err
	}
	if hwm.Index > 0 && first > hwm.Index+1 {
		return &GapError{Origin: sender, Stream: stream, HWM: hwm.Index, Got: first}
	}
	return nil
}

// commit hands the screened batch to the log and returns what the state
// machine decided of it; a refusal of the machine becomes the acceptor's.
func (a *Acceptor) commit(sender string, b *wire.Batch, sc *screened) (*wire.InboundResult, error) {
	in := &wire.Inbound{Sender: sender, Batch: b, Own: sc.own, Unknown: sc.unknown, Dead: sc.deadReasons, At: a.opts.Now(),
		HLC: a.clock.Last(), MaxStreams: a.opts.MaxStreams}
	if a.opts.ConflictValueMax != nil {
		in.ConflictValueMax = a.opts.ConflictValueMax()
	}
	if b.End != nil {
		in.KnownMarks = make([]bool, len(b.Marks))
		for i, m := range b.Marks {
			in.KnownMarks[i] = a.known(m.Origin)
		}
	}
	res, err := a.log.ApplyInbound(in, b.Raw)
	if err != nil {
		return nil, err
	}
	var gap *GapError
	var conflict *ConflictError
	switch {
	case res.Err == nil:
	case errors.As(res.Err, &gap), errors.As(res.Err, &conflict):
		return nil, res.Err
	case errors.Is(res.Err, wire.ErrForbidden):
		return nil, fmt.Errorf("%w: %w", ErrForbidden, res.Err)
	default:
		return nil, fmt.Errorf("%w: %w", ErrBadBatch, res.Err)
	}
	return res, nil
}

// observeLag tells ObserveLag the replication lag of each entry the batch
// newly applied (those after res.Start).
func (a *Acceptor) observeLag(sender string, b *wire.Batch, ents []*entry.Entry, res *wire.InboundResult) {
	start := res.Start
	if a.opts.ObserveLag != nil && a.opts.Now != nil && !b.Snapshot && res.HWM > start {
		now := a.opts.Now()
		staged := b.SentAt > 0 && b.ReceivedAt > 0
		lags := make([]Lag, 0, len(ents)) // not HWM-start: a marker covers many indexes
		for _, e := range ents {
			if e.Index > start && !e.IsMarker() {
				l := Lag{Total: time.Duration(now - e.Commit.Wall)}
				if staged {
					l.Staged = true
					l.Ship = time.Duration(b.SentAt - e.Commit.Wall)
					l.Wire = time.Duration(b.ReceivedAt - b.SentAt)
					l.Apply = time.Duration(now - b.ReceivedAt)
				}
				lags = append(lags, l)
			}
		}
		a.opts.ObserveLag(sender, lags)
	}
}

// author is the cluster whose write a snapshot entry relays.
func (a *Acceptor) author(e *entry.Entry) string {
	if e.Op == entry.OpCounter {
		return entry.ComponentCluster(e.CounterComponent())
	}
	return e.LWW().Origin
}

// withheldBy reports a snapshot entry from sender relaying a third
// cluster's write that the author's own filter toward this cluster (as
// its heartbeats said, recorded in the log) keeps home.
func (a *Acceptor) withheldBy(e *entry.Entry, sender string) bool {
	author := a.author(e)
	if author == sender || author == a.opts.Local || !a.takesOriginFilters() {
		return false
	}
	f := a.opts.FromPeer(author)
	return f != nil && f.KeepsHome(e)
}

// authoredHere reports whether a snapshot entry relays a write of this
// cluster.
func (a *Acceptor) authoredHere(e *entry.Entry) bool { return a.author(e) == a.opts.Local }

// known reports whether cluster is a peer this node takes writes from.
func (a *Acceptor) known(cluster string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.mu.secrets[cluster]
	return ok
}

func (a *Acceptor) checkEntry(e *entry.Entry, snapshot bool) error {
	if e.Oversize > 0 {
		return fmt.Errorf("%w: entry %d of %d bytes was over this node's batch limit of %d bytes; "+
			"the sender sent a stub (the write is only at %s)", ErrTooLarge, e.Index, e.Oversize, a.opts.MaxBodyBytes, e.Origin)
	}
	keys := []string{e.Key}
	if e.End != "" {
		keys = append(keys, e.End)
	}
	for _, op := range e.Ops {
		keys = append(keys, op.Key)
		if len(op.Value) > a.opts.MaxValueBytes {
			return fmt.Errorf("%w: entry %d: a batch value of %d bytes, limit %d", ErrBadBatch, e.Index, len(op.Value), a.opts.MaxValueBytes)
		}
	}
	for _, k := range keys[1:] {
		if len(k) > a.opts.MaxKeyBytes || !utf8.ValidString(k) {
			return fmt.Errorf("%w: entry %d: key of %d bytes (limit %d) or not UTF-8", ErrBadBatch, e.Index, len(k), a.opts.MaxKeyBytes)
		}
	}
	switch {
	case len(e.Key) > a.opts.MaxKeyBytes:
		return fmt.Errorf("%w: entry %d: key of %d bytes, limit %d", ErrBadBatch, e.Index, len(e.Key), a.opts.MaxKeyBytes)
	case !utf8.ValidString(e.Key):
		return fmt.Errorf("%w: entry %d: key is not valid UTF-8", ErrBadBatch, e.Index)
	case len(e.Value) > a.opts.MaxValueBytes:
		return fmt.Errorf("%w: entry %d: value of %d bytes, limit %d", ErrBadBatch, e.Index, len(e.Value), a.opts.MaxValueBytes)
	case !snapshot && a.opts.PinWindow > 0 && e.Stamp.Wall < e.Commit.Wall-int64(a.opts.PinWindow):
		// A stamp that old could resurrect a tombstone already collected.
		return fmt.Errorf("%w: entry %d: stamp %s is older than its commit %s by more than the pin window %s",
			ErrBadBatch, e.Index, e.Stamp, e.Commit, a.opts.PinWindow)
	}
	return nil
}

// stripContexts drops an entry's causal contexts.
func stripContexts(e *entry.Entry) {
	e.Ctx, e.Restores = nil, nil
	for i := range e.Ops {
		e.Ops[i].Ctx = nil
	}
}
