package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/api"
)

// registerConflicts serves the conflict log: GET /admin/conflicts?key=&
// prefix=&since=&limit=&after=, a page like a scan's.
func (a *API) registerConflicts(mux *http.ServeMux) {
	mux.HandleFunc("/admin/conflicts", getOnly(func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		q := api.ConflictQuery{Key: v.Get("key"), Prefix: v.Get("prefix"), After: v.Get("after")}
		bad := func(msg string) { writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: msg}) }
		if q.Key != "" && q.Prefix != "" {
			bad("key and prefix: give one")
			return
		}
		for name, s := range map[string]string{"key": q.Key, "prefix": q.Prefix} {
			if len(s) > a.opts.MaxKeyBytes || !utf8.ValidString(s) {
				writeError(w, http.StatusBadRequest, apiError{Code: "bad_key", Message: name + " is not a valid key"})
				return
			}
		}
		if s := v.Get("since"); s != "" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				d, derr := time.ParseDuration(s)
				if derr != nil || d <= 0 {
					bad(fmt.Sprintf("since %q: want an RFC 3339 time or a duration back from now (10m)", s))
					return
				}
				t = time.Now().Add(-d)
			}
			q.Since = t
		}
		if s := v.Get("limit"); s != "" {
			l, err := strconv.Atoi(s)
			if err != nil || l < 1 {
				bad(fmt.Sprintf("limit %q: want a positive integer", s))
				return
			}
			q.Limit = l
		}
		page, err := a.opts.Conflicts.Conflicts(q)
		if err != nil {
			WriteErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, page)
	}))
	// POST /admin/conflicts/{id}/restore writes the loser back, answered
	// like a PUT: 200 with the write's version, 412 with what the key
	// holds when it no longer holds the winner.
	mux.HandleFunc("/admin/conflicts/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, "POST")
			return
		}
		if r.PathValue("action") != "restore" {
			writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "actions: restore"})
			return
		}
		res, err := a.opts.Conflicts.RestoreConflict(r.Context(), r.PathValue("id"))
		if err == nil {
			a.log.Info("conflict restored by the operator", "conflict", r.PathValue("id"), "key", res.Key, "version", res.Version,
				"caller", a.opts.Caller(r))
		}
		a.answerWrite(w, r, nil, res, err)
	})
}
