package links

import (
	"context"
	"errors"
	"fmt"
	"github.com/replicator/replicator/internal/secret"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// Peer is one peer cluster as this node is configured with it.
type Peer struct {
	// Name is the peer's cluster ID.
	Name string
	// URL is the base URL of its replicate endpoint, e.g. http://b:7400.
	URL string
	// Secret authenticates the two clusters to each other (both directions).
	Secret string
	// Secrets, when set, holds the link's secrets as a rotation reloads
	// them (the one sent first; secret.Pair): shared with the acceptor.
	Secrets *secret.Pair
	// Fallbacks are more of its URLs (a peer added at run time).
	Fallbacks []string
	// sealed is its secret as the log holds it, and unopened says this
	// node could not open it (runtime.go).
	sealed   string
	unopened bool
	// AllowUnproven sends the secret to a node of the peer that cannot
	// prove it holds it because it runs a build before proofs (issue 25):
	// for the window of an upgrade of the peer only.
	AllowUnproven bool
	// Overflow is what happens when the peer's backlog passes a high-water
	// mark: OverflowReject (default) refuses local writes, OverflowDetach
	// stops retaining the WAL for the peer and marks it for a re-seed.
	Overflow string
	// Compression is "zstd" to compress batches toward the peer's nodes
	// that say they decode it, or "none" (default): worth it across a WAN,
	// where bytes cost more than the CPU to save them.
	Compression string
	// Include and Exclude seed the link's filter (docs/DATAMODEL.md,
	// "Filters"): only keys under one of Include (every key when empty)
	// and under none of Exclude cross to the peer. They seed the cluster's
	// log once; after that the log's filter wins (change it with
	// PUT /admin/peers/NAME/filter).
	Include, Exclude []string
	// Bandwidth seeds the link's limit in bytes per second of request
	// bodies as sent (0: none), as Include does its filter: once; after
	// that the log's wins (PUT /admin/peers/NAME/bandwidth).
	Bandwidth int64
}

// Filter is the filter the peer's flags seed.
func (p *Peer) Filter() entry.Filter { return entry.Filter{Include: p.Include, Exclude: p.Exclude} }

// Deps is what a Set needs of its node: functions and values, never the
// node.
type Deps struct {
	// Local is this cluster's ID; Peers the configured peer clusters;
	// Insecure links to any cluster gossip finds (tests).
	Local    string
	Peers    []Peer
	Insecure bool
	// Stream is the cluster's outbound stream (read once the replica
	// opened); Store the tree; Clock the node's clock.
	Stream func() *machine.Outbound
	Store  *store.Store
	Clock  *hlc.Clock
	// Settings are the links' settings through the log.
	Settings *Settings
	// Format is the log's command format; LinkOf what the log holds of a
	// link.
	Format func() int
	LinkOf func(peer string) entry.LinkSettings
	// Floor is the floor of a group being stamped (nil: none); Applied the
	// last stream index applied to the store.
	Floor   func() *hlc.Timestamp
	Applied func() uint64
	// Apply and Commit put a command through the cluster's log; Cursors
	// keep the links' positions through it.
	Apply   func(*machine.Command) error
	Commit  func(*machine.Command) (*machine.Result, error)
	Cursors transport.Cursors
	// Leading: this node leads and its term began.
	Leading func() bool
	// Client is the HTTP client of the links.
	Client *http.Client
	// What a shipper is built with (transport.Options).
	MaxBatchEntries, MaxBatchBytes int
	Linger                         time.Duration
	AutoReseed                     bool
	// PinWindow and TombstoneRetention bound tombstone collection;
	// Thresholds name a link lagging or stalled.
	PinWindow, TombstoneRetention time.Duration
	Thresholds                    transport.Thresholds
	// ConflictRetention and ConflictMaxBytes bound the conflict log a
	// collection keeps.
	ConflictRetention time.Duration
	ConflictMaxBytes  int64
	// The rejoin protocol's hooks on every link (package rejoin).
	OnAck        func(peer string, ack *wire.Ack)
	OnConflict   func(peer string, stream entry.StreamID, why string)
	OnReseedDone func(peer string, requested, rejoin bool)
	Restore      func(sh *transport.Shipper)
	// AntiEntropy is a link's comparison report (nil: none).
	AntiEntropy func(peer string) *api.AntiEntropyStatus
	// Accepted are the peers the acceptor takes writes from; Accept lets
	// a peer gossip found in without a secret (insecure peers).
	Accepted func() []string
	Accept   func(cluster string)
	// AcceptPeer and ForgetPeer let a peer added at run time in with its
	// secrets, and out once removed; SecretsKey opens the secrets the log
	// holds sealed (--secrets-key-file; none: only peers without one).
	AcceptPeer func(cluster string, secrets *secret.Pair)
	ForgetPeer func(cluster string)
	SecretsKey []byte
	// Note tells gossip's view whether a member is shipped to, and why not.
	Note func(node string, shipped bool, note string)
	// OnDetach counts a link detached by the operator.
	OnDetach func(peer string)
	// The links' loops (Start to Stop): the stream's acknowledged entries
	// are cut every TruncateInterval and tombstones collected every
	// CollectInterval (while leading; not at all while Halted says the
	// node stops or its write path failed); the dashboard's chart takes a
	// sample of the links and of Saturation's state every HistoryInterval,
	// and keeps HistorySpan of them.
	TruncateInterval, CollectInterval time.Duration
	HistoryInterval, HistorySpan      time.Duration
	Halted                            func() bool
	Saturation                        func() string
	Logger                            *slog.Logger
}

// Set is the node's links to its peer clusters: a shipper per peer, made
// from the cursors the log holds and run for the node's stream while it may
// ship (during each term of its leader; a node alone has one, from Open to
// Close), and the operator's actions on them.
type Set struct {
	d Deps
	// base is what every link and loop runs under (New to Stop); stop
	// ends it.
	base context.Context
	stop context.CancelFunc
	mu   struct {
		sync.RWMutex
		shippers []*transport.Shipper
		// ctx is what the links run under now: the current term's (nil
		// between terms: no shipper runs).
		ctx context.Context
		// building: a term is making its links (they start once it began).
		building bool
		// cancels stop one shipper each (a peer removed at run time).
		cancels map[*transport.Shipper]context.CancelFunc
	}
	wg sync.WaitGroup // shipper goroutines
	// states is each link's last state, to log changes once.
	statesMu sync.Mutex
	states   map[string]string
	// kept is what the last collection kept for each link (its filter
	// held the deletes back).
	keptMu sync.Mutex
	kept   map[string]machine.KeptCount
	// idle is each peer's idle frontier, from its heartbeats: a peer that
	// writes nothing holds collection back no more than to its last
	// heartbeat. In memory: a new leader starts from the streams' marks.
	idleMu sync.Mutex
	idle   map[string]map[entry.StreamID]hlc.Timestamp
	// acks rings at every answer a link receives (RESP WAIT listens).
	acks bell
	// shipSeconds times each acknowledged batch's round trip, per peer.
	shipSeconds *prometheus.HistogramVec
	// history is the dashboard's chart; loops the links' own loops.
	history *history
	loops   sync.WaitGroup
	// discovered are peers gossip found (a term links to them too).
	discoveredMu sync.Mutex
	discovered   map[string]Peer
	// runtime are the peers the log added at run time, as this node
	// linked and accepted them (runtime.go).
	runtimeMu sync.Mutex
	runtime   map[string]Peer
}

// New builds the links of d; none is made yet (BeginTerm).
func New(d Deps) *Set {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Halted == nil {
		d.Halted = func() bool { return false }
	}
	size := 1
	if d.HistoryInterval > 0 {
		size = int(d.HistorySpan / d.HistoryInterval)
	}
	s := &Set{d: d, states: map[string]string{}, discovered: map[string]Peer{}, history: newHistory(size),
		shipSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "replicator_ship_seconds",
			Help:    "Round trip of an acknowledged batch to a peer.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"peer"})}
	s.base, s.stop = context.WithCancel(context.Background())
	return s
}

// ErrNoTerm refuses a link at a node that does not lead now.
var ErrNoTerm = errors.New("links: this node does not lead its cluster now")

// add creates the shipper of a peer, and starts it if the links run.
func (s *Set) add(p Peer) (*transport.Shipper, error) {
	d := s.d
	empty, err := d.Store.Empty()
	if err != nil {
		return nil, err
	}
	sh, err := transport.NewShipper(transport.Peer{Name: p.Name, URL: p.URL, Secret: p.Secret, Secrets: p.Secrets, AllowUnproven: p.AllowUnproven, Compression: p.Compression,
		Fallbacks: p.Fallbacks},
		d.Stream(), d.Cursors, transport.Options{
			Local:           d.Local,
			MaxBatchEntries: d.MaxBatchEntries,
			MaxBatchBytes:   d.MaxBatchBytes,
			Linger:          d.Linger,
			Client:          d.Client,
			Now:             d.Clock.Physical,
			Applied:         d.Applied,
			Link:            d.Settings.Of,
			IdleBound:       s.idleBound,
			OpenStreams:     s.openStreams,
			Keeps:           s.keepsBesides,
			Partial: func(origin string, stream entry.StreamID) bool {
				ls := d.LinkOf(origin)
				return (ls.FromPeer != nil && !ls.FromPeer.All()) || slices.Contains(ls.Partial, stream)
			},
			Snapshots:    snapshots{d.Store},
			AutoReseed:   d.AutoReseed,
			StoreHasData: !empty,
			ObserveShip: func(peer string, t time.Duration, _ int) {
				s.shipSeconds.WithLabelValues(peer).Observe(t.Seconds())
			},
			OnAck: func(peer string, ack *wire.Ack) {
				d.OnAck(peer, ack)
				s.acks.ring()
			},
			OnConflict:   d.OnConflict,
			OnReseedDone: d.OnReseedDone,
			OnRewound: func(peer string) error {
				if d.Format() < machine.FormatKeptTombstones {
					return nil // a build that reads no rebackfill may still apply the log
				}
				d.Logger.Info("the peer lost data it had acknowledged: what widenings backfilled to it is backfilled again", "peer", peer)
				return d.Apply(&machine.Command{Link: &machine.LinkCmd{Peer: peer, Rebackfill: true}})
			},
			OnBackfillDone: func(peer string, gen uint64) {
				err := d.Apply(&machine.Command{Link: &machine.LinkCmd{Peer: peer, BackfillDone: gen}})
				if err != nil {
					d.Logger.Warn("could not record that the peer took its backfill; it is sent again", "peer", peer, "err", err)
				}
			},
			Logger: d.Logger, // the shipper names the peer on every line
		})
	if err != nil {
		return nil, err
	}
	if d.Restore != nil {
		d.Restore(sh)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, have := range s.mu.shippers {
		if have.Peer().Name == p.Name {
			return have, nil // made meanwhile (gossip and a term at once)
		}
	}
	if s.mu.ctx == nil && !s.mu.building {
		// The term ended while the link was being made: the next one links.
		return nil, ErrNoTerm
	}
	s.mu.shippers = append(s.mu.shippers, sh)
	s.runLocked(sh)
	return sh, nil
}

// REQUIRES: s.mu held.
func (s *Set) runLocked(sh *transport.Shipper) {
	ctx := s.mu.ctx
	if ctx == nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	if s.mu.cancels == nil {
		s.mu.cancels = map[*transport.Shipper]context.CancelFunc{}
	}
	s.mu.cancels[sh] = cancel
	s.wg.Add(1)
	go func() {
		// Exits when the links' context ends (Stop; the end of a term).
		defer s.wg.Done()
		sh.Run(ctx)
	}()
}

// Start runs the links' loops until Stop: truncation, tombstone
// collection, the watch of each link's state and the chart's samples. The
// links themselves run during terms (BeginTerm).
func (s *Set) Start() {
	ctx := s.base
	s.every(ctx, s.d.TruncateInterval, func() {
		if err := s.Truncate(); err != nil {
			s.d.Logger.Warn("wal truncation", "err", err)
		}
	})
	s.every(ctx, s.d.CollectInterval, func() {
		if s.d.Leading() && !s.d.Halted() { // the leader collects, for every node
			if _, err := s.CollectTombstones(); err != nil {
				s.d.Logger.Warn("tombstone and idempotency record collection", "err", err)
			}
		}
	})
	s.every(ctx, 100*time.Millisecond, func() { s.reconcileRuntime(); s.Watch() })
	s.takeSample() // a page opened at once has a point
	s.every(ctx, s.d.HistoryInterval, s.takeSample)
}

// every runs f every d until ctx ends (not at all for d <= 0).
func (s *Set) every(ctx context.Context, d time.Duration, f func()) {
	if d <= 0 {
		return
	}
	s.loops.Add(1)
	go func() {
		// Exits when ctx ends (Stop).
		defer s.loops.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f()
			}
		}
	}()
}

// Stop stops every link (a term still running ends with it) and loop, and
// waits for their goroutines. Once only.
func (s *Set) Stop() {
	s.stop()
	s.loops.Wait()
	s.wg.Wait()
}

// All returns the current links.
func (s *Set) All() []*transport.Shipper {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]*transport.Shipper(nil), s.mu.shippers...)
}

// Get returns the link to a peer.
func (s *Set) Get(peer string) (*transport.Shipper, error) {
	for _, sh := range s.All() {
		if sh.Peer().Name == peer {
			return sh, nil
		}
	}
	return nil, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
}

// Acks is the bell every link's answer rings.
func (s *Set) Acks() <-chan struct{} { return s.acks.wait() }

// Term is the links of one leadership term while it begins: made from the
// log's cursors, they run once Run is called (after the term's own
// bookkeeping), or stop with Abort.
type Term struct {
	s      *Set
	ctx    context.Context
	cancel context.CancelFunc
}

// BeginTerm makes the links of a term that begins: each term of a cluster
// of several's leader, a node alone's only one (from Open to Close). Every
// error stops what it made.
func (s *Set) BeginTerm() (*Term, error) {
	s.mu.Lock()
	s.mu.building = true
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(s.base)
	t := &Term{s: s, ctx: ctx, cancel: cancel}
	var errs []error
	for _, p := range s.Peers() {
		if _, err := s.add(p); err != nil {
			errs = append(errs, fmt.Errorf("link to %s: %w", p.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Abort()
		return nil, err
	}
	return t, nil
}

// Abort stops the links of a term that could not begin.
func (t *Term) Abort() {
	t.s.mu.Lock()
	t.s.mu.building = false
	t.s.mu.Unlock()
	t.cancel()
	t.s.forget()
}

// Run starts the term's links, then links a peer gossip found while the
// term began (too early to be linked by it, too late for BeginTerm).
func (t *Term) Run() {
	s := t.s
	s.mu.Lock()
	s.mu.building = false
	s.mu.ctx = t.ctx
	for _, sh := range s.mu.shippers {
		s.runLocked(sh)
	}
	s.mu.Unlock()
	for _, p := range s.Peers() {
		if _, err := s.Get(p.Name); err != nil {
			if _, err := s.add(p); err != nil {
				s.d.Logger.Warn("linking a peer found while the term began", "peer", p.Name, "err", err)
			}
		}
	}
}

// End stops the term's links and forgets them.
func (t *Term) End() {
	s := t.s
	s.mu.Lock()
	s.mu.ctx = nil
	s.mu.Unlock()
	t.cancel()
	s.forget()
}

// forget waits for the term's shippers to stop and forgets them.
func (s *Set) forget() {
	s.wg.Wait()
	s.mu.Lock()
	s.mu.shippers = nil
	s.mu.Unlock()
}

// Peers are the peers a term links to: the configured ones with a URL,
// and those gossip found.
func (s *Set) Peers() []Peer {
	var out []Peer
	for _, p := range s.d.Peers {
		if p.URL != "" {
			out = append(out, p)
		}
	}
	s.runtimeMu.Lock()
	for _, p := range s.runtime {
		if !p.unopened && p.URL != "" {
			out = append(out, p)
		}
	}
	s.runtimeMu.Unlock()
	s.discoveredMu.Lock()
	defer s.discoveredMu.Unlock()
	for _, p := range s.discovered {
		if !slices.ContainsFunc(out, func(q Peer) bool { return q.Name == p.Name }) {
			out = append(out, p)
		}
	}
	return out
}

// OnPeer links to a member of another cluster gossip found (or updates the
// link's liveness and URL), when a secret is configured for its cluster:
// at once on the leader, and at every term.
func (s *Set) OnPeer(m api.Member) {
	d := s.d
	c := m.Meta.Cluster
	var cfg *Peer
	for i := range d.Peers {
		if d.Peers[i].Name == c {
			cfg = &d.Peers[i]
		}
	}
	if sh, err := s.Get(c); err == nil {
		sh.SetLiveness(m.State)
		if cfg != nil && cfg.URL != "" {
			d.Note(m.Node, true, "static --peer URL wins over gossip")
			return
		}
		if m.Meta.Replicate != "" && m.State == api.LiveAlive {
			sh.SetURL(m.Meta.Replicate)
		}
		d.Note(m.Node, true, "")
		return
	}
	switch {
	case cfg == nil && !d.Insecure:
		d.Note(m.Node, false, fmt.Sprintf("no secret configured for cluster %s: shown, not shipped to", c))
		return
	case m.State != api.LiveAlive || m.Meta.Replicate == "":
		return
	}
	p := Peer{Name: c, URL: m.Meta.Replicate}
	if cfg != nil {
		p.Secret, p.Secrets, p.Overflow, p.AllowUnproven = cfg.Secret, cfg.Secrets, cfg.Overflow, cfg.AllowUnproven
	} else {
		d.Accept(c)
	}
	// Every term links to it; the current one at once.
	s.discoveredMu.Lock()
	s.discovered[c] = p
	s.discoveredMu.Unlock()
	if !d.Leading() {
		d.Note(m.Node, false, "this node does not lead its cluster: the leader ships")
		return
	}
	sh, err := s.add(p)
	if err != nil {
		d.Logger.Error("gossip: cannot ship to a discovered peer", "cluster", c, "err", err)
		return
	}
	sh.SetLiveness(m.State)
	d.Note(m.Node, true, "")
	d.Logger.Info("gossip: shipping to a discovered peer", "cluster", c, "url", m.Meta.Replicate)
}

// Holding names the peer clusters whose links acknowledged holding the
// writes from index from to index to of stream (transport.Shipper.Holds).
func (s *Set) Holding(stream entry.StreamID, from, to uint64) []string {
	peers := []string{}
	for _, sh := range s.All() {
		if sh.Holds(stream, from, to) {
			peers = append(peers, sh.Peer().Name)
		}
	}
	return peers
}

// Pause stops shipping to a peer (its backlog is still retained).
func (s *Set) Pause(peer string) error {
	sh, err := s.Get(peer)
	if err == nil {
		sh.Pause()
		s.d.Logger.Info("peer paused by the operator", "peer", peer)
	}
	return err
}

// Resume undoes Pause.
func (s *Set) Resume(peer string) error {
	sh, err := s.Get(peer)
	if err == nil {
		sh.Resume()
		s.d.Logger.Info("peer resumed by the operator", "peer", peer)
	}
	return err
}

// Reseed starts a re-seed of a peer: a snapshot of the whole tree streamed
// through its acceptor, then normal shipping.
func (s *Set) Reseed(peer string) error {
	sh, err := s.Get(peer)
	if err == nil {
		sh.Reseed("asked by the operator")
		s.d.Logger.Info("re-seed requested by the operator", "peer", peer)
	}
	return err
}

// Detach stops retaining the WAL for a peer (as overflow mode detach
// does): for a peer gone for long, whose backlog should not hold the WAL.
// It is re-seeded once it is reachable again.
func (s *Set) Detach(peer string) error {
	sh, err := s.Get(peer)
	if err == nil {
		sh.Detach("detached by the operator")
		if s.d.OnDetach != nil {
			s.d.OnDetach(peer)
		}
	}
	return err
}

// bell wakes whoever listens at the next ring: a channel closed then and
// replaced. The zero bell is ready.
type bell struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns the channel the next ring closes.
func (b *bell) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *bell) ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// snapshots opens the store's snapshots as the shippers read them.
type snapshots struct{ s *store.Store }

func (s snapshots) NewSnapshot() (transport.Snapshot, error) {
	sn, err := s.s.NewSnapshot()
	if err != nil {
		return nil, err // not a nil *store.Snapshot in a non-nil interface
	}
	return sn, nil
}
