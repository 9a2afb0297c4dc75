// Package acceptor takes replication batches from peers: it authenticates
// the sender, bounds and decodes the body, drops every entry it already
// applied by the entry's WAL identity, merges the rest last-writer-wins and
// raises the stream's high-water mark in one synced Pebble batch, then acks.
//
// The transport is at-least-once; the acceptor makes the apply at-most-once:
// a retried, duplicated or re-shipped batch changes nothing the second time.
package acceptor

import (
	"context"
	"crypto/tls"
	secretpkg "github.com/replicator/replicator/internal/secret"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// Store is what the acceptor reads of the tree: the committed high-water
// marks of the senders' streams.
type Store interface {
	HWM(origin string, stream [16]byte) (entry.HWM, error)
	HWMsOfExcept(origin string, except [16]byte) ([]entry.HWM, error)
	// BegunReseed is the snapshot stream of a re-seed from sender that
	// began here and has not ended.
	BegunReseed(sender string) (entry.StreamID, bool, error)
	// DeadIndexes lists the indexes in [from, to] of origin's stream set
	// aside here as dead letters (at most max).
	DeadIndexes(origin string, stream [16]byte, from, to uint64, max int) ([]uint64, error)
}

// Clock is what the acceptor needs of the hybrid logical clock.
type Clock interface {
	CheckOffset(hlc.Timestamp) error
	Observe(hlc.Timestamp)
	Last() hlc.Timestamp
}

// Log commits an admitted batch through the cluster's log and returns what
// the state machine decided of it (the node's group; machine.Direct in
// tests). raw is the batch as it arrived (nil: encoded again).
type Log interface {
	ApplyInbound(in *wire.Inbound, raw []byte) (*wire.InboundResult, error)
	// UpdateReseed changes a peer's re-seed record (entry.ReseedRequested,
	// entry.AwaitRejoin) to f of what it holds, returning what it held.
	UpdateReseed(peer string, f func(byte) byte) (byte, error)
	// SetFromPeer records the peer's own filter toward this cluster, and
	// the ranges it keeps for its other links, as its heartbeat said
	// (Options.FromPeer and Options.Onward read them back).
	SetFromPeer(peer string, f entry.Filter, onward []entry.TargetSpans) error
	// SetOpenStreams records the peer's open streams, as its heartbeat
	// said (Options.OpenOf reads them back).
	SetOpenStreams(peer string, open []entry.StreamID) error
}

// Defaults of Options.Permits and Options.PermitQueue.
const (
	DefaultPermits     = 4
	DefaultPermitQueue = 16
)

// Options configures an Acceptor.
type Options struct {
	// Local is this node's cluster ID. Entries of this origin are dropped.
	Local string
	// Secrets maps each peer cluster to the shared secret it authenticates
	// with. A sender not in the map is refused. SecretPairs, when a
	// cluster is in it, holds its secrets instead: the ones a rotation
	// reloads (secret.Pair; shared with the link's shipper).
	Secrets     map[string]string
	SecretPairs map[string]*secretpkg.Pair
	// Insecure accepts peers without a secret (their header alone names
	// them). For tests and closed networks only; --insecure-peers.
	Insecure bool
	// CertCluster resolves the cluster named by a verified client
	// certificate (mutual TLS); presented is false without one. A verified
	// certificate authenticates the sender instead of its secret.
	CertCluster func(*tls.ConnectionState) (cluster string, presented bool, err error)
	// MaxBodyBytes bounds a batch before decoding. Default 16 MiB.
	MaxBodyBytes int64
	// MaxKeyBytes and MaxValueBytes bound each entry, as for local writes.
	MaxKeyBytes, MaxValueBytes int
	// PinWindow bounds how far an entry's LWW stamp may lie behind its
	// commit HLC (0: unchecked).
	PinWindow time.Duration
	// ObserveLag, when set, is told the replication lag of each entry a
	// batch applied, once per batch: the local physical clock at apply minus
	// the entry's commit HLC, and its stages when the sender said when it
	// sent the batch.
	ObserveLag func(origin string, lags []Lag)
	// ObserveApply, when set, is told how long each applied batch took.
	ObserveApply func(d time.Duration)
	// Now reads the physical clock (nanoseconds) for ObserveLag and acks.
	Now func() int64
	// Version is this build's version, told to senders in every ack.
	Version string
	// Permits bounds the batches applied at once (default 4); PermitQueue
	// bounds the batches waiting for a permit (default 16) and PermitWait
	// how long one waits (default 2s). Past those a batch is refused with
	// 429, source replay_permit_admission, and the sender retries.
	Permits     int
	PermitQueue int
	PermitWait  time.Duration
	// MaxStreams bounds the streams of one peer cluster this node keeps a
	// high-water mark for (default 4096): a peer cannot grow this node's
	// state by inventing streams. A cluster begins a new stream only when
	// it loses data (and each re-seed uses one, forgotten at its end).
	MaxStreams int
	// ConflictValueMax, when set, is the conflict log's value bound the
	// commands this acceptor builds carry (0: none yet, before the log
	// keeps conflicts).
	ConflictValueMax func() int
	// MaxBodies bounds the batches being read at once (default 16): with
	// MaxBodyBytes, the acceptor's memory bound, whatever the number of
	// peers or their pace. Each sender reads at most a quarter of them.
	MaxBodies int
	// Tree, when set, answers peers' anti-entropy requests (ServeTree):
	// it may wait (ctx is the request's) to pace a sender's requests.
	Tree func(ctx context.Context, sender string, req *wire.TreeRequest) (*wire.TreeAnswer, error)
	// TreeCharge, when set, is told the bytes of each tree exchange (the
	// request and its answer) before the answer goes: it charges them to
	// the link's bandwidth limit toward sender, and may wait for it.
	TreeCharge func(ctx context.Context, sender string, n int) error
	// OnReseedRequest, when set, is told that a peer asked for a re-seed
	// (owed true: it lost its data) or no longer needs one (false); the
	// store already says so.
	OnReseedRequest func(sender string, owed bool)
	// OnTrailer, when set, is told that a re-seed from sender ended here:
	// requested says it was one this node asked for (its rejoin moves on),
	// rejoin that it ended the sender's own rejoin.
	OnTrailer func(sender string, requested, rejoin bool)
	// Leadership, when set (a cluster of several nodes), says whether this
	// node takes batches now: only the leader does. A follower refuses an
	// authenticated batch unread with 503 not_leader naming the leader's
	// replicate URL and every node's, and the sender follows.
	Leadership func() (leading bool, leader string, nodes []string)
	// Nodes, when set, lists the replicate URLs of every node of this
	// cluster in each ack, so that senders fail over without
	// configuration.
	Nodes func() []string
	// TakesMarkers, when set, says whether this cluster's log takes
	// filtered markers (every node reads them): the ack's limits say so,
	// and a sender with a filter sends markers only then. Unset: never.
	TakesMarkers func() bool
	// TakesContexts, when set, says whether this cluster's log keeps
	// causal contexts (command format 4); before that, entries' contexts
	// are dropped before they reach the log, whose older members would
	// not read them.
	TakesContexts func() bool
	// TakesExpiry, when set, says whether this cluster's log keeps versions
	// that expire (command format 11); before that, an entry that carries
	// an expiry is refused.
	TakesExpiry func() bool
	// TakesFloors, when set, says whether this cluster's log keeps counter
	// floors (command format 12).
	TakesFloors func() bool
	// TakesOriginFilters, when set, says whether this cluster's log records
	// each sender's filter toward it (command format 7); FromPeer is what
	// it recorded of a peer (nil: nothing). A snapshot's relay of a third
	// cluster's write that cluster's own filter toward this one keeps home
	// is not taken.
	TakesOriginFilters func() bool
	FromPeer           func(peer string) *entry.Filter
	// Onward, beside FromPeer, reads back the ranges the peer keeps for
	// its other links (nil: heartbeats' keeps are not recorded).
	Onward func(peer string) []entry.TargetSpans
	// OnIdle, when set, is told a sender's idle frontier (wire.Header.Idle)
	// once this node's mark of the stream reaches the index it names:
	// nothing older than bound can still come from that stream.
	OnIdle func(sender string, stream entry.StreamID, bound hlc.Timestamp)
	// TakesOpenStreams, when set, says whether this cluster's log records
	// each sender's open streams (command format 14); OpenOf is what it
	// recorded of a peer (nil: nothing).
	TakesOpenStreams func() bool
	OpenOf           func(peer string) []entry.StreamID
	Logger           *slog.Logger
}

// Acceptor serves POST /v1/replicate. Safe for concurrent use.
type Acceptor struct {
	opts  Options
	store Store
	log   Log
	clock Clock

	mu struct {
		sync.Mutex
		counts    map[string]*Counts
		secrets   map[string]*secretpkg.Pair
		permitsOf map[string]int // permits held per sender
		bodies    slots          // bodies being read
		trees     slots          // tree requests being answered
		// arrivals are each sender's requests in progress: a batch that
		// finds a gap waits for them to move (a shipper keeps up to two
		// batches of a stream on the wire).
		arrivals map[string]*arrivals
	}
	refusals struct {
		unauthenticated, forbidden, bad, tooLarge, offset, gap, permit, conflict atomic.Uint64
	}
	permits chan struct{}
	queued  atomic.Int32
	// decomp decodes compressed bodies within MaxBodyBytes decoded.
	decomp *wire.Decompressor
	// logs bounds the lines refused requests log.
	logs refusalLogs
}

// New returns an acceptor that reads st and applies batches through log.
func New(st Store, log Log, clock Clock, opts Options) *Acceptor {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 16 << 20
	}
	if opts.MaxKeyBytes <= 0 {
		opts.MaxKeyBytes = 4096
	}
	if opts.MaxValueBytes <= 0 {
		opts.MaxValueBytes = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Permits <= 0 {
		opts.Permits = DefaultPermits
	}
	if opts.PermitQueue <= 0 {
		opts.PermitQueue = DefaultPermitQueue
	}
	if opts.PermitWait <= 0 {
		opts.PermitWait = 2 * time.Second
	}
	if opts.MaxBodies <= 0 {
		opts.MaxBodies = 16
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = 4096
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().UnixNano() }
	}
	a := &Acceptor{opts: opts, store: st, log: log, clock: clock, permits: make(chan struct{}, opts.Permits),
		decomp: wire.NewDecompressor(opts.MaxBodyBytes)}
	a.mu.counts = map[string]*Counts{}
	a.mu.secrets = map[string]*secretpkg.Pair{}
	a.mu.permitsOf = map[string]int{}
	a.mu.arrivals = map[string]*arrivals{}
	for k, v := range opts.Secrets {
		a.mu.secrets[k] = secretpkg.NewPair(v, "", 0)
	}
	for k, p := range opts.SecretPairs {
		if p != nil {
			a.mu.secrets[k] = p
		}
	}
	return a
}

// Peers lists every cluster this acceptor takes writes from, with or
// without a link back to it.
func (a *Acceptor) Peers() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.mu.secrets))
	for k := range a.mu.secrets {
		out = append(out, k)
	}
	return out
}

// Limits are what this acceptor takes, as acks tell senders.
func (a *Acceptor) Limits() wire.Limits {
	// Two batches of a sender on the wire need two of its permits and two
	// of its body slots; a batch that arrives before the one it follows
	// waits for it (awaitSender) instead of being refused as a gap.
	pipe := min(max(1, a.opts.Permits/2), max(1, a.opts.MaxBodies/4), 2)
	return wire.Limits{MaxBody: a.opts.MaxBodyBytes, MaxKey: a.opts.MaxKeyBytes, MaxValue: a.opts.MaxValueBytes, Pipeline: pipe,
		Markers: a.takesMarkers(), Contexts: a.takesContexts(), OriginFilters: a.takesOriginFilters(),
		// From command format 7 too: a new field goes only to a cluster
		// every node of which reads it (a leader of an older build would
		// refuse the heartbeat).
		IdleFrontiers: a.opts.OnIdle != nil && a.takesOriginFilters(), DeadLists: true, Expiry: a.takesExpiry(), Floors: a.takesFloors(),
		OpenStreams: a.takesOpenStreams()}
}

func (a *Acceptor) takesOriginFilters() bool {
	return a.opts.TakesOriginFilters != nil && a.opts.TakesOriginFilters() && a.opts.FromPeer != nil
}

func (a *Acceptor) takesContexts() bool { return a.opts.TakesContexts != nil && a.opts.TakesContexts() }

func (a *Acceptor) takesExpiry() bool { return a.opts.TakesExpiry != nil && a.opts.TakesExpiry() }
func (a *Acceptor) takesFloors() bool { return a.opts.TakesFloors != nil && a.opts.TakesFloors() }

func (a *Acceptor) takesOpenStreams() bool {
	return a.opts.TakesOpenStreams != nil && a.opts.TakesOpenStreams() && a.opts.OpenOf != nil
}

func (a *Acceptor) takesMarkers() bool { return a.opts.TakesMarkers != nil && a.opts.TakesMarkers() }

// SetPair allows a peer cluster with its secrets (a peer added at run
// time: links.Set), or replaces them.
func (a *Acceptor) SetPair(cluster string, p *secretpkg.Pair) {
	a.mu.Lock()
	a.mu.secrets[cluster] = p
	a.mu.Unlock()
}

// RemovePeer takes nothing more from a cluster (a peer removed at run
// time): its requests are refused as unauthenticated.
func (a *Acceptor) RemovePeer(cluster string) {
	a.mu.Lock()
	delete(a.mu.secrets, cluster)
	a.mu.Unlock()
}

// SetPeer allows (or updates) a peer cluster and its secret: peers found by
// gossip whose secret is configured.
func (a *Acceptor) SetPeer(cluster, secret string) {
	a.mu.Lock()
	if p, ok := a.mu.secrets[cluster]; !ok {
		a.mu.secrets[cluster] = secretpkg.NewPair(secret, "", 0)
	} else if send, _ := p.Send(); send != secret && p.Also(a.opts.Now()) != secret {
		p.Set(secret, "", 0)
	}
	a.mu.Unlock()
}
