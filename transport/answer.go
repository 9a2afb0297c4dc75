package transport

import (
	"fmt"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// conflicted stops the link and tells the node, once.
// REQUIRES: stream is the stream the request that proved it was sent for.
func (s *Shipper) conflicted(stream entry.StreamID, why string) {
	s.mu.Lock()
	// Checked under the lock: the node swaps the log before it calls
	// Rebase (which takes it), so a conflict about the old stream either
	// sees the swap here or is cleared by Rebase after.
	if stream != s.log.Stream() {
		s.mu.Unlock()
		return // about a stream already replaced
	}
	first := s.mu.conflict == ""
	s.mu.conflict = why
	s.mu.Unlock()
	if first {
		s.opts.Logger.Error("identity conflict: this data directory's stream was used before (restored from a backup, or copied)",
			"peer", s.peer.Name, "why", why)
		if s.opts.OnConflict != nil {
			s.opts.OnConflict(s.peer.Name, stream, why)
		}
	}
}

func parseCommit(v string) hlc.Timestamp {
	ts, _ := hlc.Parse(v)
	return ts
}

// answered checks an answer about stream (the stream the request was sent
// for) against the WAL, tells OnAck, and reports whether the answer still
// concerns the current stream. A peer that holds an index the WAL does not,
// or another commit at an index it does, holds writes of a past life of this
// data directory: the link stops and the node is told.
func (s *Shipper) answered(ack *wire.Ack, stream entry.StreamID) bool {
	if stream != s.log.Stream() {
		return false // replaced while the request was out
	}
	if ack.Limits != nil || ack.Version != "" || len(ack.Nodes) > 0 {
		s.mu.Lock()
		if ack.Limits != nil {
			s.mu.limits = ack.Limits
		}
		if len(ack.Nodes) > 0 {
			s.learnNodesLocked(ack.Nodes)
		}
		if ack.Version != "" {
			s.mu.peerVersion = ack.Version
		}
		s.mu.Unlock()
	}
	why := ""
	switch last, first := s.log.Last(), s.log.First(); {
	case ack.HWM > last:
		why = fmt.Sprintf("the peer holds index %d of stream %s, the WAL ends at %d", ack.HWM, stream, last)
	case ack.HWM >= first && ack.HWM > 0 && !parseCommit(ack.HWMCommit).IsZero():
		if p, err := s.log.ReadRaw(ack.HWM); err == nil {
			if e, err := wire.NewCodec().DecodeEntry(p, wire.Defaults{Origin: s.opts.Local, Stream: stream}); err == nil &&
				e.Commit.String() != ack.HWMCommit {
				why = fmt.Sprintf("the peer holds index %d of stream %s committed at %s, the WAL's was committed at %s",
					ack.HWM, stream, ack.HWMCommit, e.Commit)
			}
		}
	}
	if why != "" {
		s.conflicted(stream, why)
		return false
	}
	if s.opts.OnAck != nil {
		s.opts.OnAck(s.peer.Name, ack)
	}
	return true
}

// ackedLocked records contact and flow hints from an ack (postOnce
// measured the clock's skew over the request itself).
// REQUIRES: s.mu held.
func (s *Shipper) ackedLocked(ack wire.Ack) {
	s.mu.lastContact = time.Now()
	s.mu.errors = 0
	s.mu.lastErr = ""
	s.mu.batches++
	s.mu.suggested = ack.SuggestedBatch
	if ack.PauseMS > 0 {
		s.mu.pauseUntil = time.Now().Add(time.Duration(ack.PauseMS) * time.Millisecond)
	}
}

// rewindLocked moves the cursor back to what the receiver says it has.
// REQUIRES: s.mu held.
func (s *Shipper) rewindLocked(hwm uint64) {
	if hwm > s.log.Last() {
		hwm = s.log.Last()
	}
	s.mu.acked = hwm
	s.mu.ackedCommit = hlc.Timestamp{}
	s.mu.rewound = true
	s.mu.held = min(s.mu.held, hwm)
	if hwm+1 < s.log.First() {
		s.mu.needsReseed = true
		s.mu.lastErr = fmt.Sprintf("receiver is at index %d, the WAL starts at %d: needs a re-seed", hwm, s.log.First())
	}
}
