package links

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/transport"
)

// SaturationDeps is what Saturation needs of its node.
type SaturationDeps struct {
	// Marks are the water marks; Wait how long a write waits for
	// saturation to clear; Peers the configured peers (their overflow
	// modes).
	Marks api.WaterMarks
	Wait  time.Duration
	Peers []Peer
	// Links are the node's links now; Oldest the commit wall time of a
	// stream index (the backlog's age).
	Links  func() []*transport.Shipper
	Oldest func(index uint64) (int64, bool)
	Logger *slog.Logger
}

// Saturation is the node's saturation state (docs/SATURATION.md): every
// retained link measured against the water marks, links in overflow mode
// detach detached, and local writes admitted or refused by it.
type Saturation struct {
	d        SaturationDeps
	overflow map[string]string // each peer's overflow mode
	// The backlog of each link and the detaches, as Prometheus series.
	backlogEntries, backlogBytes, backlogAge *prometheus.GaugeVec
	detached                                 *prometheus.CounterVec

	// saturated and evaluatedAt (nanoseconds on the monotonic clock since
	// monoStart) mirror the last evaluation, so that Admit answers the
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

// NewSaturation builds the saturation state of d, healthy.
func NewSaturation(d SaturationDeps) *Saturation {
	s := &Saturation{d: d,
		backlogEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "replicator_backlog_entries",
			Help: "WAL entries a peer has not acknowledged."}, []string{"peer"}),
		backlogBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "replicator_backlog_bytes",
			Help: "WAL bytes a peer has not acknowledged."}, []string{"peer"}),
		backlogAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "replicator_backlog_oldest_age_seconds",
			Help: "Age of the oldest entry a peer has not acknowledged."}, []string{"peer"}),
		detached: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_peer_detached_total",
			Help: "Peers detached on backlog overflow (they need a re-seed)."}, []string{"peer"}),
	}
	if s.d.Logger == nil {
		s.d.Logger = slog.Default()
	}
	s.overflow = map[string]string{}
	for _, p := range d.Peers {
		s.overflow[p.Name] = p.Overflow
	}
	s.mu.state = api.StateHealthy
	s.mu.since = time.Now()
	s.mu.changed = make(chan struct{})
	s.mu.trends = map[string]*trend{}
	return s
}

// CountDetached counts a link detached (by overflow, or the operator).
func (s *Saturation) CountDetached(peer string) { s.detached.WithLabelValues(peer).Inc() }

// Register registers the saturation's series with f.
func (s *Saturation) Register(f func(prometheus.Collector)) {
	f(s.backlogEntries)
	f(s.backlogBytes)
	f(s.backlogAge)
	f(s.detached)
	f(s)
}

// Refusals counts the local writes refused while saturated.
func (s *Saturation) Refusals() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.refusals
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

// Evaluate measures every retained link against the water marks,
// detaches links in overflow mode detach, and moves the node's state. It
// runs at most once a millisecond unless forced.
func (s *Saturation) Evaluate(force bool) api.SaturationReport {
	s.mu.Lock()
	if !force && time.Since(s.mu.evaluated) < time.Millisecond {
		r := s.reportLocked()
		s.mu.Unlock()
		return r
	}
	s.mu.Unlock()

	wm := s.d.Marks
	var highPeer, highCause, lowPeer, lowCause string
	type seen struct {
		peer string
		bl   transport.Backlog
	}
	var observed []seen
	for _, sh := range s.d.Links() {
		// Every peer's detach counter exists from the start (at 0), so
		// an alert on its increase has a series to watch.
		s.detached.WithLabelValues(sh.Peer().Name)
		if !sh.Retains() {
			continue
		}
		bl := sh.Backlog(s.d.Oldest)
		s.backlogEntries.WithLabelValues(sh.Peer().Name).Set(float64(bl.Entries))
		s.backlogBytes.WithLabelValues(sh.Peer().Name).Set(float64(bl.Bytes))
		s.backlogAge.WithLabelValues(sh.Peer().Name).Set(bl.OldestAge.Seconds())
		observed = append(observed, seen{sh.Peer().Name, bl})
		if c := over(bl, wm.HighEntries, wm.HighBytes, wm.HighAge); c != "" {
			if s.overflow[sh.Peer().Name] == api.OverflowDetach {
				sh.Detach("overflow: " + c)
				s.CountDetached(sh.Peer().Name)
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
		s.d.Logger.Warn("saturation state changed", "from", s.mu.state, "to", state, "peer", peer, "cause", cause)
		s.mu.since = time.Now()
		close(s.mu.changed)
		s.mu.changed = make(chan struct{})
	}
	s.mu.state, s.mu.peer, s.mu.cause = state, peer, cause
	s.saturated.Store(state == api.StateSaturated)
	s.evaluatedAt.Store(int64(time.Since(monoStart)))
	return s.reportLocked()
}

// REQUIRES: s.mu held.
func (s *Saturation) reportLocked() api.SaturationReport {
	return api.SaturationReport{State: s.mu.state, Cause: s.mu.cause, Peer: s.mu.peer, Since: s.mu.since,
		Thresholds: s.d.Marks, Refusals: s.mu.refusals}
}

// Forecast is a link's trend toward its high-water marks (zero for a link
// not watched: detached, or not shipped from this node).
func (s *Saturation) Forecast(peer string, bl transport.Backlog) api.Forecast {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.mu.trends[peer]; t != nil {
		return t.forecast(bl, s.d.Marks)
	}
	return api.Forecast{}
}

// Forecasts is every watched link's forecast from its last observation
// (for /metrics: a link not watched has no series).
func (s *Saturation) Forecasts() map[string]api.Forecast {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]api.Forecast, len(s.mu.trends))
	for peer, t := range s.mu.trends {
		out[peer] = t.forecast(t.last, s.d.Marks)
	}
	return out
}

// Admit lets a local write in unless the node is saturated; then it waits up
// to the admission budget for the state to clear, and refuses.
func (s *Saturation) Admit(ctx context.Context) error {
	if !s.saturated.Load() && int64(time.Since(monoStart))-s.evaluatedAt.Load() < int64(time.Millisecond) {
		return nil
	}
	wait := s.d.Wait
	if wait < 0 {
		wait = 0
	}
	start := time.Now()
	for {
		r := s.Evaluate(false)
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
		s.Evaluate(true)
	}
}

// Backlogs is each link's backlog as /admin/wal shows it: against the
// water marks, with the link's overflow mode and its forecast.
func (s *Saturation) Backlogs(links []api.LinkStatus) []api.PeerBacklog {
	out := []api.PeerBacklog{} // [] in JSON
	for _, ls := range links {
		mode := s.overflow[ls.Peer]
		if mode == "" {
			mode = api.OverflowReject
		}
		bl := transport.Backlog{Entries: ls.EntriesBehind, Bytes: ls.BytesBehind, OldestAge: time.Duration(ls.OldestUnackedAge * float64(time.Second))}
		out = append(out, api.PeerBacklog{Peer: ls.Peer, Acked: ls.Acked, Entries: ls.EntriesBehind,
			Bytes: ls.BytesBehind, OldestAgeSeconds: ls.OldestUnackedAge, Overflow: mode, State: ls.State, Retained: !ls.Detached,
			Forecast: s.Forecast(ls.Peer, bl)})
	}
	return out
}
