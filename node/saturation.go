package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/transport"
)

type saturation struct {
	marks    api.WaterMarks
	wait     time.Duration // how long a write waits for saturation to clear
	overflow map[string]string
	log      *slog.Logger
	metrics  *nodeMetrics
	// links are the node's links now; oldest the commit wall time of a
	// stream index (the backlog's age).
	links  func() []*transport.Shipper
	oldest func(index uint64) (int64, bool)

	// saturated and evaluatedAt (nanoseconds on the monotonic clock since
	// monoStart) mirror the last evaluation, so that admit answers the
	// common case, a healthy node evaluated within the last millisecond,
	// without taking mu on every write.
	saturated   atomic.Bool
	evaluatedAt atomic.Int64

	mu struct {
		sync.Mutex
		state, cause, peer string
		since              time.Time
		changed            chan struct{} // closed when state changes
		evaluated          time.Time
		refusals           uint64
		trends             map[string]*trend // by peer
	}
}

func (s *saturation) init() {
	s.mu.state = api.StateHealthy
	s.mu.since = time.Now()
	s.mu.changed = make(chan struct{})
	s.mu.trends = map[string]*trend{}
}

// linkOver tells which mark a backlog is over, "" if none.
func over(bl transport.Backlog, entries uint64, bytes int64, age time.Duration) string {
	switch {
	case entries > 0 && bl.Entries > entries:
		return fmt.Sprintf("backlog of %d entries is over %d", bl.Entries, entries)
	case bytes > 0 && bl.Bytes > bytes:
		return fmt.Sprintf("backlog of %d bytes is over %d", bl.Bytes, bytes)
	case age > 0 && bl.OldestAge > age:
		return fmt.Sprintf("oldest unacknowledged entry is %s old, over %s", bl.OldestAge.Round(time.Millisecond), age)
	}
	return ""
}

// monoStart anchors monotonic readings that fit an atomic.
var monoStart = time.Now()

// evaluateSaturation measures every retained link against the water marks,
// detaches links in overflow mode detach, and moves the node's state. It
// runs at most once a millisecond unless forced.
func (s *saturation) evaluate(force bool) api.SaturationReport {
	s.mu.Lock()
	if !force && time.Since(s.mu.evaluated) < time.Millisecond {
		r := s.reportLocked()
		s.mu.Unlock()
		return r
	}
	s.mu.Unlock()

	wm := s.marks
	var highPeer, highCause, lowPeer, lowCause string
	type seen struct {
		peer string
		bl   transport.Backlog
	}
	var observed []seen
	for _, sh := range s.links() {
		// Every peer's detach counter exists from the start (at 0), so
		// an alert on its increase has a series to watch.
		s.metrics.detached.WithLabelValues(sh.Peer().Name)
		if !sh.Retains() {
			continue
		}
		bl := sh.Backlog(s.oldest)
		s.metrics.backlog(sh.Peer().Name, bl)
		observed = append(observed, seen{sh.Peer().Name, bl})
		if c := over(bl, wm.HighEntries, wm.HighBytes, wm.HighAge); c != "" {
			if s.overflow[sh.Peer().Name] == api.OverflowDetach {
				sh.Detach("overflow: " + c)
				s.metrics.detached.WithLabelValues(sh.Peer().Name).Inc()
				continue
			}
			if highPeer == "" {
				highPeer, highCause = sh.Peer().Name, c
			}
			continue
		}
		if c := over(bl, wm.LowEntries, wm.LowBytes, wm.LowAge); c != "" && lowPeer == "" {
			lowPeer, lowCause = sh.Peer().Name, c
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.evaluated = time.Now()
	// The links watched now have a trend; one no longer watched (detached,
	// or gone with a term this node no longer leads) loses it, and with it
	// its forecast.
	// (In place: this runs up to once a millisecond under writes.)
	at := time.Since(monoStart)
	for peer := range s.mu.trends {
		if !slices.ContainsFunc(observed, func(o seen) bool { return o.peer == peer }) {
			delete(s.mu.trends, peer)
		}
	}
	for _, o := range observed {
		t := s.mu.trends[o.peer]
		if t == nil {
			t = &trend{}
			s.mu.trends[o.peer] = t
		}
		t.observe(at, o.bl)
	}
	state, peer, cause := api.StateHealthy, "", ""
	switch {
	case highPeer != "":
		state, peer, cause = api.StateSaturated, highPeer, highCause
	case lowPeer != "" && s.mu.state == api.StateSaturated:
		state, peer, cause = api.StateSaturated, lowPeer, "draining: "+lowCause+" (low-water mark)"
	case lowPeer != "":
		state, peer, cause = api.StateThrottled, lowPeer, lowCause
	}
	if state != s.mu.state {
		s.log.Warn("saturation state changed", "from", s.mu.state, "to", state, "peer", peer, "cause", cause)
		s.mu.since = time.Now()
		close(s.mu.changed)
		s.mu.changed = make(chan struct{})
	}
	s.mu.state, s.mu.peer, s.mu.cause = state, peer, cause
	s.saturated.Store(state == api.StateSaturated)
	s.evaluatedAt.Store(int64(time.Since(monoStart)))
	return s.reportLocked()
}

// REQUIRES: n.sat.mu held.
func (s *saturation) reportLocked() api.SaturationReport {
	return api.SaturationReport{State: s.mu.state, Cause: s.mu.cause, Peer: s.mu.peer, Since: s.mu.since,
		Thresholds: s.marks, Refusals: s.mu.refusals}
}

// forecast is a link's trend toward its high-water marks (zero for a link
// not watched: detached, or not shipped from this node).
func (s *saturation) forecast(peer string, bl transport.Backlog) api.Forecast {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.mu.trends[peer]; t != nil {
		return t.forecast(bl, s.marks)
	}
	return api.Forecast{}
}

// forecasts is every watched link's forecast from its last observation
// (for /metrics: a link not watched has no series).
func (s *saturation) forecasts() map[string]api.Forecast {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]api.Forecast, len(s.mu.trends))
	for peer, t := range s.mu.trends {
		out[peer] = t.forecast(t.last, s.marks)
	}
	return out
}

// Saturation reports the node's saturation state.
func (n *Node) Saturation() api.SaturationReport { return n.sat.evaluate(true) }

// admit lets a local write in unless the node is saturated; then it waits up
// to the admission budget for the state to clear, and refuses.
func (s *saturation) admit(ctx context.Context) error {
	if !s.saturated.Load() && int64(time.Since(monoStart))-s.evaluatedAt.Load() < int64(time.Millisecond) {
		return nil
	}
	wait := s.wait
	if wait < 0 {
		wait = 0
	}
	start := time.Now()
	for {
		r := s.evaluate(false)
		if r.State != api.StateSaturated {
			return nil
		}
		waited := time.Since(start)
		if waited >= wait {
			s.mu.Lock()
			s.mu.refusals++
			s.mu.Unlock()
			return &api.SaturatedError{Source: acceptor.SourceOutboundBacklog, Peer: r.Peer, Cause: r.Cause, Waited: waited}
		}
		s.mu.Lock()
		changed := s.mu.changed
		s.mu.Unlock()
		t := time.NewTimer(min(wait-waited, 50*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w", api.ErrNotWritten, ctx.Err())
		case <-changed:
		case <-t.C:
		}
		t.Stop()
		s.evaluate(true)
	}
}
