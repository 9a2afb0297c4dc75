package links

import (
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/transport"
)

// Status reports every link: the leader's from its shippers, a follower's
// from where each peer's cursor stands in the log.
func (s *Set) Status() []api.LinkStatus {
	if !s.d.Leading() {
		return s.followerStatus()
	}
	links := s.All()
	out := make([]api.LinkStatus, 0, len(links))
	for _, sh := range links {
		st := sh.Status(s.d.Thresholds, s.OldestCommitWall)
		if s.d.AntiEntropy != nil {
			st.AntiEntropy = s.d.AntiEntropy(st.Peer)
		}
		st.KeptTombstones = s.Kept(st.Peer)
		st.KeptForPeerLinks = s.KeptForPeerLinks(st.Peer)
		if s.d.Settings != nil {
			st.Drift = s.d.Settings.Drift(st.Peer)
		}
		st.Runtime = s.isRuntime(st.Peer)
		out = append(out, st)
	}
	return out
}

// followerStatus is what a node that does not lead shows of its cluster's
// links: where each peer's cursor stands in the log, state follower.
func (s *Set) followerStatus() []api.LinkStatus {
	out := []api.LinkStatus{} // [] in JSON, as a leader answers: the dashboard iterates it
	stream := s.d.Stream()
	last := stream.Last()
	for _, p := range s.Peers() {
		st := api.LinkStatus{Peer: p.Name, URL: p.URL, State: transport.StateFollower, Last: last}
		if c, ok, err := s.d.Store.Cursor(p.Name); err == nil && ok && c.Stream == stream.Stream() {
			st.Acked = c.Index
			if last > c.Index {
				st.EntriesBehind = last - c.Index
				st.BytesBehind = stream.BytesAfter(c.Index)
			}
		}
		if s.d.Settings != nil {
			st.Drift = s.d.Settings.Drift(p.Name) // this node's flags, should it lead
		}
		st.Runtime = s.isRuntime(p.Name)
		out = append(out, st)
	}
	return out
}

// Watch logs each change of a link's state once: a link that degrades at
// WARN with the peer and its last error, one that recovers at INFO. The
// node calls it periodically.
func (s *Set) Watch() {
	log := s.d.Logger
	for _, st := range s.Status() {
		s.statesMu.Lock()
		prev, seen := s.states[st.Peer]
		s.states[st.Peer] = st.State
		s.statesMu.Unlock()
		if seen && prev == st.State {
			continue
		}
		switch st.State {
		case transport.StateHealthy:
			if seen {
				log.Info("peer link recovered", "peer", st.Peer, "was", prev, "last_contact", st.LastContact)
			}
		case transport.StateUnknown, transport.StatePaused, transport.StateReseeding, transport.StateFollower:
			log.Info("peer link state", "peer", st.Peer, "state", st.State, "was", prev)
		case transport.StateLagging:
			if st.LastContact.IsZero() {
				// Not reached yet (the two started together, or the
				// peer is not up yet): said at INFO; it is WARNed once
				// stalled.
				log.Info("peer link waiting for the peer's first answer", "peer", st.Peer, "last_error", st.LastError)
				continue
			}
			fallthrough
		default:
			contact := "never"
			if !st.LastContact.IsZero() {
				contact = st.LastContact.Format(time.RFC3339)
			}
			log.Warn("peer link degraded", "peer", st.Peer, "state", st.State, "was", prev, "last_contact", contact,
				"consecutive_errors", st.ConsecutiveErrors, "last_error", st.LastError, "entries_behind", st.EntriesBehind)
		}
	}
}

// KeptFrom names the peers whose link's filter, at the write's index,
// keeps some of w home (RESP's WAIT does not count them: they never hold
// all of it). The filter is the log's for that index, which this node applied
// before the write was answered.
func (s *Set) KeptFrom(w api.Write, res api.WriteResult) []string {
	var kept []string
	e := w.Entry
	if w.Ops != nil {
		e = entry.Entry{Op: entry.OpMulti, Ops: make([]entry.BatchOp, len(w.Ops))}
		for i, op := range w.Ops {
			e.Ops[i] = entry.BatchOp{Op: entry.OpSet, Key: op.Key}
			if op.Delete {
				e.Ops[i].Op = entry.OpDelete
			}
		}
	}
	for _, p := range s.Peers() {
		ls := s.d.Settings.Of(p.Name)
		f, _ := ls.FilterAt(res.Stream, res.Index)
		if f.All() {
			continue
		}
		if _, keep := transport.Project(&e, f); keep != transport.KeepAll {
			kept = append(kept, p.Name)
		}
	}
	return kept
}
