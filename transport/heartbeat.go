package transport

import (
	"context"
	"slices"
	"time"

	"github.com/replicator/replicator/wire"
)

// SetRejoining sets this node's rejoin phase with the peer (0, or
// RejoinRequesting / RejoinSeeding); the next heartbeat tells it, at once.
func (s *Shipper) SetRejoining(phase uint8) {
	s.mu.Lock()
	s.mu.rejoining = phase
	s.mu.Unlock()
	s.wake()
}

// idleFor is how long since the peer last answered (or since ever).
func (s *Shipper) idleFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.lastContact.IsZero() {
		return time.Duration(1 << 62)
	}
	return time.Since(s.mu.lastContact)
}

// heartbeat sends an empty batch of the stream (asking for a re-seed when
// the node lost data). The ack carries the receiver's high-water mark: one
// below the cursor means the receiver lost entries (its data was wiped or
// restored), and the shipper rewinds; one the WAL does not hold means this
// node's data directory was restored or copied.
func (s *Shipper) heartbeat(ctx context.Context) error {
	s.mu.Lock()
	phase := s.mu.rejoining
	s.mu.lastHeartbeat = time.Now()
	s.mu.Unlock()
	stream := s.log.Stream()
	h := wire.Header{Sender: s.opts.Local, Stream: stream, Rejoining: phase}
	var told string
	if s.tellsFilter() {
		// What of this cluster's writes may reach the peer: it keeps
		// other clusters' relays of them to it. And the ranges whose
		// deletes this cluster keeps for its other links: the peer keeps
		// them too, for this cluster to get back if it loses its data.
		f, keeps, now := s.filterNow()
		h.OwnFilter, h.Keeps, told = &f, keeps, now
	}
	if s.opts.IdleBound != nil && s.takesIdle() {
		bound, last := s.opts.IdleBound()
		if s.Acked() >= last && bound.Wall > 0 {
			h.Idle = &wire.IdleFrontier{Index: last, Bound: bound}
		}
	}
	if s.opts.OpenStreams != nil && s.takesOpen() {
		// Every heartbeat says them (a few bytes): the peer records a
		// change, and a receiver restored from a backup learns them again.
		// A list read across a change of this shipper's stream, which
		// does not hold it, waits for the next heartbeat.
		if open := s.opts.OpenStreams(); slices.Contains(open, stream) {
			h.Open = open
		}
	}
	body := wire.AppendHeader(nil, &h, 0)
	ack, err := s.post(ctx, body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.mu.phaseSent = phase
	if h.OwnFilter != nil {
		s.mu.filterTold = told
	}
	if h.Open != nil {
		s.mu.openTold = h.Open
	}
	s.mu.Unlock()
	if !s.answered(&ack, stream) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.takeAckLocked(ack, stream) {
		return nil
	}
	s.seedingLocked(ack.Seeding)
	if ack.Seeding == "" {
		s.heldLocked(stream, ack.HWM, 1, ack.HWM, &ack)
	}
	if phase == wire.RejoinRequesting && ack.ReseedRecorded {
		s.opts.Logger.Debug("peer holds the request for a re-seed", "peer", s.peer.Name)
	}
	if ack.HWM < s.mu.acked && !s.mu.needsReseed {
		s.opts.Logger.Warn("peer is behind its cursor: rewinding", "peer", s.peer.Name, "cursor", s.mu.acked, "peer_hwm", ack.HWM)
		s.mu.rewinds++
		s.rewindLocked(ack.HWM)
	} else if ack.HWM == s.mu.acked {
		s.mu.ackedCommit = parseCommit(ack.HWMCommit)
	}
	return nil
}
