// Package httpapi is a node's HTTP surface: the client API (/v1/...), the
// admin endpoints and the dashboard. Every handler decodes a request, calls
// the node's Go API and renders its answer; it decides nothing a node
// decides. The node it serves is the Node interface declared here, so the
// package depends on the API's words (package api), not on package node,
// which composes it: node owns the listeners, TLS, the token and the
// forwarding of requests to its cluster's leader, and wraps this handler in
// them.
package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// Reader is what the read endpoints ask of a node.
type Reader interface {
	ClusterID() string
	Ready() error
	Get(key string) (entry.Record, error)
	Scan(o api.ScanOptions) ([]api.Item, string, error)
	Counter(key string) (api.CounterResult, error)
	Idempotency(key string) (api.IdemReport, error)
}

// Writer is what the write endpoints ask of a node: one write, with its
// idempotency key and precondition.
type Writer interface {
	Propose(ctx context.Context, w api.Write) (api.WriteResult, error)
	// Holding names the peer clusters that hold the writes from index
	// from to index to of stream, as their links' acknowledgements say
	// (the leader's).
	Holding(stream entry.StreamID, from, to uint64) ([]string, error)
}

// Links is what the link endpoints ask of a node.
type Links interface {
	PeerStatus() []api.LinkStatus
	PausePeer(peer string) error
	ResumePeer(peer string) error
	ReseedPeer(peer string) error
	DetachPeer(peer string) error
	PeersReport() api.PeersReport
	Lag(since time.Time) api.LagReport
	History(after time.Time) api.HistoryReport
}

// DeadLetters is what the dead letters' endpoints ask (package links).
type DeadLetters interface {
	DeadLetters() ([]api.DeadLetterReport, error)
	ReplayDeadLetter(id string) error
	DiscardDeadLetter(id string) error
}

// LinkSettings is what the endpoints of a link's filter and bandwidth ask
// (package links' Settings).
type LinkSettings interface {
	LinkFilter(peer string) (api.FilterReport, error)
	SetLinkFilter(peer string, f entry.Filter) (api.FilterReport, error)
	// ReleaseLinkFilter declares the link's narrowing permanent: the
	// tombstones kept for a widening go.
	ReleaseLinkFilter(peer string) (api.FilterReport, error)
	LinkBandwidth(peer string) (api.BandwidthReport, error)
	SetLinkBandwidth(peer string, bytesPerSec int64) (api.BandwidthReport, error)
	LinkCompression(peer string) (api.CompressionReport, error)
	SetLinkCompression(peer, compression string) (api.CompressionReport, error)
	// AddPeer and RemovePeer add and remove a peer at run time, through
	// the cluster's log; Peer is what the log holds of one (no secret).
	AddPeer(name string, urls []string, secret string) (api.PeerReport, error)
	RemovePeer(name string) (api.PeerReport, error)
	Peer(name string) (api.PeerReport, error)
}

// Reports is what the node's other admin endpoints ask of it.
type Reports interface {
	DigestReport(prefixes ...string) (api.DigestReport, error)
	WALReport() api.WALReport
	OriginReport() api.OriginReport
	ClusterReport(ctx context.Context) api.ClusterReport
	// LocalCluster is what this node alone knows of its cluster (what
	// ClusterReport asks each node).
	LocalCluster() api.ClusterReport
	JoinNode(id, raftAddr, force string) error
	RemoveNode(id string) error
}

// Conflicts is what the conflict log's endpoints ask of a node.
type Conflicts interface {
	Conflicts(q api.ConflictQuery) (api.ConflictPage, error)
	RestoreConflict(ctx context.Context, id string) (api.WriteResult, error)
}

// Tree is what anti-entropy's endpoints ask of a node (package
// antientropy's runner): a comparison with a peer, which repairs what this
// cluster lacks when asked (docs/ANTIENTROPY.md; the leader runs it), and
// the rebuild of the kept hashes, which runs on the node addressed (it
// keeps its own).
type Tree interface {
	Diff(ctx context.Context, peer string, repair bool) (api.DiffReport, error)
	RebuildTree(ctx context.Context) (api.TreeRebuild, error)
}

// PathTreeRebuild is the endpoint that rebuilds a node's kept hashes.
const PathTreeRebuild = "/admin/tree/rebuild"

// Node is the node the API serves.
type Node interface {
	Reader
	Writer
	Links
	Reports
}

// Options configure the API.
type Options struct {
	// MaxKeyBytes and MaxValueBytes bound a key and a value (the node
	// checks them again); MaxBatchBytes bounds a batch request's body.
	MaxKeyBytes   int
	MaxValueBytes int
	MaxBatchBytes int
	// Peer serves the peer endpoint (/v1/replicate and the proof) on this
	// handler; nil when it has a listener of its own.
	Peer http.Handler
	// Metrics serves /metrics.
	Metrics http.Handler
	// Pprof serves /debug/pprof (the node asks for it only behind a
	// token).
	Pprof bool
	// Tree compares with peers and rebuilds the node's kept hashes;
	// Conflicts reads and restores the conflict log. nil: not served.
	Tree      Tree
	Conflicts Conflicts
	// Settings answers the endpoints of links' filters and bandwidth;
	// DeadLetters those of the dead letters.
	Settings    LinkSettings
	DeadLetters DeadLetters
	// Backup streams a consistent copy of the node's data (a tar: package
	// backup) for GET /admin/backup; nil: not served.
	Backup func(ctx context.Context, w io.Writer) error
	// Caller names who sent a request, for the logs of admin actions.
	Caller func(*http.Request) string
	Logger *slog.Logger
	// Now is the node's clock (wall ns): a TTL counts from it (nil: the
	// system clock).
	Now func() int64
}

// API serves a node over HTTP.
type API struct {
	node Node
	opts Options
	log  *slog.Logger
}

// New returns the API of a.
func New(n Node, o Options) *API {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Caller == nil {
		o.Caller = func(r *http.Request) string { return r.RemoteAddr }
	}
	return &API{node: n, opts: o, log: o.Logger}
}
