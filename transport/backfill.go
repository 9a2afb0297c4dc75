package transport

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/replicator/replicator/api"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/wire"
)

// A backfill sends the peer what the tree holds of the ranges a widened
// filter newly included (the log's LinkSettings.Backfill): a snapshot of
// those ranges in a stream of its own, beside the live stream, which keeps
// flowing. Its trailer does not move the live stream's mark at the peer
// (entries after the widening ship live under the new filter; those before
// it are in the snapshot); it carries the ranges and the horizon below
// which this cluster had collected deletes, so the peer drops the keys of
// the ranges this cluster no longer holds (docs/DATAMODEL.md, "Filters").

// BackfillStatus is the progress of a link's backfill (package api).
type BackfillStatus = api.BackfillStatus

// spanScope lets through the keys of a set of ranges.
type spanScope []entry.Span

func (s spanScope) Match(key string) bool {
	for _, sp := range s {
		if key >= sp.Start && (sp.End == "" || key < sp.End) {
			return true
		}
	}
	return false
}

func (s spanScope) Clip(start, end string) []entry.Span {
	var out []entry.Span
	for _, sp := range s {
		lo := max(sp.Start, start)
		hi := sp.End
		switch {
		case hi == "":
			hi = end
		case end != "":
			hi = min(hi, end)
		}
		if hi == "" || lo < hi {
			out = append(out, entry.Span{Start: lo, End: hi})
		}
	}
	return out
}

// maybeRebackfill tells OnRewound of a rewind since the last pass, when the
// link's recorded filters kept ranges home that a widening backfilled (the
// log decides what is pending again; a link that never narrowed costs no
// command).
func (s *Shipper) maybeRebackfill() {
	s.mu.Lock()
	rewound := s.mu.rewound
	s.mu.rewound = false
	s.mu.Unlock()
	if !rewound || s.opts.OnRewound == nil || s.opts.Link == nil {
		return
	}
	ls := s.settings()
	if len(ls.Widenings()) == 0 {
		return
	}
	if err := s.opts.OnRewound(s.peer.Name); err != nil {
		s.opts.Logger.Warn("could not ask for the backfill again after the peer lost data; trying again", "peer", s.peer.Name, "err", err)
		s.mu.Lock()
		s.mu.rewound = true
		s.mu.Unlock()
	}
}

// maybeBackfill starts the link's backfill if the log says one is pending
// that this shipper has not sent. It runs in a goroutine of its own, which
// exits when it is done or ctx ends; Run waits for it.
func (s *Shipper) maybeBackfill(ctx context.Context) {
	if s.opts.Link == nil || s.opts.Snapshots == nil {
		return
	}
	ls := s.settings()
	if len(ls.Backfill) == 0 {
		return
	}
	s.mu.Lock()
	// A generation sent waits for the log to clear it; if the log has not
	// within a while (the command failed), it is sent again.
	sent := s.mu.backfill.Generation == ls.BackfillGen && s.mu.backfill.Error == "" && time.Since(s.mu.backfill.Finished) < 30*time.Second
	if s.mu.backfill.Running || sent ||
		s.mu.needsReseed || s.mu.reseed.Running || s.mu.paused || s.mu.conflict != "" || s.mu.limits == nil || !s.mu.limits.Markers || time.Now().Before(s.mu.backfillRetry) {
		s.mu.Unlock()
		return
	}
	s.mu.backfill = BackfillStatus{Running: true, Ranges: ls.Backfill, Runs: s.mu.backfill.Runs + 1, Generation: ls.BackfillGen}
	s.mu.Unlock()
	s.bg.Add(1)
	go func() {
		// Exits when the backfill is done, failed, or ctx ended.
		defer s.bg.Done()
		err := s.backfill(ctx, ls.Backfill)
		s.mu.Lock()
		s.mu.backfill.Running = false
		s.mu.backfill.Finished = time.Now()
		if err != nil {
			s.mu.backfill.Error = err.Error()
			s.mu.backfillRetry = time.Now().Add(s.backoff.Delay(min(s.mu.backfill.Runs, 10), s.rng))
		} else {
			s.mu.backfill.Error = ""
		}
		s.mu.Unlock()
		if err != nil {
			if ctx.Err() == nil {
				s.opts.Logger.Warn("backfill failed; trying again", "peer", s.peer.Name, "err", err)
			}
			s.wake()
			return
		}
		s.opts.Logger.Info("backfill done", "peer", s.peer.Name, "ranges", len(ls.Backfill), "generation", ls.BackfillGen)
		if s.opts.OnBackfillDone != nil {
			s.opts.OnBackfillDone(s.peer.Name, ls.BackfillGen)
		}
	}()
}

// backfill streams what the tree holds of spans to the peer.
func (s *Shipper) backfill(ctx context.Context, spans []entry.Span) error {
	snap, err := s.opts.Snapshots.NewSnapshot()
	if err != nil {
		return err
	}
	defer snap.Close()
	horizon, err := snap.CollectedBelow()
	if err != nil {
		return err
	}
	// A backfill relays no other cluster's writes: it carries only the
	// widened ranges, so a transaction of a third cluster would arrive
	// clipped to them, shown in part until its author's stream brought the
	// rest (issue 48); the author's own link carries its writes, kept to
	// its filter (a narrowing of this link never held them back).
	feed, err := newScopedFeed(snap, s.opts.Local, s.opts.Now(), spanScope(spans), "", func(string) bool { return true })
	if err == nil {
		feed.contexts, feed.expiry, feed.floors = s.takesContexts(), s.takesExpiry(), s.takesFloors()
	}
	if err != nil {
		return err
	}
	budget := s.snapshotBudget()
	sent := 0
	for done := false; !done; {
		var ents [][]byte
		if ents, done, err = feed.batch(s.opts.MaxBatchEntries, budget); err != nil {
			return err
		}
		h := wire.Header{Sender: s.opts.Local, Stream: feed.stream, Snapshot: true, Backfill: true}
		if done {
			h.BackfillEnd = &wire.BackfillEnd{Horizon: horizon, Spans: spans}
		}
		body := wire.AppendHeader(nil, &h, len(ents))
		for _, p := range ents {
			body = append(body, p...)
		}
		if !s.waitUnpaused(ctx) {
			return ctx.Err()
		}
		if err := s.postReseedBatch(ctx, body, feed.index); err != nil {
			return fmt.Errorf("backfill of %s: %w", spanList(spans), err)
		}
		sent += len(ents)
		s.mu.Lock()
		s.mu.backfill.Sent = sent
		s.mu.Unlock()
	}
	return nil
}

func spanList(spans []entry.Span) string {
	var parts []string
	for _, sp := range spans {
		parts = append(parts, fmt.Sprintf("[%q, %q)", sp.Start, sp.End))
	}
	return strings.Join(parts, " ")
}

// BackfillStatus returns the link's backfill progress.
func (s *Shipper) BackfillStatus() BackfillStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.backfill
}
