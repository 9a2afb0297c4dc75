package node

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"net/http/pprof"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// Admin paths. Each handler is a thin wrapper over a method that returns a
// struct, so tests and the CLI see exactly what the endpoint serves.
const (
	pathAdminPeers  = "/admin/peers"
	pathAdminDigest = "/admin/digest"
	pathAdminWAL    = "/admin/wal"
	pathAdminOrigin = "/admin/origin"
	pathReplicate   = "/v1/replicate"
)

// PeersReport is GET /admin/peers.
type PeersReport struct {
	Cluster  string                     `json:"cluster"`
	Links    []client.LinkStatus        `json:"links"`
	Incoming map[string]acceptor.Counts `json:"incoming"`
	Refusals map[string]uint64          `json:"refusals"`
	Streams  []StreamReport             `json:"streams"`
	// Members are the nodes known through gossip, with their liveness and
	// whether they are shipped to.
	Members []transport.Member `json:"members,omitempty"`
	// Rejoin is this node's rejoin after losing data, and the peers that
	// asked it for a re-seed or whose rejoin it waits to end.
	Rejoin RejoinReport `json:"rejoin"`
}

// StreamReport is what this node applied of one peer stream (persisted).
type StreamReport struct {
	Origin string `json:"origin"`
	Stream string `json:"stream"`
	HWM    uint64 `json:"hwm"`
	// Merged entries went through an LWW merge; with DeadLettered and
	// Seeded it sums to HWM unless an entry was applied twice.
	Merged       uint64 `json:"merged"`
	DeadLettered uint64 `json:"dead_lettered"`
	// Seeded entries were covered by a re-seed's snapshot instead.
	Seeded uint64 `json:"seeded"`
	// Frontier is the commit HLC of the last applied entry.
	Frontier string `json:"frontier"`
}

// PeersReport reports outgoing links and what came in from each peer.
func (n *Node) PeersReport() PeersReport {
	r := PeersReport{
		Cluster:  n.cluster,
		Links:    n.PeerStatus(),
		Incoming: n.acceptor.Counts(),
		Refusals: n.acceptor.Refusals(),
		Streams:  []StreamReport{},
		Members:  n.Members(),
		Rejoin:   n.rejoinReport(),
	}
	hwms, err := n.store.HWMs()
	if err != nil {
		n.log.Warn("reading high-water marks", "err", err)
	}
	for _, h := range hwms {
		r.Streams = append(r.Streams, StreamReport{Origin: h.Origin, Stream: entry.StreamID(h.Stream).String(),
			HWM: h.Index, Merged: h.Merged, DeadLettered: h.DeadLettered, Seeded: h.Seeded, Frontier: h.Commit.String()})
	}
	return r
}

// DigestReport is GET /admin/digest.
type DigestReport struct {
	Cluster    string `json:"cluster"`
	Digest     string `json:"digest"`
	Keys       int    `json:"keys"`
	Tombstones int    `json:"tombstones"`
}

// DigestReport hashes the live state.
func (n *Node) DigestReport() (DigestReport, error) {
	d, err := n.Digest()
	if err != nil {
		return DigestReport{}, err
	}
	return DigestReport{Cluster: n.cluster, Digest: d.Hash, Keys: d.Keys, Tombstones: d.Tombstones}, nil
}

// WALReport is GET /admin/wal: the outbound WAL, each peer's backlog in it,
// the node's saturation, and the replay permits of incoming batches.
type WALReport struct {
	Stream        string               `json:"stream"`
	First         uint64               `json:"first_index"`
	Last          uint64               `json:"last_index"`
	Applied       uint64               `json:"applied_index"`
	Bytes         int64                `json:"bytes"`
	Segments      int                  `json:"segments"`
	Repairs       int64                `json:"torn_tail_repairs"`
	DroppedBytes  int64                `json:"torn_tail_dropped_bytes"`
	WriteFailures int64                `json:"write_failures"`
	Writes        uint64               `json:"writes"`
	Groups        uint64               `json:"commit_groups"`
	Peers         []PeerBacklog        `json:"peers"`
	Saturation    SaturationReport     `json:"saturation"`
	Permits       acceptor.PermitStats `json:"permits"`
	Refusals      map[string]uint64    `json:"refusals_by_source"`
}

// PeerBacklog is one peer's share of the WAL.
type PeerBacklog struct {
	Peer             string  `json:"peer"`
	Acked            uint64  `json:"acked_index"`
	Entries          uint64  `json:"backlog_entries"`
	Bytes            int64   `json:"backlog_bytes"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Overflow         string  `json:"overflow"`
	State            string  `json:"state"`
	Retained         bool    `json:"wal_retained"`
}

// WALReport describes the outbound WAL.
func (n *Node) WALReport() WALReport {
	st := n.group.LogStats()
	first := n.out.First()
	r := WALReport{
		Stream: n.out.Stream().String(), First: first, Last: n.out.Last(), Applied: n.applied.Load(),
		Bytes: n.out.BytesAfter(first - 1), Segments: st.Segments, Repairs: st.Repairs, DroppedBytes: st.DroppedBytes,
		WriteFailures: st.WriteFailures, Writes: n.metrics.writes.Load(), Groups: n.metrics.groups.Load(),
		Peers: []PeerBacklog{}, Saturation: n.Saturation(), Permits: n.acceptor.Permits(),
	}
	for _, ls := range n.PeerStatus() {
		mode := n.overflow[ls.Peer]
		if mode == "" {
			mode = OverflowReject
		}
		r.Peers = append(r.Peers, PeerBacklog{Peer: ls.Peer, Acked: ls.Acked, Entries: ls.EntriesBehind,
			Bytes: ls.BytesBehind, OldestAgeSeconds: ls.OldestUnackedAge, Overflow: mode, State: ls.State, Retained: !ls.Detached})
	}
	r.Refusals = map[string]uint64{
		acceptor.SourceOutboundBacklog: r.Saturation.Refusals,
		acceptor.SourceReplayPermit:    r.Permits.Refused,
	}
	return r
}

// OriginReport is GET /admin/origin.
type OriginReport struct {
	Cluster  string `json:"cluster"`
	Resolver string `json:"resolver"`
	Stream   string `json:"stream"`
	Version  string `json:"version"`
}

// OriginReport tells which cluster this node is and how it knows.
func (n *Node) OriginReport() OriginReport {
	return OriginReport{Cluster: n.cluster, Resolver: n.resolver, Stream: n.out.Stream().String(), Version: n.opts.BuildVersion}
}

func getOnly(f func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, r, "GET, HEAD")
			return
		}
		f(w, r)
	}
}

func (n *Node) registerAdmin(mux *http.ServeMux) {
	if n.opts.PeerListen == "" && n.opts.PeerListener == nil {
		mux.Handle(pathReplicate, n.acceptor)
		mux.Handle(wire.PathProve, n.acceptor)
	}
	mux.Handle("/metrics", n.metrics.handler())
	mux.HandleFunc("/admin/ui", getOnly(n.handleUI))
	mux.HandleFunc("/admin/history", getOnly(n.handleHistory))
	mux.HandleFunc("/admin/lag", getOnly(n.handleLag))
	n.registerDeadLetters(mux)
	n.registerCluster(mux)
	if n.opts.Pprof && n.opts.APIToken != "" {
		// Behind the token (Validate refuses --pprof without one).
		registerPprof(mux)
	}
	mux.HandleFunc("/admin/peers/{name}/{action}", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, "POST")
			return
		}
		name := r.PathValue("name")
		var err error
		switch r.PathValue("action") {
		case "pause":
			err = n.PausePeer(name)
		case "resume":
			err = n.ResumePeer(name)
		case "reseed":
			err = n.ReseedPeer(name)
		case "detach":
			err = n.DetachPeer(name)
		default:
			writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "actions: pause, resume, reseed, detach"})
			return
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		sh, _ := n.shipper(name)
		writeJSON(w, http.StatusOK, sh.Status(transport.Thresholds{Lagging: n.opts.LinkLagging, Stalled: n.opts.LinkStalled}, n.oldestCommitWall))
	})
	mux.HandleFunc(pathAdminPeers, getOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, n.PeersReport())
	}))
	mux.HandleFunc(pathAdminDigest, getOnly(func(w http.ResponseWriter, r *http.Request) {
		d, err := n.DigestReport()
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
	}))
	mux.HandleFunc(pathAdminWAL, getOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, n.WALReport())
	}))
	mux.HandleFunc(pathAdminOrigin, getOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, n.OriginReport())
	}))
}

//go:embed ui/index.html
var dashboard []byte

// dashboardCSP lets the page run its own inline script and style (by their
// hashes) and nothing else: no other script, no style attribute, requests
// to its own origin only, and no other site may frame it (the page has
// buttons: a framed page could trick a click).
var dashboardCSP = "default-src 'none'; script-src " + inlineHash(dashboard, "script") + "; style-src " + inlineHash(dashboard, "style") +
	"; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// inlineHash is the CSP source of the page's one inline element of tag.
func inlineHash(page []byte, tag string) string {
	_, rest, ok := bytes.Cut(page, []byte("<"+tag+">"))
	body, _, ok2 := bytes.Cut(rest, []byte("</"+tag+">"))
	if !ok || !ok2 {
		panic("node: the dashboard has no inline " + tag)
	}
	sum := sha256.Sum256(body)
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

func (n *Node) handleUI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", dashboardCSP)
	w.Write(dashboard)
}

func registerPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// pprofMux serves profiles on a listener of their own (--pprof-listen).
func pprofMux() http.Handler {
	mux := http.NewServeMux()
	registerPprof(mux)
	return mux
}
