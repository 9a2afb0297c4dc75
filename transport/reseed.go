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
// snapshot corresponds to, which the receiver commits as its high-water
// mark together with the batch, so the next heartbeat finds the peer where
// the shipper resumes and the re-seed ends there.
func (s *Shipper) reseed(ctx context.Context) error {
	requested, rejoin := s.beginReseed()

	snap, err := s.opts.Snapshots.NewSnapshot()
	if err != nil {
		return s.reseedDone(err)
	}
	defer snap.Close()
	total, err := snap.Count()
	if err != nil {
		return s.reseedDone(err)
	}
	applied := snap.LocalApplied()
	stream := s.log.Stream()
	if entry.StreamID(applied.Stream) != stream {
		// The stream was replaced since (or nothing was ever applied).
		applied = entry.AppliedIndex{Stream: stream}
	}
	s.mu.Lock()
	s.mu.reseed.Total = total
	s.mu.Unlock()

	sent, err := s.sendSnapshot(ctx, snap, stream, applied, requested, rejoin)
	if err != nil {
		return s.reseedDone(err)
	}
	if s.log.Stream() != stream {
		// The stream was replaced during the re-seed: its trailer named the
		// old one. The rejoin that follows re-seeds the peer again.
		return s.reseedDone(errors.New("the stream was replaced during the re-seed"))
	}
	s.resumeAfterReseed(applied, requested, rejoin)
	s.flushCursor(true)
	s.opts.Logger.Info("re-seed done", "peer", s.peer.Name, "keys", sent, "resume_after", applied.Index)
	if s.opts.OnReseedDone != nil {
		s.opts.OnReseedDone(s.peer.Name, requested, rejoin)
	}
	return s.reseedDone(nil)
}

// beginReseed marks a re-seed as running, with why it runs, and reports
// whether it answers the peer's request and whether it ends this node's
// rejoin.
func (s *Shipper) beginReseed() (requested, rejoin bool) {
	s.mu.Lock()
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
	if s.opts.Applied != nil {
		// Hold the WAL from here on: entries after the snapshot's applied
		// index must still be there when shipping resumes.
		s.mu.acked = max(s.mu.acked, min(s.opts.Applied(), s.log.Last()))
	}
	s.mu.reseed = ReseedStatus{Running: true, Started: time.Now(), Runs: s.mu.reseed.Runs + 1,
		LastReason: why, Requested: requested}
	s.mu.Unlock()
	s.opts.Logger.Info("re-seed started", "peer", s.peer.Name, "why", why, "requested", requested, "rejoin", rejoin)
	return requested, rejoin
}

// sendSnapshot streams snap to the peer in batches of a stream of their
// own, the last one carrying the trailer (stream at applied), and returns
// how many entries it sent.
func (s *Shipper) sendSnapshot(ctx context.Context, snap Snapshot, stream entry.StreamID, applied entry.AppliedIndex,
	requested, rejoin bool) (int, error) {
	// The snapshot holds the tree as of applied: it carries what the
	// filter in force right after it lets cross, relayed keys included
	// (the entries after it ship under their own epochs).
	ls := s.settings()
	filter, _ := ls.FilterAt(stream, applied.Index+1)
	feed, err := newSnapshotFeed(snap, s.opts.Local, s.opts.Now(), filter)
	if err != nil {
		return 0, err
	}
	sent := 0
	budget := s.snapshotBudget()
	for done := false; !done; {
		var ents [][]byte
		ents, done, err = feed.batch(s.opts.MaxBatchEntries, budget)
		if err != nil {
			return sent, err
		}
		s.mu.Lock()
		detached := s.mu.detached
		s.mu.Unlock()
		if detached {
			return sent, errors.New("the peer was detached again (backlog overflow) during the re-seed")
		}
		h := wire.Header{Sender: s.opts.Local, Stream: feed.stream, Snapshot: true, Requested: requested, Rejoin: rejoin}
		if done {
			if err := s.trailer(&h, snap, stream, applied, filter); err != nil {
				return sent, err
			}
		}
		body := wire.AppendHeader(nil, &h, len(ents))
		for _, p := range ents {
			body = append(body, p...)
		}
		if err := s.postReseedBatch(ctx, body, feed.index); err != nil {
			return sent, err
		}
		sent += len(ents)
		s.mu.Lock()
		s.mu.reseed.Sent = sent
		s.mu.Unlock()
	}
	return sent, nil
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
}

// scope is what of the tree a snapshot sends: a link's filter, or the
// ranges of a backfill.
type scope interface {
	Match(key string) bool
	Clip(start, end string) []entry.Span
}

// newSnapshotFeed starts reading snap as a stream of its own, committed at
// now.
func newSnapshotFeed(snap Snapshot, local string, now int64, filter entry.Filter) (*snapshotFeed, error) {
	return newScopedFeed(snap, local, now, filter)
}

// newScopedFeed is newSnapshotFeed of what filter lets through.
func newScopedFeed(snap Snapshot, local string, now int64, filter scope) (*snapshotFeed, error) {
	f := &snapshotFeed{snap: snap, local: local, stream: entry.NewStreamID(), commit: hlc.Timestamp{Wall: now}, codec: wire.NewCodec(),
		filter: filter}
	f.defs = wire.Defaults{Origin: local, Stream: f.stream}
	// Range tombstones and counters go first (they are few), then every key.
	ranges, err := snap.Ranges()
	if err != nil {
		return nil, err
	}
	for _, r := range ranges {
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
		if !filter.Match(key) {
			continue
		}
		for comp, t := range c.Totals {
			t := t
			f.extra = append(f.extra, entry.Entry{Op: entry.OpCounter, Key: key, Ctr: &t, CtrComp: comp,
				Stamp: c.Stamp.HLC, StampOrigin: c.Stamp.Origin})
		}
	}
	return f, nil
}

// next returns the snapshot's next entry (false once there is none).
func (f *snapshotFeed) next() (entry.Entry, bool, error) {
	if len(f.extra) > 0 {
		e := f.extra[0]
		f.extra = f.extra[1:]
		return e, true, nil
	}
	key, rec, ok, err := f.snap.Next()
	for ok && err == nil && !f.filter.Match(key) {
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
	e := entry.Entry{Stamp: rec.Stamp.HLC, Op: entry.OpSet, Key: key, Value: rec.Value, StampOrigin: rec.Stamp.Origin}
	if rec.Tombstone {
		e.Op, e.Value = entry.OpDelete, nil
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
	return ents, false, nil
}

// trailer ends the re-seed in its last batch's header h: the position in
// the real stream the snapshot corresponds to, and the marks of the other
// clusters' streams it holds.
func (s *Shipper) trailer(h *wire.Header, snap Snapshot, stream entry.StreamID, applied entry.AppliedIndex, filter entry.Filter) error {
	h.End = &wire.SnapshotEnd{Stream: stream, Index: applied.Index, Commit: applied.Commit}
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
		// The receiver's own streams are its business.
		if m.Origin != s.peer.Name && len(h.Marks) < wire.MaxMarks {
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
		t0 := s.opts.Now()
		ack, err := s.post(ctx, body)
		if err == nil {
			s.mu.Lock()
			s.ackedLocked(ack, t0)
			s.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
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
	s.mu.needsReseed = false
	if applied.Index > s.mu.acked && applied.Index <= s.log.Last() {
		s.mu.acked = applied.Index
	}
	if s.mu.acked == applied.Index {
		s.mu.ackedCommit = applied.Commit
	} else {
		s.mu.ackedCommit = hlc.Timestamp{}
	}
	if requested {
		s.mu.owed = false
	}
	if rejoin {
		s.mu.rejoinSeed = false
	}
}

func (s *Shipper) reseedDone(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.reseed.Running = false
	s.mu.reseed.Finished = time.Now()
	if err != nil {
		s.mu.reseed.Error = err.Error()
		s.mu.needsReseed = true
		if s.mu.owed || s.mu.rejoinSeed {
			// A requested or rejoin re-seed retries as what it was.
			s.mu.needsReseed = false
		}
	} else {
		s.mu.reseed.Error = ""
	}
	return err
}

// nextStart is where the first of spans (the parts of [key, end) a scope
// lets through) begins; false when there is none.
func nextStart(spans []entry.Span, key string) (string, bool) {
	if len(spans) == 0 {
		return "", false
	}
	return max(spans[0].Start, key), true
}
