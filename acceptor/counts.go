package acceptor

import "github.com/replicator/replicator/api"

// Counts are the acceptor's outcome counters, per origin cluster
// (api.Counts: GET /admin/peers reports them).
type Counts = api.Counts

// Counts returns a copy of the per-origin counters.
func (a *Acceptor) Counts() map[string]Counts {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]Counts, len(a.mu.counts))
	for k, v := range a.mu.counts {
		out[k] = *v
	}
	return out
}

// REQUIRES: a.mu held.
func (a *Acceptor) countsLocked(origin string) *Counts {
	c := a.mu.counts[origin]
	if c == nil {
		c = &Counts{}
		a.mu.counts[origin] = c
	}
	return c
}

func (a *Acceptor) count(origin string, f func(*Counts)) {
	a.mu.Lock()
	f(a.countsLocked(origin))
	a.mu.Unlock()
}
