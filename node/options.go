package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/groups"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/faults"
	"github.com/replicator/replicator/links"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/rejoin"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
)

// Options configures a node. The zero value of a field means its default;
// Open copies the options before use.
type Options struct {
	// ClusterID is shorthand for Origin: origin.Static(ClusterID). Exactly
	// one of the two must be set.
	ClusterID string
	// Origin resolves the cluster ID (static, env, file, hostname, custom).
	Origin origin.Resolver
	// ReassignOrigin lets a data directory pinned to another cluster ID be
	// taken over (logged). Off by default: a node refuses to start instead.
	ReassignOrigin bool

	// DataDir holds CLUSTER_ID, NODE_ID, store/ (Pebble) and cluster/
	// (the raft log and its snapshots).
	DataDir string
	// NodeID names this node within its cluster (--node-id). Default: the
	// ID the data directory was given at its first start (minted then). A
	// data directory keeps its ID: another one is refused.
	NodeID string
	// Raft, when set, makes this node one of several nodes of its cluster,
	// which share one raft log over the raft port (docs/CLUSTER.md). Unset,
	// the node is a group of one, as every cluster was before.
	Raft *RaftOptions
	// Groups is the cluster's number of raft groups (--groups, 1 to 64;
	// default 1): keys are spread over them by slot, each group with its
	// own leader (docs/CLUSTER.md "Several raft groups per cluster"). Every
	// node of a cluster is started with the same number, which group 0's
	// log records when the cluster forms.
	Groups int
	// Listen is the HTTP API address. Default 127.0.0.1:7400; ":0" picks a
	// free port (see Node.Addr).
	Listen string
	// Listener, when set, is used instead of listening on Listen (so that
	// peers' addresses can be known before their nodes open).
	Listener net.Listener
	// PeerListen, when set, serves the peer endpoint (/v1/replicate) on its
	// own address, so that replication can sit behind mutual TLS while the
	// client API does not; the API listener then does not serve it.
	PeerListen   string
	PeerListener net.Listener
	// RESPListen, when set, serves the Redis-protocol front door there
	// (docs/RESP.md), with the API's TLS settings and token; RESPListener
	// is a listener to use instead. Off by default.
	RESPListen   string
	RESPListener net.Listener

	// TLSCert and TLSKey (PEM files) serve the listeners over TLS and are
	// the client certificate the shippers present to peers.
	TLSCert, TLSKey string
	// TLSClientCA (PEM file) verifies peers' client certificates: mutual TLS
	// on links. A verified certificate names the sender's cluster (see
	// PeerSANMode) and replaces the shared secret; on PeerListen it is
	// required.
	TLSClientCA string
	// PeerCA (PEM file) verifies peers' server certificates. Default
	// TLSClientCA.
	PeerCA string
	// HistoryInterval is how often the dashboard's history samples every
	// link's backlog (default 5s); HistorySpan how far back it keeps them
	// (default 1h).
	HistoryInterval, HistorySpan time.Duration
	// BuildVersion is told to peers in acks and shown in /admin/origin and
	// replicator_build_info. Default: the package's Version.
	BuildVersion string
	// TLSReloadInterval is how often the certificate files are checked for
	// a change (reloaded then; SIGHUP reloads at once). Default 10s.
	TLSReloadInterval time.Duration
	// PeerSANMode is how a peer certificate names its cluster: "uri"
	// (default: URI SAN replicator://cluster/<id>) or "dns" (first label of
	// the first DNS SAN).
	PeerSANMode string
	// Gossip, when set, finds peers through hashicorp/memberlist: a member
	// of a cluster whose secret is configured (a Peer without URL) is
	// shipped to at the replicate address it gossips; a static Peer URL
	// wins. A member of an unknown cluster is shown, not shipped to.
	Gossip *GossipOptions
	// APIToken, when set, is required as "Authorization: Bearer <token>" by
	// the client API and /metrics (not /healthz, /readyz), and by the admin
	// endpoints when AdminToken is empty (a warning at start says so).
	APIToken string
	// AdminToken, when set, is required by the admin endpoints (/admin/*:
	// membership, peers, detach, the dashboard's data) instead of the API
	// token, which then opens none of them (issue 25: one credential for
	// data and admin alike let every client join and remove nodes).
	AdminToken string

	// MaxKeyBytes bounds keys. Default 4096.
	MaxKeyBytes int
	// MaxValueBytes bounds values. Default 1 MiB.
	MaxValueBytes int

	// TombstoneRetention is how long a delete's tombstone is kept at least.
	// Default 24h.
	TombstoneRetention time.Duration
	// ConflictRetention is how long the conflict log keeps a record, and
	// ConflictMaxBytes how large it may grow before the oldest records
	// go (each dropped counts); ConflictValueMax is the largest lost value
	// a record keeps whole (a larger one: its length and hash). The leader
	// puts them in the cluster's log (collect and inbound commands), so
	// every node keeps the same records. Defaults 168h, 64 MiB, 4 KiB.
	ConflictRetention time.Duration
	ConflictMaxBytes  int64
	ConflictValueMax  int
	// GCInterval is how often tombstones past retention are collected.
	// Default 1 minute.
	GCInterval time.Duration
	// AntiEntropyInterval is how often the leader compares the cluster's
	// tree with each peer's (docs/ANTIENTROPY.md); negative: never (only
	// by command). AntiEntropyRepair makes each pass pull what this
	// cluster lacks. AntiEntropyBandwidth bounds the bytes a background
	// pass exchanges per second with a peer (a command's comparison runs
	// at the link's own limit). Defaults 10m, off, 4 MiB/s.
	AntiEntropyInterval  time.Duration
	AntiEntropyRepair    bool
	AntiEntropyBandwidth int64
	// AntiEntropyCPU is the share of one core a background comparison
	// keeps busy at most, on each side: after each request it pauses so
	// that the request's time is at most this share of the pass (a peer's
	// answer is timed here, the network with it). 1: no pause. Default
	// 0.25.
	AntiEntropyCPU float64
	// MaxClockOffset bounds how far ahead of the local clock a remote stamp
	// may be. Default 500ms.
	MaxClockOffset time.Duration

	// MaxGroupEntries bounds how many writes share one WAL append and fsync.
	// Default 1024.
	MaxGroupEntries int
	// MemTableSize is Pebble's memtable size (default 64 MiB): larger means
	// fewer flushes and compactions under heavy ingest, and more memory.
	MemTableSize uint64
	// CacheSize is Pebble's block cache in bytes (default 256 MiB): the
	// index, filter and data blocks reads and the write path's read of a
	// key's previous version find in memory. Below the tree's working set,
	// each lookup reads blocks from the file system (docs/PERFORMANCE.md).
	CacheSize int64
	// VersionCacheKeys is store.Options.VersionCacheKeys (default 262,144; negative: none).
	VersionCacheKeys int
	// WALSegmentSize is the segment file size of the cluster's log (package
	// wal). Default 4 MiB.
	WALSegmentSize int
	// UnsafeNoSync skips every fsync. It gives up durability: benchmarks
	// of CPU cost only.
	UnsafeNoSync bool

	// Peers are the clusters this node replicates with (a full mesh: each
	// ships its own writes to every peer).
	Peers []Peer
	// InsecurePeers allows peers without a secret. Off by default: a peer
	// without one is a configuration error.
	InsecurePeers bool
	// SecretsKey (32 bytes, the same at every node of the cluster) seals
	// the secrets of peers added at run time in the cluster's log
	// (--secrets-key-file; none: only peers without a secret may be).
	SecretsKey []byte
	// MaxBatchEntries, MaxBatchBytes and BatchLinger bound outgoing
	// batches (defaults 2048, 4 MiB, no linger: see transport.Options.Linger).
	MaxBatchEntries int
	MaxBatchBytes   int
	BatchLinger     time.Duration
	// MaxReplicateBytes bounds an incoming batch before decoding. Default
	// 16 MiB.
	MaxReplicateBytes int64
	// PinWindow is how far behind its commit clock a write's LWW stamp may
	// be (a caller-pinned idempotency stamp). Tombstones are kept until no
	// write that old can still arrive. Default 1h; never above
	// TombstoneRetention.
	PinWindow time.Duration
	// IdempotencyWindow is how long an Idempotency-Key's record is kept
	// (and a retry under it replays the recorded answer). It must exceed
	// the callers' whole retry budget, and may not exceed TombstoneRetention.
	// Default 24h, or TombstoneRetention when that is shorter.
	IdempotencyWindow time.Duration
	// TruncateInterval is how often the WAL is cut back to what every peer
	// acknowledged. Default 1s.
	TruncateInterval time.Duration
	// WaterMarks bound each peer link's backlog (defaults: high 2,000,000
	// entries, 1 GiB, 1h; low half of each). See WaterMarks.
	WaterMarks api.WaterMarks
	// AdmissionWait is how long a local write waits for a saturated node
	// to clear before it is refused. Default 5s; negative refuses at once.
	AdmissionWait time.Duration
	// Permits, PermitQueue and PermitWait bound incoming batches applied at
	// once (defaults 4, 16, 2s).
	Permits     int
	PermitQueue int
	PermitWait  time.Duration
	// NoAutoReseed leaves peers that need a re-seed marked until an
	// operator asks (POST /admin/peers/{name}/reseed).
	NoAutoReseed bool
	// IdentityCheckWait is how long writes wait at start, when the node
	// reopens a stream that existed before, for every linked peer to answer
	// once: a peer holding entries of the stream that the WAL does not
	// (a restored or copied data directory) is then noticed before an index
	// is reused. Default 2s; negative does not wait.
	IdentityCheckWait time.Duration
	// LinkLagging and LinkStalled classify peer links (defaults 5s, 60s).
	LinkLagging, LinkStalled time.Duration
	// PeerTransport replaces the HTTP transport of outgoing batches (tests
	// wrap it to lose, delay or duplicate them).
	PeerTransport http.RoundTripper
	// ObserveLag, when set, is told the replication lag of every entry
	// applied from a peer (benchmarks record exact percentiles with it).
	ObserveLag func(origin string, lag time.Duration)

	// MinBodyRate is the slowest a request body may arrive, in bytes per
	// second, after BodyGrace (defaults 64 KiB/s and 10s: a 16 MiB batch
	// at 1 MiB/s is fine, a trickle is cut); negative disables it.
	MinBodyRate int64
	BodyGrace   time.Duration
	// MaxConnections bounds the connections each listener holds at once
	// (default 512); more wait to be accepted. Negative: no bound.
	MaxConnections int
	// MaxBodiesInFlight bounds the replication batches being read at once
	// (default 16, of MaxReplicateBytes each: the acceptor's memory bound),
	// and each peer may read at most a quarter of them.
	MaxBodiesInFlight int

	// PprofListen serves net/http/pprof on a listener of its own (keep it
	// private: it has no token).
	PprofListen string
	// Pprof serves net/http/pprof under /debug/pprof on the API listener
	// (behind the API token when one is set).
	Pprof bool
	// Testing holds the faults the robustness suites inject into a real
	// process. Neither the configuration file nor a flag reaches it: cmd
	// fills it from REPLICATOR_TESTING_* environment variables only
	// (TestingFromEnv), so an operator's configuration cannot turn a fault on.
	Testing Testing

	// Clock is the physical clock. Default the system clock. Tests pass a
	// manual clock; robustness runs an offset clock.
	Clock hlc.PhysicalClock
	// Logger is the node's logger. Default slog.Default().
	Logger *slog.Logger
}

// DefaultOptions returns options with every default filled in except the
// cluster identity and data directory, which have none.
func DefaultOptions() *Options {
	o := &Options{}
	o.EnsureDefaults()
	return o
}

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7400"
	}
	if o.MaxKeyBytes == 0 {
		o.MaxKeyBytes = 4096
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = 1 << 20
	}
	if o.TombstoneRetention == 0 {
		o.TombstoneRetention = 24 * time.Hour
	}
	if o.ConflictRetention == 0 {
		o.ConflictRetention = 168 * time.Hour
	}
	if o.ConflictMaxBytes == 0 {
		o.ConflictMaxBytes = 64 << 20
	}
	if o.ConflictValueMax == 0 {
		o.ConflictValueMax = machine.ConflictValueMax
	}
	if o.Testing.GCInterval > 0 {
		o.GCInterval = o.Testing.GCInterval
	}
	if o.GCInterval == 0 {
		o.GCInterval = time.Minute
	}
	if o.AntiEntropyInterval == 0 {
		o.AntiEntropyInterval = 10 * time.Minute
	}
	if o.AntiEntropyCPU == 0 {
		o.AntiEntropyCPU = 0.25
	}
	if o.AntiEntropyBandwidth == 0 {
		o.AntiEntropyBandwidth = 4 << 20
	}
	if o.MaxClockOffset == 0 {
		o.MaxClockOffset = hlc.DefaultMaxOffset
	}
	if o.Groups == 0 {
		o.Groups = 1
	}
	if o.MaxGroupEntries == 0 {
		o.MaxGroupEntries = 1024
	}
	if o.WALSegmentSize == 0 {
		o.WALSegmentSize = 4 << 20
	}
	if o.MaxReplicateBytes == 0 {
		o.MaxReplicateBytes = 16 << 20
	}
	if o.PinWindow == 0 {
		o.PinWindow = time.Hour
	}
	if o.IdempotencyWindow == 0 {
		// At most the tombstone retention (Validate says why).
		o.IdempotencyWindow = min(24*time.Hour, o.TombstoneRetention)
	}
	if o.TruncateInterval == 0 {
		o.TruncateInterval = time.Second
	}
	wm := &o.WaterMarks
	if wm.HighEntries == 0 {
		wm.HighEntries = 2_000_000
	}
	if wm.LowEntries == 0 {
		wm.LowEntries = wm.HighEntries / 2
	}
	if wm.HighBytes == 0 {
		wm.HighBytes = 1 << 30
	}
	if wm.LowBytes == 0 {
		wm.LowBytes = wm.HighBytes / 2
	}
	if wm.HighAge == 0 {
		wm.HighAge = time.Hour
	}
	if wm.LowAge == 0 {
		wm.LowAge = wm.HighAge / 2
	}
	if o.AdmissionWait == 0 {
		o.AdmissionWait = 5 * time.Second
	}
	if o.HistoryInterval == 0 {
		o.HistoryInterval = 5 * time.Second
	}
	if o.HistorySpan == 0 {
		o.HistorySpan = time.Hour
	}
	if o.BuildVersion == "" {
		o.BuildVersion = Version
	}
	if o.TLSReloadInterval == 0 {
		o.TLSReloadInterval = 10 * time.Second
	}
	if o.MinBodyRate == 0 {
		o.MinBodyRate = 64 << 10
	}
	if o.BodyGrace == 0 {
		o.BodyGrace = 10 * time.Second
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = 512
	}
	if o.MaxBodiesInFlight == 0 {
		o.MaxBodiesInFlight = 16
	}
	if o.IdentityCheckWait == 0 {
		o.IdentityCheckWait = rejoin.DefaultIdentityCheckWait
	}
	if o.LinkLagging == 0 {
		o.LinkLagging = 5 * time.Second
	}
	if o.LinkStalled == 0 {
		o.LinkStalled = time.Minute
	}
	if o.Clock == nil && o.Testing.ClockOffset != 0 {
		o.Clock = hlc.OffsetClock{Base: hlc.SystemClock{}, Offset: o.Testing.ClockOffset}
	}
	if o.Clock == nil {
		o.Clock = hlc.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	// The sub-packages' own defaults, filled here so that a caller (cmd's
	// `serve -h` and --print-config) reads every default from node alone.
	so := transport.Options{}
	so.EnsureDefaults()
	if o.MaxBatchEntries == 0 {
		o.MaxBatchEntries = so.MaxBatchEntries
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = so.MaxBatchBytes
	}
	if o.Permits == 0 {
		o.Permits = acceptor.DefaultPermits
	}
	if o.PermitQueue == 0 {
		o.PermitQueue = acceptor.DefaultPermitQueue
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = store.DefaultOptions().MemTableSize
	}
	if o.CacheSize == 0 {
		o.CacheSize = store.DefaultOptions().CacheSize
	}
	if o.VersionCacheKeys == 0 {
		o.VersionCacheKeys = store.DefaultOptions().VersionCacheKeys
	}
	if o.Raft != nil && o.Raft.ElectionTimeout == 0 {
		o.Raft.ElectionTimeout = time.Second
	}
}

// Validate reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("node: "+format, args...)) }
	switch {
	case o.ClusterID == "" && o.Origin == nil:
		add("a cluster identity is required (--cluster-id or --origin)")
	case o.ClusterID != "" && o.Origin != nil:
		add("give either a cluster ID or an origin resolver, not both")
	case o.ClusterID != "":
		if err := origin.Validate(o.ClusterID); err != nil {
			errs = append(errs, fmt.Errorf("node: --cluster-id: %w", err))
		}
	}
	if o.DataDir == "" {
		add("a data directory is required (--data)")
	}
	if o.MaxKeyBytes < 1 || o.MaxKeyBytes > 1<<16 {
		add("MaxKeyBytes %d out of range [1, 65536]", o.MaxKeyBytes)
	}
	if o.MaxValueBytes < 0 || o.MaxValueBytes > 64<<20 {
		add("MaxValueBytes %d out of range [0, 64 MiB]", o.MaxValueBytes)
	}
	// The floor of the retentions: a robustness run collects within
	// seconds (Testing.ShortRetention), an operator never below a minute.
	floor := time.Minute
	if o.Testing.ShortRetention {
		floor = time.Second
	}
	if o.TombstoneRetention < floor {
		add("TombstoneRetention %s is below %s", o.TombstoneRetention, floor)
	}
	if o.ConflictRetention < time.Minute {
		add("ConflictRetention %s is below 1m", o.ConflictRetention)
	}
	if o.ConflictMaxBytes < 64<<10 {
		add("ConflictMaxBytes %d is below 64 KiB", o.ConflictMaxBytes)
	}
	if o.ConflictValueMax < 1 || o.ConflictValueMax > 1<<20 {
		add("ConflictValueMax %d out of range [1, 1 MiB]", o.ConflictValueMax)
	}
	if o.AntiEntropyInterval > 0 && o.AntiEntropyInterval < time.Second {
		add("AntiEntropyInterval %s is below 1s (negative: no background pass)", o.AntiEntropyInterval)
	}
	if !(o.AntiEntropyCPU > 0 && o.AntiEntropyCPU <= 1) {
		add("AntiEntropyCPU %v is not in (0, 1]", o.AntiEntropyCPU)
	}
	if o.AntiEntropyBandwidth < 1024 {
		add("AntiEntropyBandwidth %d bytes/s is below 1024", o.AntiEntropyBandwidth)
	}
	if o.GCInterval <= 0 {
		add("GCInterval %s must be positive", o.GCInterval)
	}
	if o.HistoryInterval <= 0 || o.HistorySpan < o.HistoryInterval || o.HistorySpan/o.HistoryInterval > 100_000 {
		add("HistoryInterval %s and HistorySpan %s: want a positive interval and at most 100000 samples", o.HistoryInterval, o.HistorySpan)
	}
	if o.TLSReloadInterval < 0 {
		add("TLSReloadInterval %s must be positive (--tls-reload-interval)", o.TLSReloadInterval)
	}
	if o.MaxClockOffset <= 0 {
		add("MaxClockOffset %s must be positive", o.MaxClockOffset)
	}
	if o.Groups < 1 || o.Groups > groups.MaxGroups {
		add("--groups %d out of range [1, %d]", o.Groups, groups.MaxGroups)
	}
	if o.Groups > 1 && len(o.Peers) > 0 {
		add("--groups %d with peers: a cluster of several raft groups does not replicate to peers yet (docs/CLUSTER.md)", o.Groups)
	}
	if o.MaxGroupEntries < 1 {
		add("MaxGroupEntries %d is below 1", o.MaxGroupEntries)
	}
	if o.PinWindow <= 0 || o.PinWindow > o.TombstoneRetention {
		add("PinWindow %s must be positive and at most TombstoneRetention %s", o.PinWindow, o.TombstoneRetention)
	}
	if wm := o.WaterMarks; wm.LowEntries > wm.HighEntries || wm.LowBytes > wm.HighBytes || wm.LowAge > wm.HighAge {
		add("a low-water mark is above its high-water mark: %+v", wm)
	}
	if o.IdempotencyWindow > o.TombstoneRetention {
		// A retry whose record exists is answered from it without a look at
		// its pinned stamp: a record that outlived the tombstone of a later
		// delete could let a retried write's old stamp back in.
		add("IdempotencyWindow %s must be at most TombstoneRetention %s", o.IdempotencyWindow, o.TombstoneRetention)
	}
	if o.IdempotencyWindow < floor {
		add("IdempotencyWindow %s is below %s", o.IdempotencyWindow, floor)
	}
	if o.PeerSANMode != "" && o.PeerSANMode != SANModeURI && o.PeerSANMode != SANModeDNS {
		add("PeerSANMode %q, want uri or dns", o.PeerSANMode)
	}
	if o.Pprof && o.APIToken == "" {
		add("--pprof serves profiles on the API listener and needs an API token (--api-token-file); or give --pprof-listen a private address")
	}
	if o.LinkStalled < o.LinkLagging {
		add("LinkStalled %s is below LinkLagging %s", o.LinkStalled, o.LinkLagging)
	}
	if o.NodeID != "" {
		if err := origin.Validate(o.NodeID); err != nil {
			errs = append(errs, fmt.Errorf("node: --node-id: %w", err))
		}
	}
	if r := o.Raft; r != nil {
		switch {
		case r.Listen == "":
			add("a node of a cluster of several needs a raft port (--raft-listen)")
		case r.BootstrapExpect < 0:
			add("--bootstrap-expect %d is negative", r.BootstrapExpect)
		case o.Gossip == nil:
			add("a node of a cluster of several finds the others, and the leader's API, by gossip (--gossip-bind and --join)")
		case o.Gossip.APIURL == "" && unspecifiedHost(o.Listen) && o.Listener == nil:
			add("--listen %s is every address: give --advertise-api, the URL the cluster's other nodes reach this node's API at", o.Listen)
		case o.Gossip.ReplicateURL == "" && o.PeerListen != "" && unspecifiedHost(o.PeerListen):
			add("--peer-listen %s is every address: give --advertise-replicate, the URL peers reach it at", o.PeerListen)
		}
		if r.ElectionTimeout < 100*time.Millisecond {
			add("--raft-election-timeout %s is below 100ms", r.ElectionTimeout)
		}
		if r.SnapshotInterval < 0 || (r.SnapshotInterval > 0 && r.SnapshotInterval < 10*time.Millisecond) {
			add("Raft.SnapshotInterval %s: 0 (30s) or at least 10ms", r.SnapshotInterval)
		}
		if _, err := o.raftCredentials(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, links.ValidatePeers(o.Peers, o.ClusterID, o.Gossip != nil, o.InsecurePeers || o.TLSClientCA != "")...)
	return errors.Join(errs...)
}

// unspecifiedHost reports a listen address of every interface (":7400",
// "0.0.0.0:7400", "[::]:7400"), which no other node can dial.
func unspecifiedHost(hostport string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return h == "" || (ip != nil && ip.IsUnspecified())
}

// RaftOptions configure a node of a cluster of several nodes.
type RaftOptions struct {
	// Listen is the raft port (--raft-listen); Advertise the address the
	// other nodes dial (default: the bound one).
	Listen, Advertise string
	// BootstrapExpect is how many nodes form a new cluster (--bootstrap-
	// expect): once that many fresh nodes of the cluster are seen by
	// gossip, the one with the lowest ID bootstraps it with all of them.
	// 0: this node never bootstraps; it waits to be added.
	BootstrapExpect int
	// ElectionTimeout bounds how long followers wait without hearing from
	// a leader before they elect another (default 1s: raft's heartbeat
	// timeout is half of it, and a follower campaigns after one to two of
	// those; the leader lease is a quarter).
	ElectionTimeout time.Duration
	// SnapshotThreshold and TrailingLogs: a snapshot (a checkpoint of the
	// tree) is taken and the log compacted once SnapshotThreshold commands
	// were applied since the last one (checked every SnapshotInterval,
	// default 30 s), keeping the last TrailingLogs commands for followers
	// that lag (defaults 4096 and 4096); one further behind gets the snapshot.
	SnapshotThreshold, TrailingLogs uint64
	SnapshotInterval                time.Duration
	// Key is the cluster's own raft key (--raft-key-file, issue 25): the
	// raft port's CA derives from it and the cluster ID, so that a gossip
	// key shared by the clusters of a mesh lets no other cluster in.
	// AcceptGossipKey also shows and takes the gossip key's credential
	// (the older scheme), while the cluster moves to the raft key.
	Key             []byte
	AcceptGossipKey bool
}

// GossipOptions configure peer discovery.
type GossipOptions struct {
	Bind      string   // host:port (UDP and TCP)
	Advertise string   // host:port others reach this node at (default Bind)
	Join      []string // seeds, host:port
	Key       []byte   // memberlist encryption key (16, 24 or 32 bytes)
	// Profile is memberlist's timing: "wan", "lan" or "local"; empty picks
	// local on a loopback bind address and wan otherwise.
	Profile string
	// Advertise addresses of this node's API and replicate endpoints
	// (default: derived from the bound listeners).
	APIURL, ReplicateURL string
}

// Peer is one peer cluster (package links).
type Peer = links.Peer

func (o *Options) resolver() origin.Resolver {
	if o.Origin != nil {
		return o.Origin
	}
	return origin.Static(o.ClusterID)
}

// Testing are faults a test injects (package faults).
type Testing = faults.Faults

// TestingEnvPrefix begins the environment variables TestingFromEnv reads.
const TestingEnvPrefix = faults.EnvPrefix

// TestingFromEnv reads the faults of a robustness suite from the
// environment of a child process it started (faults.FromEnv).
func TestingFromEnv(getenv func(string) string) (Testing, error) { return faults.FromEnv(getenv) }
