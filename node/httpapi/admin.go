package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/wire"
)

// Admin paths. Each handler is a thin wrapper over a method that returns a
// struct, so tests and the CLI see exactly what the endpoint serves.
const (
	pathAdminPeers  = "/admin/peers"
	pathAdminDigest = "/admin/digest"
	pathAdminWAL    = "/admin/wal"
	pathAdminOrigin = "/admin/origin"
)

func getOnly(f func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, r, "GET, HEAD")
			return
		}
		f(w, r)
	}
}

func (a *API) registerAdmin(mux *http.ServeMux) {
	if a.opts.Peer != nil {
		mux.Handle(wire.PathReplicate, a.opts.Peer)
		mux.Handle(wire.PathProve, a.opts.Peer)
		mux.Handle(wire.PathTree, a.opts.Peer)
	}
	mux.Handle("/metrics", a.opts.Metrics)
	mux.HandleFunc(PathUI, getOnly(a.handleUI))
	mux.HandleFunc("/admin/history", getOnly(a.handleHistory))
	mux.HandleFunc("/admin/lag", getOnly(a.handleLag))
	if a.opts.DeadLetters != nil {
		a.registerDeadLetters(mux)
	}
	if a.opts.Conflicts != nil {
		a.registerConflicts(mux)
	}
	a.registerCluster(mux)
	if a.opts.Pprof {
		registerPprof(mux)
	}
	if a.opts.Settings != nil {
		mux.HandleFunc("/admin/peers/{name}/filter", a.handleFilter)
		mux.HandleFunc("/admin/peers/{name}/filter/release", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				methodNotAllowed(w, r, "POST")
				return
			}
			rep, err := a.opts.Settings.ReleaseLinkFilter(r.PathValue("name"))
			if err != nil {
				WriteErr(w, err)
				return
			}
			writeJSON(w, http.StatusOK, rep)
		})
		mux.HandleFunc("/admin/peers/{name}/bandwidth", a.handleBandwidth)
		mux.HandleFunc("/admin/peers/{name}/compression", a.handleCompression)
	}
	if a.opts.Tree != nil {
		mux.HandleFunc("/admin/peers/{name}/diff", a.handleDiff)
		mux.HandleFunc(PathTreeRebuild, a.handleTreeRebuild)
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
			err = a.node.PausePeer(name)
		case "resume":
			err = a.node.ResumePeer(name)
		case "reseed":
			err = a.node.ReseedPeer(name)
		case "detach":
			err = a.node.DetachPeer(name)
		default:
			writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "actions: pause, resume, reseed, detach"})
			return
		}
		if err != nil {
			WriteErr(w, err)
			return
		}
		for _, st := range a.node.PeerStatus() {
			if st.Peer == name {
				writeJSON(w, http.StatusOK, st)
				return
			}
		}
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "no peer " + name})
	})
	mux.HandleFunc(pathAdminPeers, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && a.opts.Settings != nil:
			a.handleAddPeer(w, r)
		case r.Method == http.MethodGet || r.Method == http.MethodHead:
			writeJSON(w, http.StatusOK, a.node.PeersReport())
		default:
			methodNotAllowed(w, r, "GET, HEAD, POST")
		}
	})
	if a.opts.Settings != nil {
		mux.HandleFunc("/admin/peers/{name}", func(w http.ResponseWriter, r *http.Request) {
			var rep api.PeerReport
			var err error
			switch r.Method {
			case http.MethodGet, http.MethodHead:
				rep, err = a.opts.Settings.Peer(r.PathValue("name"))
			case http.MethodDelete:
				rep, err = a.opts.Settings.RemovePeer(r.PathValue("name"))
				a.log.Warn("peer removed at run time by the operator", "peer", r.PathValue("name"), "caller", a.opts.Caller(r), "err", err)
			default:
				methodNotAllowed(w, r, "GET, HEAD, DELETE")
				return
			}
			if err != nil {
				WriteErr(w, err)
				return
			}
			writeJSON(w, http.StatusOK, rep)
		})
	}
	mux.HandleFunc(pathAdminDigest, getOnly(func(w http.ResponseWriter, r *http.Request) {
		d, err := a.node.DigestReport(r.URL.Query()["prefix"]...)
		if err != nil {
			WriteErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
	}))
	mux.HandleFunc(pathAdminWAL, getOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.node.WALReport())
	}))
	mux.HandleFunc(pathAdminOrigin, getOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.node.OriginReport())
	}))
	if a.opts.Backup != nil {
		mux.HandleFunc("/admin/backup", getOnly(a.handleBackup))
	}
}

// handleBackup streams a backup of this node (GET /admin/backup: the node
// that answers, leader or not; `replicator backup`). An error before the
// first byte is an answer of its own; one after it cuts the stream short,
// which the reader finds as a tar without its end (backup.Extract refuses
// it).
func (a *API) handleBackup(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Cache-Control", "no-store")
	cw := &countingWriter{w: w}
	a.log.Info("backup started", "caller", a.opts.Caller(r))
	if err := a.opts.Backup(r.Context(), cw); err != nil {
		a.log.Warn("backup failed", "caller", a.opts.Caller(r), "sent_bytes", cw.n, "err", err)
		if cw.n == 0 {
			WriteErr(w, err)
			return
		}
		// Cut short: the handler's panic aborts the response, so the
		// reader sees the stream end in the middle.
		panic(http.ErrAbortHandler)
	}
	a.log.Info("backup sent", "caller", a.opts.Caller(r), "bytes", cw.n)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
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

func (a *API) handleUI(w http.ResponseWriter, r *http.Request) {
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

// PprofHandler serves profiles on a listener of their own (--pprof-listen).
func PprofHandler() http.Handler {
	mux := http.NewServeMux()
	registerPprof(mux)
	return mux
}

func (a *API) handleHistory(w http.ResponseWriter, r *http.Request) {
	var after time.Time
	if v := r.URL.Query().Get("after"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: "after: want Unix milliseconds"})
			return
		}
		after = time.UnixMilli(ms)
	}
	writeJSON(w, http.StatusOK, a.node.History(after))
}

func (a *API) handleLag(w http.ResponseWriter, r *http.Request) {
	since := time.Now().Add(-time.Minute)
	if s := r.URL.Query().Get("since"); s != "" {
		ns, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: "since: unix nanoseconds"})
			return
		}
		since = time.Unix(0, ns)
	}
	writeJSON(w, http.StatusOK, a.node.Lag(since))
}

// writeSaturated refuses a write of a saturated node: nothing was written
// ("outcome": "not_written"), and the shipped clients do not retry it
// ("retryable": false: the backlog does not drain because a client tries
// again). Retry-After stays, for proxies and load balancers that honour it
// and never read the body (docs/SATURATION.md says why both).
func writeSaturated(w http.ResponseWriter, e *api.SaturatedError) {
	httpjson.RetryAfter(w, time.Second)
	writeError(w, http.StatusServiceUnavailable, apiError{Code: "saturated", Source: e.Source, Peer: e.Peer,
		Retryable: false, Outcome: "not_written", Message: e.Error() + "; slow down, or bring the peer back (replicator admin peers)"})
}

// handleFilter answers GET /admin/peers/NAME/filter with the link's filter
// as the cluster's log holds it, and sets it on PUT, from a body
// {"include": [prefixes], "exclude": [prefixes]} (both empty: every key).
func (a *API) handleFilter(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var rep api.FilterReport
	var err error
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		rep, err = a.opts.Settings.LinkFilter(name)
	case http.MethodPut:
		var f entry.Filter
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if derr := dec.Decode(&f); derr != nil {
			WriteErr(w, fmt.Errorf("%w: a filter is {\"include\": [prefixes], \"exclude\": [prefixes]}: %v", api.ErrBadRequest, derr))
			return
		}
		rep, err = a.opts.Settings.SetLinkFilter(name, f)
	default:
		methodNotAllowed(w, r, "GET, PUT")
		return
	}
	if err != nil {
		WriteErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// handleBandwidth answers GET /admin/peers/NAME/bandwidth with the link's
// limit as the cluster's log holds it, and sets it on PUT, from a body
// {"bytes_per_second": N} (0: no limit).
func (a *API) handleBandwidth(w http.ResponseWriter, r *http.Request) {
	type req struct {
		BytesPerSecond *int64 `json:"bytes_per_second"`
	}
	serveLinkSetting(w, r, a.opts.Settings.LinkBandwidth, `{"bytes_per_second": N} (0: no limit)`,
		func(q req) bool { return q.BytesPerSecond != nil },
		func(name string, q req) (api.BandwidthReport, error) {
			return a.opts.Settings.SetLinkBandwidth(name, *q.BytesPerSecond)
		})
}

// handleCompression answers GET /admin/peers/NAME/compression with the
// link's compression, and PUT {"compression": "zstd"|"none"} sets it
// through the cluster's log.
func (a *API) handleCompression(w http.ResponseWriter, r *http.Request) {
	type req struct {
		Compression string `json:"compression"`
	}
	serveLinkSetting(w, r, a.opts.Settings.LinkCompression, `{"compression": "zstd"|"none"}`,
		func(q req) bool { return q.Compression != "" },
		func(name string, q req) (api.CompressionReport, error) {
			return a.opts.Settings.SetLinkCompression(name, q.Compression)
		})
}

// serveLinkSetting is GET and PUT of one of a link's settings the
// cluster's log holds: GET answers get's report; PUT decodes a small JSON
// body (unknown fields refused; complete says every field needed is
// there, else 400 with want) and answers set's.
func serveLinkSetting[Req, Rep any](w http.ResponseWriter, r *http.Request, get func(string) (Rep, error), want string,
	complete func(Req) bool, set func(string, Req) (Rep, error)) {
	name := r.PathValue("name")
	var rep Rep
	var err error
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		rep, err = get(name)
	case http.MethodPut:
		var q Req
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
		dec.DisallowUnknownFields()
		if derr := dec.Decode(&q); derr != nil || !complete(q) {
			WriteErr(w, fmt.Errorf("%w: want %s: %v", api.ErrBadRequest, want, derr))
			return
		}
		rep, err = set(name, q)
	default:
		methodNotAllowed(w, r, "GET, PUT")
		return
	}
	if err != nil {
		WriteErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// handleAddPeer serves POST /admin/peers {"name", "urls", "secret"}: a
// peer added at run time. The secret is sealed before it reaches the log
// and never answered.
func (a *API) handleAddPeer(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name   string   `json:"name"`
		URLs   []string `json:"urls"`
		Secret string   `json:"secret"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		WriteErr(w, fmt.Errorf("%w: want {\"name\": N, \"urls\": [URL...], \"secret\": S}: %v", api.ErrBadRequest, err))
		return
	}
	rep, err := a.opts.Settings.AddPeer(req.Name, req.URLs, req.Secret)
	if err != nil {
		WriteErr(w, err)
		return
	}
	a.log.Warn("peer added at run time by the operator", "peer", req.Name, "urls", req.URLs, "caller", a.opts.Caller(r))
	writeJSON(w, http.StatusOK, rep)
}

// RepairBound is how long a repair may run once its caller left.
const RepairBound = time.Hour

// handleDiff serves POST /admin/peers/{name}/diff[?repair=true]: a
// comparison of this cluster's tree with the peer's, and a repair of what
// this cluster lacks when asked. POST: it runs on the leader, which holds
// the links (a follower forwards it), and a repair writes.
func (a *API) handleDiff(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	repair := false
	if v := r.URL.Query().Get("repair"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: "repair: true or false"})
			return
		}
		repair = b
	}
	ctx := r.Context()
	if repair {
		// A repair applies in chunks: a client that goes away (a CLI's
		// timeout, a closed terminal) does not stop it half-applied; it
		// runs to its end, within RepairBound, and the log says what it
		// applied. A comparison alone stops with its client.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), RepairBound)
		defer cancel()
	}
	rep, err := a.opts.Tree.Diff(ctx, r.PathValue("name"), repair)
	if repair && r.Context().Err() != nil {
		a.log.Warn("repaired from a peer after its caller left", "peer", r.PathValue("name"), "divergent", len(rep.Divergent),
			"repaired", rep.Repaired, "error", err, "caller", a.opts.Caller(r))
	}
	if err != nil {
		WriteErr(w, err)
		return
	}
	if repair && r.Context().Err() == nil {
		a.log.Warn("repaired from a peer", "peer", rep.Peer, "divergent", len(rep.Divergent), "repaired", rep.Repaired, "caller", a.opts.Caller(r))
	}
	writeJSON(w, http.StatusOK, rep)
}

// handleTreeRebuild serves POST /admin/tree/rebuild: this node's kept
// hashes summed afresh from its tree, the wrong ones corrected (each node
// keeps its own: not forwarded).
func (a *API) handleTreeRebuild(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	rep, err := a.opts.Tree.RebuildTree(r.Context())
	if err != nil {
		WriteErr(w, err)
		return
	}
	a.log.Info("rebuilt the kept hashes", "corrected", rep.Corrected, "caller", a.opts.Caller(r))
	writeJSON(w, http.StatusOK, rep)
}
