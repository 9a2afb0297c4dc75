package cluster

import (
	"sync"

	"github.com/hashicorp/raft"
)

// The leader's view of which voters answer its heartbeats: raft reports a
// failed heartbeat to a follower, and its resumption, as observations. A
// voter that stops answering shows within a heartbeat timeout, long before
// gossip marks it dead (tens of seconds on the WAN profile), and before a
// second loss costs the quorum.

// heartbeats tracks the voters failing the leader's heartbeats.
type heartbeats struct {
	obs  chan raft.Observation
	done chan struct{} // closed when watch exits
	mu   struct {
		sync.Mutex
		failing map[raft.ServerID]bool
	}
}

func newHeartbeats() *heartbeats {
	h := &heartbeats{obs: make(chan raft.Observation, 64), done: make(chan struct{})}
	h.mu.failing = map[raft.ServerID]bool{}
	return h
}

// observer is what raft is given: failed and resumed heartbeats, and
// leadership changes (a new leader's view starts afresh). It never blocks
// raft: an observation that finds the channel full is dropped, and the
// next one of that server sets its state again.
func (h *heartbeats) observer() *raft.Observer {
	return raft.NewObserver(h.obs, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.LeaderObservation:
			return true
		}
		return false
	})
}

// watch applies observations until stop is closed (Group.Close).
func (h *heartbeats) watch(stop <-chan struct{}) {
	defer close(h.done)
	for {
		select {
		case <-stop:
			return
		case o := <-h.obs:
			h.mu.Lock()
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				h.mu.failing[d.PeerID] = true
			case raft.ResumedHeartbeatObservation:
				delete(h.mu.failing, d.PeerID)
			case raft.LeaderObservation:
				clear(h.mu.failing)
			}
			h.mu.Unlock()
		}
	}
}

func (h *heartbeats) failing(id raft.ServerID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.failing[id]
}

// VotersLive is the leader's count of the configuration's voters that
// answer its heartbeats (itself included), and of all voters; ok is false
// on a node that does not lead (it does not know).
func (g *Group) VotersLive() (live, voters int, ok bool) {
	if !g.IsLeader() {
		return 0, 0, false
	}
	cf := g.raft.GetConfiguration()
	if cf.Error() != nil {
		return 0, 0, false
	}
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if s.ID == g.id || !g.beats.failing(s.ID) {
			live++
		}
	}
	return live, voters, true
}
