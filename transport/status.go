package transport

import (
	"cmp"
	"slices"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// Link states, as /admin/peers shows them.
const (
	StateUnknown     = "unknown" // nothing tried yet, or the first attempt under way
	StateHealthy     = "healthy"
	StateLagging     = "lagging"
	StateStalled     = "stalled"
	StateNeedsReseed = "needs_reseed"
	StateReseeding   = "reseeding"
	StatePaused      = "paused"
	StateDead        = "dead" // gossip: the peer stopped answering probes
	StateLeft        = "left" // gossip: the peer left gracefully
	// StateConflict: the peer holds entries of this stream the WAL does
	// not; the node is replacing the stream.
	StateConflict = "identity_conflict"
	// StateFollower: this node does not lead its cluster (of several
	// nodes); the leader ships, and this node only shows the cursor.
	StateFollower = "follower"
)

// A link's report is in the contract's words (package api): what
// /admin/peers answers, with no copy kept equal by a converter.
type (
	// Status is a link's figures.
	Status = api.LinkStatus
	// ReseedStatus is the progress of a re-seed.
	ReseedStatus = api.ReseedStatus
	// Thresholds classify a link's health: Lagging, entries behind whose
	// oldest is older than it, or no contact for as long while behind
	// (default 5 s); Stalled, the same past it (default 60 s).
	Thresholds = api.Thresholds
)

// Delivery is how far the peer has this stream, for tombstone collection.
type Delivery struct {
	Acked       uint64
	AckedCommit hlc.Timestamp // zero when not known yet
	// Complete is false while the peer may be missing entries that the WAL
	// no longer holds for it: detached, needing or owed a re-seed, in one,
	// or in an identity conflict.
	Complete bool
}

// Delivery reports how far the peer has this stream.
func (s *Shipper) Delivery() Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Delivery{Acked: s.mu.acked, AckedCommit: s.mu.ackedCommit,
		Complete: !s.mu.detached && !s.mu.needsReseed && !s.mu.reseed.Running && !s.mu.owed &&
			!s.mu.wantReseed && s.mu.conflict == ""}
}

// Limits returns what the peer said it accepts (nil before it answered).
func (s *Shipper) Limits() *wire.Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits
}

// Backlog is what a peer has not acknowledged yet.
type Backlog struct {
	// Acked is the acknowledged index the figures were measured from
	// (one snapshot: a trend reads both together).
	Acked     uint64
	Entries   uint64
	Bytes     int64
	OldestAge time.Duration
	// Capacity is how many entries a second the link's bandwidth limit
	// lets through at the backlog's entry size and the link's compression
	// so far (0: no limit).
	Capacity float64
}

// Backlog measures the link's backlog. commitWall reads the commit HLC wall
// time of a WAL entry (cached per cursor position).
func (s *Shipper) Backlog(commitWall func(index uint64) (int64, bool)) Backlog {
	s.mu.Lock()
	acked := s.mu.acked
	oldestIdx, oldestWall := s.mu.oldestIdx, s.mu.oldestWall
	s.mu.Unlock()
	last := s.log.Last()
	if last <= acked {
		return Backlog{Acked: acked}
	}
	b := Backlog{Acked: acked, Entries: last - acked, Bytes: s.log.BytesAfter(acked)}
	if bps := s.settings().Bandwidth; bps > 0 && b.Bytes > 0 {
		ratio := 1.0
		s.mu.Lock()
		if s.mu.bytesWire > 0 {
			ratio = float64(s.mu.bytesRaw) / float64(s.mu.bytesWire)
		}
		s.mu.Unlock()
		b.Capacity = float64(bps) * ratio / (float64(b.Bytes) / float64(b.Entries))
	}
	if oldestIdx != acked+1 {
		wall, ok := commitWall(acked + 1)
		if !ok {
			return b
		}
		oldestIdx, oldestWall = acked+1, wall
		s.mu.Lock()
		s.mu.oldestIdx, s.mu.oldestWall = oldestIdx, oldestWall
		s.mu.Unlock()
	}
	b.OldestAge = max(0, time.Duration(s.opts.Now()-oldestWall))
	return b
}

// Status reports the link's figures.
func (s *Shipper) Status(th Thresholds, commitWall func(index uint64) (int64, bool)) Status {
	if th.Lagging == 0 {
		th.Lagging = 5 * time.Second
	}
	if th.Stalled == 0 {
		th.Stalled = 60 * time.Second
	}
	bl := s.Backlog(commitWall)
	s.mu.Lock()
	st := Status{
		Peer:              s.peer.Name,
		URL:               s.mu.url,
		Liveness:          s.mu.liveness,
		Nodes:             slices.Clone(s.mu.nodes),
		Acked:             s.mu.acked,
		LastContact:       s.mu.lastContact,
		ConsecutiveErrors: s.mu.errors,
		LastError:         s.mu.lastErr,
		InFlight:          s.mu.inFlight,
		Shipped:           s.mu.shipped,
		Resent:            s.mu.resent,
		Batches:           s.mu.batches,
		Rewinds:           s.mu.rewinds,
		PermitRefusals:    s.mu.permitRefs,
		Paused:            s.mu.paused,
		Detached:          s.mu.detached,
		NeedsReseed:       s.mu.needsReseed,
		Reseed:            s.mu.reseed,
		ClockSkewMS:       float64(s.mu.skew.Microseconds()) / 1000,
		Thresholds:        th,
		Conflict:          s.mu.conflict,
		ReseedOwed:        s.mu.owed,
		Limits:            peerLimits(s.mu.limits),
		PeerVersion:       s.mu.peerVersion,
		SendFailures:      s.mu.failures,
		Compression:       cmp.Or(s.compression(), CompressionNone),
		BytesRaw:          s.mu.bytesRaw,
		BytesOnWire:       s.mu.bytesWire,
		Backfill:          s.mu.backfill,
		ThrottledSeconds:  time.Duration(s.mu.bw.throttledNano).Seconds(),
	}
	firstTry := s.mu.firstTry
	s.mu.Unlock()
	ls := s.settings()
	st.Filter = ls.Current().String()
	st.BandwidthLimit = ls.Bandwidth
	st.Backfill.Pending = ls.Backfill
	st.Last = s.log.Last()
	st.EntriesBehind, st.BytesBehind = bl.Entries, bl.Bytes
	st.OldestUnackedAge = bl.OldestAge.Seconds()
	sinceContact := time.Since(st.LastContact)
	switch {
	case st.Conflict != "":
		st.State = StateConflict
	case st.Reseed.Running:
		st.State = StateReseeding
	case st.NeedsReseed:
		st.State = StateNeedsReseed
	case st.Paused:
		st.State = StatePaused
	case st.Liveness == api.LiveDead:
		st.State = StateDead
	case st.Liveness == api.LiveLeft:
		st.State = StateLeft
	case st.LastContact.IsZero() && firstTry.IsZero():
		st.State = StateUnknown // nothing tried yet
	default:
		// How long the link has gone without contact (since the first
		// attempt, for a peer that never answered: a mistyped URL or a
		// firewall ages like any outage), and how old its backlog is.
		silent := sinceContact
		if st.LastContact.IsZero() {
			silent = time.Since(firstTry)
		}
		age := time.Duration(0)
		if st.EntriesBehind > 0 {
			age = bl.OldestAge
		}
		switch {
		case silent > th.Stalled || age > th.Stalled:
			st.State = StateStalled
		case silent > th.Lagging || age > th.Lagging || st.ConsecutiveErrors >= 3 ||
			(st.LastContact.IsZero() && st.ConsecutiveErrors > 0):
			st.State = StateLagging
		case st.LastContact.IsZero():
			st.State = StateUnknown // the first attempt is under way
		default:
			st.State = StateHealthy
		}
	}
	return st
}

// peerLimits is a copy of what the peer announced (the report is read
// outside the shipper's lock).
func peerLimits(l *wire.Limits) *api.PeerLimits {
	if l == nil {
		return nil
	}
	pl := *l
	return &pl
}
