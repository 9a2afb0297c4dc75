package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// NeedsReseed reports whether the peer misses entries the WAL no longer has.
func (s *Shipper) NeedsReseed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.needsReseed
}

// Reseed asks for a re-seed now, needed or not (why is shown in status).
func (s *Shipper) Reseed(why string) {
	s.mu.Lock()
	s.mu.wantReseed, s.mu.reseedWhy = true, why
	s.mu.Unlock()
	s.wake()
}

// Owe records that the peer asked for a re-seed (it lost its data): the
// next re-seed is a requested one, which may carry the peer's own writes.
func (s *Shipper) Owe() { s.mu.Lock(); s.mu.owed = true; s.mu.Unlock(); s.wake() }

// RejoinSeed asks for the re-seed that ends this node's rejoin with the
// peer (its trailer tells the peer to stop waiting).
func (s *Shipper) RejoinSeed() { s.mu.Lock(); s.mu.rejoinSeed = true; s.mu.Unlock(); s.wake() }

// Disown forgets a re-seed the peer asked for and no longer needs.
func (s *Shipper) Disown() { s.mu.Lock(); s.mu.owed = false; s.mu.Unlock() }

func (s *Shipper) setReseed(why string) {
	s.mu.Lock()
	first := !s.mu.needsReseed
	s.mu.needsReseed = true
	s.mu.lastErr = why
	if s.mu.reseedWhy == "" {
		s.mu.reseedWhy = why
	}
	s.mu.Unlock()
	if first {
		s.opts.Logger.Error("peer needs a re-seed", "peer", s.peer.Name, "why", why)
	}
}

// reseed streams a snapshot of the tree to the peer, then resumes normal
// shipping after the snapshot's applied index. The WAL is retained for the
// peer from before the snapshot was taken, so nothing falls in between. The
// last batch carries the trailer: the position in the real stream that the
// snapshot corresponds to.
//
// To a peer that takes it (Limits.Markers), the first batch carries the
// same position as Begin: the peer raises its mark at once, shipping
// resumes after it, and the rest of the snapshot goes in a goroutine of
// its own beside the live entries, at the snapshot's share of the link's
// bandwidth (the peer merges both last-writer-wins, so their order does
// not matter). The peer holds the re-seed open until the trailer and says
// so in its heartbeat answers: a sender that lost track of it (restarted,
// or another node leads) sends it again. To an older peer the whole
// snapshot goes first and live entries wait.
func (s *Shipper) reseed(ctx context.Context) error {
	requested, rejoin, begun := s.beginReseed()
	if !begun {
		return nil // paused meanwhile: Run waits for Resume
	}
	r, err := s.openReseed(requested, rejoin)
	if err != nil {
		return s.reseedDone(err, false)
	}
	if !r.live {
		defer r.snap.Close()
		return s.finishReseed(ctx, r)
	}
	if err := s.sendSnapshot(ctx, r, true); err != nil {
		r.snap.Close()
		return s.reseedDone(err, false)
	}
	// The peer's mark is at the snapshot's position: live entries after it
	// go out from here on.
	s.mu.Lock()
	s.moveToLocked(r.applied)
	s.mu.Unlock()
	s.flushCursor(true)
	s.bg.Add(1)
	go func() {
		// Exits when the snapshot is sent, the re-seed failed, or ctx
		// ended; Run waits for it.
		defer s.bg.Done()
		defer r.snap.Close()
		_ = s.finishReseed(ctx, r)
		s.wake()
	}()
	return nil
}

// reseedRun is one re-seed under way.
type reseedRun struct {
	snap              Snapshot
	feed              *snapshotFeed
	stream            entry.StreamID // the real stream the trailer ends in
	applied           entry.AppliedIndex
	filter            entry.Filter
	requested, rejoin bool
	live              bool // begun: live entries flow beside it
	sent              int
}

// openReseed takes the snapshot a re-seed sends.
func (s *Shipper) openReseed(requested, rejoin bool) (*reseedRun, error) {
	snap, err := s.opts.Snapshots.NewSnapshot()
	if err != nil {
		return nil, err
	}
	r := &reseedRun{snap: snap, requested: requested, rejoin: rejoin, stream: s.log.Stream(), applied: snap.LocalApplied()}
	total, err := snap.Count()
	if err != nil {
		snap.Close()
		return nil, err
	}
	if entry.StreamID(r.applied.Stream) != r.stream {
		// The stream was replaced since (or nothing was ever applied).
		r.applied = entry.AppliedIndex{Stream: r.stream}
	}
	// The snapshot holds the tree as of applied: it carries what the
	// filter in force right after it lets cross, relayed keys included
	// (the entries after it ship under their own epochs).
	ls := s.settings()
	r.filter, _ = ls.FilterAt(r.stream, r.applied.Index+1)
	returning := ""
	if requested {
		// The peer lost data and asked: its own writes come back whatever
		// the filter (snapshotFeed.returning says why).
		returning = s.peer.Name
	}
	var withhold func(string) bool
	if !requested {
		withhold, err = s.clippedAuthors(snap, r.filter)
	}
	if err == nil {
		r.feed, err = newScopedFeed(snap, s.opts.Local, s.opts.Now(), r.filter, returning, withhold)
	}
	if err == nil {
		r.feed.contexts, r.feed.expiry, r.feed.floors = s.takesContexts(), s.takesExpiry(), s.takesFloors()
	}
	if err != nil {
		snap.Close()
		return nil, err
	}
	s.mu.Lock()
	r.live = s.mu.limits != nil && s.mu.limits.Markers
	s.mu.reseed.Total, s.mu.reseed.Live, s.mu.reseed.Stream = total, r.live, r.feed.stream.String()
	s.mu.Unlock()
	return r, nil
}

// finishReseed sends the rest of the snapshot and ends the re-seed.
func (s *Shipper) finishReseed(ctx context.Context, r *reseedRun) error {
	if err := s.sendSnapshot(ctx, r, false); err != nil {
		return s.reseedDone(err, r.live)
	}
	if s.log.Stream() != r.stream {
		// The stream was replaced during the re-seed: its trailer named the
		// old one. The rejoin that follows re-seeds the peer again.
		return s.reseedDone(errors.New("the stream was replaced during the re-seed"), r.live)
	}
	if r.live {
		s.mu.Lock()
		// The mark moved after the first batch (moveToLocked); versions a
		// later batch set aside keep the peer from being counted as
		// holding what the snapshot covers, as a re-seed sent whole does.
		if s.mu.snapDead {
			s.mu.deadBelow = max(s.mu.deadBelow, r.applied.Index)
		}
		s.mu.snapDead = false
		s.clearOwedLocked(r.requested, r.rejoin)
		s.mu.Unlock()
	} else {
		s.resumeAfterReseed(r.applied, r.requested, r.rejoin)
		s.flushCursor(true)
	}
	s.opts.Logger.Info("re-seed done", "peer", s.peer.Name, "keys", r.sent, "resume_after", r.applied.Index, "live", r.live)
	if s.opts.OnReseedDone != nil {
		s.opts.OnReseedDone(s.peer.Name, r.requested, r.rejoin)
	}
	return s.reseedDone(nil, r.live)
}

// beginReseed marks a re-seed as running, with why it runs, and reports
// whether it answers the peer's request and whether it ends this node's
// rejoin. It begins none while the link is paused (begun false): the
// cursor it raises would count writes made after the pause as the peer's.
func (s *Shipper) beginReseed() (requested, rejoin, begun bool) {
	s.mu.Lock()
	if s.mu.paused {
		// Pause came between Run's look at the flag and here (the
		// heartbeat before a re-seed takes a round trip).
		s.mu.Unlock()
		return false, false, false
	}
	requested, rejoin = s.mu.owed, s.mu.rejoinSeed
	why := s.mu.reseedWhy
	switch {
	case requested:
		why = "the peer asked for one (it lost data)"
	case rejoin:
		why = "this node rejoined after losing data: the peer gets what only this node, or only some peers, had"
	case why == "" && s.mu.lastErr != "":
		why = s.mu.lastErr
	case why == "":
		why = "the peer needs entries the WAL no longer holds"
	}
	s.mu.wantReseed, s.mu.reseedWhy = false, ""
	s.mu.detached = false
	s.mu.snapDead = false // a backfill's before it is not this re-seed's
	if s.opts.Applied != nil {
		// Hold the WAL from here on: entries after the snapshot's applied
		// index must still be there when shipping resumes.
		s.mu.acked = max(s.mu.acked, min(s.opts.Applied(), s.log.Last()))
	}
	s.mu.reseed = ReseedStatus{Running: true, Started: time.Now(), Runs: s.mu.reseed.Runs + 1,
		LastReason: why, Requested: requested}
	s.mu.Unlock()
	s.opts.Logger.Info("re-seed started", "peer", s.peer.Name, "why", why, "requested", requested, "rejoin", rejoin)
	return requested, rejoin, true
}

// sendSnapshot streams the re-seed's snapshot to the peer in batches of a
// stream of their own, the last one carrying the trailer (stream at
// applied); first sends only the first batch, which carries Begin.
func (s *Shipper) sendSnapshot(ctx context.Context, r *reseedRun, first bool) error {
	budget := s.snapshotBudget()
	for done := r.feed.ended; !done; {
		ents, last, err := r.feed.batch(s.opts.MaxBatchEntries, budget)
		if err != nil {
			return err
		}
		done = last
		s.mu.Lock()
		detached := s.mu.detached
		s.mu.Unlock()
		if detached {
			return errors.New("the peer was detached again (backlog overflow) during the re-seed")
		}
		h := wire.Header{Sender: s.opts.Local, Stream: r.feed.stream, Snapshot: true, Requested: r.requested, Rejoin: r.rejoin}
		at := &wire.SnapshotEnd{Stream: r.stream, Index: r.applied.Index, Commit: r.applied.Commit}
		if first && r.live {
			h.Begin = at
		}
		if done {
			if err := s.trailer(&h, r.snap, at, r.filter); err != nil {
				return err
			}
		}
		body := wire.AppendHeader(nil, &h, len(ents))
		for _, p := range ents {
			body = append(body, p...)
		}
		if !s.waitUnpaused(ctx) {
			return ctx.Err()
		}
		if err := s.postReseedBatch(ctx, body, r.feed.index); err != nil {
			return err
		}
		r.sent += len(ents)
		r.feed.ended = done
		s.mu.Lock()
		s.mu.reseed.Sent = r.sent
		s.mu.Unlock()
		if first {
			return nil
		}
	}
	return nil
}

// snapshotFeed reads a snapshot's entries as entries of a stream of their
// own, all committed at the re-seed's start, and encodes them.
type snapshotFeed struct {
	snap   Snapshot
	local  string
	stream entry.StreamID // the snapshot's own stream
	commit hlc.Timestamp
	codec  *wire.Codec
	defs   wire.Defaults
	// extra are the range tombstones and counters, sent before the keys.
	extra []entry.Entry
	index uint64 // of the last entry read
	// filter is the link's (or a backfill's ranges): keys it keeps home
	// are not sent.
	filter scope
	// returning, in a re-seed the peer asked for because it lost data, is
	// the peer: its own writes are sent whatever the filter. A filter says
	// what this cluster's writes send to the peer; handing the peer back
	// what it wrote sends nothing of this cluster's. Without them, writes of
	// the peer's lost stream that only this cluster received would never
	// reach it again: a later backfill (a widened filter) may not bring back
	// a cluster's own writes, only a requested re-seed may.
	returning string
	// ended: the batch with the trailer went out.
	ended bool
	// peeked is the entry read ahead to know whether a full batch is the
	// last: a trailer then rides with the last entries, never alone in a
	// batch (except for a snapshot with nothing in it).
	peeked *entry.Entry
	// contexts: the peer's log keeps causal contexts, so each key's
	// travels with it (a re-seeded cluster judges later conflicts by them).
	contexts bool
	// expiry: the peer's log keeps versions that expire; to another, a
	// version with an expiry fails the snapshot (errNoExpiry).
	expiry bool
	// floors: the peer's log keeps counter floors; to another, a counter
	// with floors fails the snapshot (errNoExpiry).
	floors bool
	// withhold, when set, names third clusters whose writes the snapshot
	// does not relay (clippedAuthors says why); the peer's own writes
	// going back to it (returning) are never withheld.
	withhold func(author string) bool
}

// withheld reports a relay of author's write the feed leaves out.
func (f *snapshotFeed) withheld(author string) bool {
	return f.withhold != nil && author != f.local && author != f.returning && f.withhold(author)
}

// clippedAuthors names the third clusters whose writes a re-seed through
// filter does not relay: every one when the filter keeps some keys home,
// else those of which this cluster holds a stream only in part (their
// filter toward here kept some of it home: the trailer claims none of
// them). Such a cluster's writes reach this cluster clipped, a
// transaction of it perhaps in part: relayed, the peer would show part of
// the transaction until the author's own stream brought the rest (issue
// 48). The trailer claims none of their streams, so the author sends the
// peer its writes itself, whole and kept to its own filter. A re-seed the
// peer asked for because it lost data relays them all the same (its
// rejoin, docs/RELIABILITY.md): what it lost may be held nowhere else.
func (s *Shipper) clippedAuthors(snap Snapshot, filter entry.Filter) (func(string) bool, error) {
	if !filter.All() {
		return func(string) bool { return true }, nil
	}
	marks, err := snap.Marks()
	if err != nil {
		return nil, err
	}
	clipped := map[string]bool{}
	for _, m := range marks {
		if m.Filtered > 0 || (s.opts.Partial != nil && s.opts.Partial(m.Origin, m.Stream)) {
			clipped[m.Origin] = true
		}
	}
	return func(author string) bool { return clipped[author] }, nil
}

// scope is what of the tree a snapshot sends: a link's filter, or the
// ranges of a backfill.
type scope interface {
	Match(key string) bool
	Clip(start, end string) []entry.Span
}

// newScopedFeed starts reading snap as a stream of its own, committed at
// now: what filter lets through, and the writes of cluster returning (none
// when ""), less the relays withhold names (none when nil).
func newScopedFeed(snap Snapshot, local string, now int64, filter scope, returning string, withhold func(string) bool) (*snapshotFeed, error) {
	f := &snapshotFeed{snap: snap, local: local, stream: entry.NewStreamID(), commit: hlc.Timestamp{Wall: now}, codec: wire.NewCodec(),
		filter: filter, returning: returning, withhold: withhold}
	f.defs = wire.Defaults{Origin: local, Stream: f.stream}
	// Range tombstones and counters go first (they are few), then every key.
	ranges, err := snap.Ranges()
	if err != nil {
		return nil, err
	}
	for _, r := range ranges {
		if f.withheld(r.Stamp.Origin) {
			continue
		}
		if returning != "" && r.Stamp.Origin == returning {
			// The peer's own range delete, whole.
			f.extra = append(f.extra, entry.Entry{Op: entry.OpDeleteRange, Key: r.Start, End: r.End, Stamp: r.Stamp.HLC, StampOrigin: r.Stamp.Origin})
			continue
		}
		// Clipped to the filter: each part the filter lets cross is a
		// range tombstone of its own, under the same stamp.
		for _, sp := range filter.Clip(r.Start, r.End) {
			f.extra = append(f.extra, entry.Entry{Op: entry.OpDeleteRange, Key: sp.Start, End: sp.End, Stamp: r.Stamp.HLC, StampOrigin: r.Stamp.Origin})
		}
	}
	counters, err := snap.Counters()
	if err != nil {
		return nil, err
	}
	for key, c := range counters {
		in := filter.Match(key)
		if !in && returning == "" {
			continue
		}
		for comp, t := range c.Totals {
			if (!in && entry.ComponentCluster(comp) != returning) || f.withheld(entry.ComponentCluster(comp)) {
				continue
			}
			t := t
			e := entry.Entry{Op: entry.OpCounter, Key: key, Ctr: &t, CtrComp: comp,
				Stamp: c.Stamp.HLC, StampOrigin: c.Stamp.Origin}
			if fl, ok := c.Floors[comp]; ok {
				// A component's floors travel with its totals, judged as
				// its cluster's.
				e.Floors = map[string]entry.PN{comp: fl}
			}
			f.extra = append(f.extra, e)
		}
		for comp, fl := range c.Floors {
			if _, ok := c.Totals[comp]; ok || (!in && entry.ComponentCluster(comp) != returning) || f.withheld(entry.ComponentCluster(comp)) {
				continue
			}
			// Floors of totals this tree has not seen yet: zero totals
			// (which add no component) carry them.
			f.extra = append(f.extra, entry.Entry{Op: entry.OpCounter, Key: key, Ctr: &entry.PN{}, CtrComp: comp,
				Floors: map[string]entry.PN{comp: fl}, Stamp: c.Stamp.HLC, StampOrigin: c.Stamp.Origin})
		}
	}
	return f, nil
}

// next returns the snapshot's next entry (false once there is none).
func (f *snapshotFeed) next() (entry.Entry, bool, error) {
	if f.peeked != nil {
		e := *f.peeked
		f.peeked = nil
		return e, true, nil
	}
	if len(f.extra) > 0 {
		e := f.extra[0]
		f.extra = f.extra[1:]
		if !f.floors && e.HasFloors() {
			return entry.Entry{}, false, fmt.Errorf("%w (counter %q)", errNoExpiry, e.Key)
		}
		return e, true, nil
	}
	key, rec, ok, err := f.snap.Next()
	for ok && err == nil && (f.withheld(rec.Stamp.Origin) || !f.filter.Match(key)) {
		if f.withheld(rec.Stamp.Origin) {
			// A relay left out (clippedAuthors says why).
			key, rec, ok, err = f.snap.Next()
			continue
		}
		if f.returning != "" {
			// Every key is read: the peer's own writes among those the
			// filter keeps home go back to it.
			if rec.Stamp.Origin == f.returning {
				break
			}
			key, rec, ok, err = f.snap.Next()
			continue
		}
		// Outside the scope: on to the next range it lets through (a
		// backfill of one prefix reads that prefix, not the tree).
		next, more := nextStart(f.filter.Clip(key, ""), key)
		if !more {
			return entry.Entry{}, false, nil
		}
		if next > key {
			f.snap.SeekGE(next)
		}
		key, rec, ok, err = f.snap.Next()
	}
	if err != nil || !ok {
		return entry.Entry{}, false, err
	}
	e := entry.Entry{Stamp: rec.Stamp.HLC, Op: entry.OpSet, Key: key, Value: rec.Value, StampOrigin: rec.Stamp.Origin, Expires: rec.Expires}
	if f.contexts && rec.Ctx.Covers(rec.Stamp) {
		e.Ctx = rec.Ctx
	}
	if rec.Tombstone {
		e.Op, e.Value, e.Expires = entry.OpDelete, nil, 0
	}
	if e.Expires != 0 && !f.expiry {
		return entry.Entry{}, false, fmt.Errorf("%w (key %q)", errNoExpiry, key)
	}
	return e, true, nil
}

// batch encodes the next entries, numbered on in the feed's stream, up to
// maxEntries of them and until they reach budget bytes; done says the
// snapshot is exhausted.
func (f *snapshotFeed) batch(maxEntries, budget int) (ents [][]byte, done bool, err error) {
	size := 0
	for len(ents) < maxEntries && size < budget {
		e, ok, err := f.next()
		if err != nil {
			return nil, false, err
		}
		if !ok {
			return ents, true, nil
		}
		f.index++
		e.Index, e.Origin, e.Stream, e.Commit = f.index, f.local, f.stream, f.commit
		if e.StampOrigin == f.local {
			e.StampOrigin = ""
		}
		if e.Stamp.IsZero() {
			e.Stamp = f.commit
		}
		p := f.codec.AppendEntry(nil, &e, f.defs)
		ents = append(ents, p)
		size += len(p)
	}
	e, ok, err := f.next()
	if err != nil || !ok {
		return ents, err == nil, err
	}
	f.peeked = &e
	return ents, false, nil
}

// trailer ends the re-seed in its last batch's header h: the position in
// the real stream the snapshot corresponds to, and the marks of the other
// clusters' streams it holds.
func (s *Shipper) trailer(h *wire.Header, snap Snapshot, at *wire.SnapshotEnd, filter entry.Filter) error {
	h.End = at
	if !filter.All() {
		// The snapshot holds only the part of other clusters' writes the
		// filter lets cross: the receiver must not count their streams as
		// applied to here (it may take keys of them this link keeps home
		// from those clusters' own links).
		return nil
	}
	marks, err := snap.Marks()
	if err != nil {
		return err
	}
	for _, m := range marks {
		// The receiver's own streams are its business. A stream this
		// cluster holds only in part (its origin's filter toward here
		// kept some of it home) is not claimed: the receiver would count
		// the origin's entries as applied and drop them when they come.
		partial := m.Filtered > 0 || (s.opts.Partial != nil && s.opts.Partial(m.Origin, m.Stream))
		if m.Origin != s.peer.Name && !partial && len(h.Marks) < wire.MaxMarks {
			h.Marks = append(h.Marks, wire.Mark{Origin: m.Origin, Stream: m.Stream, Index: m.Index, Commit: m.Commit})
		}
	}
	return nil
}

// postReseedBatch posts one batch of a re-seed until the peer acknowledges
// it, backing off between tries; index is the last entry of the batch.
func (s *Shipper) postReseedBatch(ctx context.Context, body []byte, index uint64) error {
	ctx = snapshotPost(ctx)
	for attempt := 1; ; attempt++ {
		ack, err := s.post(ctx, body)
		if err == nil {
			s.mu.Lock()
			s.ackedLocked(ack)
			// The peer set aside some of the snapshot's versions: it is
			// not counted as holding what the snapshot covers (WAIT).
			s.mu.snapDead = s.mu.snapDead || ack.DeadMore
			s.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errPaused) {
			if !s.waitUnpaused(ctx) {
				return ctx.Err()
			}
			attempt--
			continue
		}
		var gap *errGap
		if errors.As(err, &gap) {
			return fmt.Errorf("the receiver lost part of the snapshot (at %d of %d); restarting", gap.hwm, index)
		}
		s.mu.Lock()
		s.mu.errors++
		s.mu.lastErr = "re-seed: " + err.Error()
		s.mu.Unlock()
		if !sleep(ctx, s.backoff.Delay(attempt, s.rng)) {
			return ctx.Err()
		}
	}
}

// resumeAfterReseed moves the cursor to the snapshot's applied index, where
// shipping resumes, and clears the request or rejoin the re-seed answered.
func (s *Shipper) resumeAfterReseed(applied entry.AppliedIndex, requested, rejoin bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.moveToLocked(applied)
	s.clearOwedLocked(requested, rejoin)
}

// moveToLocked moves the cursor to a re-seed's position, where the peer's
// mark now is: shipping resumes after it.
// REQUIRES: s.mu held.
func (s *Shipper) moveToLocked(applied entry.AppliedIndex) {
	s.mu.needsReseed = false
	if applied.Index > s.mu.acked && applied.Index <= s.log.Last() {
		s.mu.acked = applied.Index
	}
	if s.mu.acked == applied.Index {
		s.mu.ackedCommit = applied.Commit
	} else {
		s.mu.ackedCommit = hlc.Timestamp{}
	}
	// The trailer moved the peer's mark to the snapshot's applied index,
	// and the snapshot carried what lies below it (less what the peer set
	// aside of it).
	if applied.Index <= s.log.Last() {
		s.heldLocked(s.log.Stream(), applied.Index, 0, 0, nil)
		if s.mu.snapDead {
			s.mu.deadBelow = max(s.mu.deadBelow, applied.Index)
		}
	}
	s.mu.snapDead = false
}

// clearOwedLocked clears the request or rejoin a re-seed answered.
// REQUIRES: s.mu held.
func (s *Shipper) clearOwedLocked(requested, rejoin bool) {
	if requested {
		s.mu.owed = false
	}
	if rejoin {
		s.mu.rejoinSeed = false
	}
}

// reseedDone ends a re-seed's run. One that failed after it began (live)
// runs again, whether or not re-seeds are automatic: the peer's mark is
// past what it has not carried yet.
func (s *Shipper) reseedDone(err error, live bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.reseed.Running = false
	s.mu.reseed.Finished = time.Now()
	if err != nil {
		s.mu.reseed.Error = err.Error()
		s.mu.reseedRetry = time.Now().Add(s.backoff.Delay(min(s.mu.reseed.Runs, 10), s.rng))
		switch {
		case live:
			s.mu.wantReseed = true
			s.mu.reseedWhy = "the re-seed that began failed: " + err.Error()
		case s.mu.owed || s.mu.rejoinSeed:
			// A requested or rejoin re-seed retries as what it was.
		default:
			s.mu.needsReseed = true
		}
		if live && !errors.Is(err, context.Canceled) {
			s.opts.Logger.Warn("re-seed failed after it began; sending it again", "peer", s.peer.Name, "err", err)
		}
	} else {
		s.mu.reseed.Error = ""
	}
	return err
}

// seedingLocked takes a heartbeat answer's Seeding: the peer holds a
// re-seed from this cluster open that began. Unless it is the one running,
// or one that just ended (an answer may have been on its way), nothing
// will end it but a new re-seed.
// REQUIRES: s.mu held.
func (s *Shipper) seedingLocked(snap string) {
	if snap == "" || s.mu.reseed.Running || s.mu.wantReseed ||
		(snap == s.mu.reseed.Stream && time.Since(s.mu.reseed.Finished) < 30*time.Second) {
		return
	}
	s.mu.wantReseed = true
	s.mu.reseedWhy = "the peer holds a re-seed from this cluster that began and never ended (snapshot stream " + snap + ")"
	s.opts.Logger.Warn("peer holds an unfinished re-seed; sending it again", "peer", s.peer.Name, "snapshot", snap)
}

// waitUnpaused holds a snapshot's next batch while the link is paused or
// stopped by an identity conflict (a re-seed or backfill going on beside
// live entries would not stop otherwise); false once ctx ended.
func (s *Shipper) waitUnpaused(ctx context.Context) bool {
	for {
		s.mu.Lock()
		hold := s.mu.paused || s.mu.conflict != ""
		s.mu.Unlock()
		if !hold {
			return true
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return false
		}
	}
}

// nextStart is where the first of spans (the parts of [key, end) a scope
// lets through) begins; false when there is none.
func nextStart(spans []entry.Span, key string) (string, bool) {
	if len(spans) == 0 {
		return "", false
	}
	return max(spans[0].Start, key), true
}
