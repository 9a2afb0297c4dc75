package transport

import (
	"slices"

	"github.com/replicator/replicator/api"
)

// SetURL points the link at another address of the peer (gossip).
func (s *Shipper) SetURL(u string) {
	s.mu.Lock()
	changed := s.mu.url != u
	s.mu.url = u
	s.mu.Unlock()
	if changed {
		s.wake()
	}
}

// SetLiveness records what gossip says of the peer; a peer coming back to
// life is tried at once instead of after its backoff.
func (s *Shipper) SetLiveness(state string) {
	s.mu.Lock()
	wasDown := s.mu.liveness == api.LiveDead || s.mu.liveness == api.LiveLeft
	s.mu.liveness = state
	s.mu.Unlock()
	if wasDown && state == api.LiveAlive {
		s.wake()
	}
}

// learnNodesLocked records the peer cluster's nodes.
// REQUIRES: s.mu held.
func (s *Shipper) learnNodesLocked(nodes []string) {
	if len(nodes) > 64 {
		nodes = nodes[:64]
	}
	if slices.Equal(s.mu.nodes, nodes) {
		return
	}
	s.mu.nodes = slices.Clone(nodes)
}

// rotateLocked points the link at the next node of the peer cluster it
// knows (the configured URL among them), after the current one failed.
// REQUIRES: s.mu held.
func (s *Shipper) rotateLocked() {
	cands := []string{s.peer.URL}
	for _, u := range append(slices.Clone(s.peer.Fallbacks), s.mu.nodes...) {
		if u != "" && !slices.Contains(cands, u) {
			cands = append(cands, u)
		}
	}
	if len(cands) < 2 {
		return
	}
	i := slices.Index(cands, s.mu.url)
	s.mu.url = cands[(i+1)%len(cands)]
}
