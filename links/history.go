package links

import (
	"sync"
	"time"

	"github.com/replicator/replicator/api"
)

// The dashboard's chart is kept by the links: a ring of samples of every
// link's backlog over the last hour, so a page opened during an incident
// shows how it began, not an empty chart that fills from then on.

// history is a fixed ring of samples; the oldest is overwritten.
type history struct {
	mu struct {
		sync.Mutex
		ring []api.HistorySample // cap is the ring's size
		next int                 // where the next sample goes once the ring is full
	}
}

func newHistory(size int) *history {
	h := &history{}
	h.mu.ring = make([]api.HistorySample, 0, max(size, 1))
	return h
}

func (h *history) add(s api.HistorySample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.mu.ring) < cap(h.mu.ring) {
		h.mu.ring = append(h.mu.ring, s)
		return
	}
	h.mu.ring[h.mu.next] = s
	h.mu.next = (h.mu.next + 1) % len(h.mu.ring)
}

// after returns the samples later than t, oldest first.
func (h *history) after(t time.Time) []api.HistorySample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]api.HistorySample, 0, len(h.mu.ring))
	for i := range h.mu.ring {
		s := h.mu.ring[(h.mu.next+i)%len(h.mu.ring)]
		if s.Time.After(t) {
			out = append(out, s)
		}
	}
	return out
}

// sample is one point of the chart: the links' states and backlogs, and the
// node's saturation state, at now (ns since the epoch).
func sample(now int64, saturation string, links []api.LinkStatus) api.HistorySample {
	// Milliseconds: the page asks for ?after=<ms of the last it saw>, so a
	// finer stamp would come back again as "after" its own truncation.
	s := api.HistorySample{Time: time.UnixMilli(now / 1e6).UTC(), Saturation: saturation, Peers: map[string]api.PeerSample{}}
	for _, st := range links {
		s.Peers[st.Peer] = api.PeerSample{State: st.State, Entries: st.EntriesBehind, Bytes: st.BytesBehind, Oldest: st.OldestUnackedAge}
	}
	return s
}

// History is the dashboard's chart: the samples later than after, oldest
// first.
func (s *Set) History(after time.Time) api.HistoryReport {
	return api.HistoryReport{IntervalSeconds: s.d.HistoryInterval.Seconds(),
		SpanSeconds: s.d.HistorySpan.Seconds(), Samples: s.history.after(after)}
}

// takeSample adds a point to the chart.
func (s *Set) takeSample() {
	state := ""
	if s.d.Saturation != nil {
		state = s.d.Saturation()
	}
	s.history.add(sample(s.d.Clock.Physical(), state, s.Status()))
}
