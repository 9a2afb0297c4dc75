package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/replicator/replicator/api"
)

func (a *API) registerCluster(mux *http.ServeMux) {
	mux.HandleFunc("/admin/cluster", getOnly(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("local") != "" {
			writeJSON(w, http.StatusOK, a.node.LocalCluster())
			return
		}
		writeJSON(w, http.StatusOK, a.node.ClusterReport(r.Context()))
	}))
	mux.HandleFunc("/admin/cluster/{action}", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, "POST")
			return
		}
		var req struct {
			ID   string `json:"id"`
			Raft string `json:"raft"`
			// Force, on a join, is the operator's reason to add a node
			// whose raft port does not say who it is.
			Force string `json:"force"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.ID == "" {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: `want {"id": "NODE", "raft": "HOST:PORT"} (raft: join only)`})
			return
		}
		var err error
		switch r.PathValue("action") {
		case "join":
			if req.Force != "" {
				a.log.Warn("admin cluster join --force", "node", req.ID, "caller", a.opts.Caller(r))
			}
			err = a.node.JoinNode(req.ID, req.Raft, req.Force)
		case "remove":
			err = a.node.RemoveNode(req.ID)
		default:
			writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "actions: join, remove"})
			return
		}
		var nl *api.NotLeaderError
		switch {
		case err == nil:
			a.log.Info("cluster membership changed by the operator", "action", r.PathValue("action"), "node", req.ID, "caller", a.opts.Caller(r))
			writeJSON(w, http.StatusOK, a.node.LocalCluster())
		case errors.Is(err, api.ErrQuorum):
			writeError(w, http.StatusConflict, apiError{Code: "quorum", Message: err.Error()})
		case errors.Is(err, api.ErrNodeIDRemoved):
			writeError(w, http.StatusConflict, apiError{Code: "removed", Message: err.Error()})
		case errors.Is(err, api.ErrUnknownNode):
			writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: err.Error()})
		case errors.Is(err, api.ErrBadRequest):
			WriteErr(w, err)
		case errors.Is(err, api.ErrNotACluster):
			writeError(w, http.StatusConflict, apiError{Code: "single_node", Message: err.Error()})
		case errors.As(err, &nl):
			WriteErr(w, fmt.Errorf("%w: %w", api.ErrNotWritten, err))
		default:
			WriteErr(w, fmt.Errorf("%w: %w", api.ErrUnknownOutcome, err))
		}
	})
}

func (a *API) registerDeadLetters(mux *http.ServeMux) {
	mux.HandleFunc("/admin/deadletters", getOnly(func(w http.ResponseWriter, r *http.Request) {
		dl, err := a.opts.DeadLetters.DeadLetters()
		if err != nil {
			WriteErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"dead_letters": dl})
	}))
	mux.HandleFunc("/admin/deadletters/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, "POST")
			return
		}
		var err error
		switch r.PathValue("action") {
		case "replay":
			err = a.opts.DeadLetters.ReplayDeadLetter(r.PathValue("id"))
		case "discard":
			err = a.opts.DeadLetters.DiscardDeadLetter(r.PathValue("id"))
		default:
			err = fmt.Errorf("%w: actions: replay, discard", api.ErrNotFound)
		}
		if err != nil {
			if !errors.Is(err, api.ErrNotFound) {
				err = fmt.Errorf("%w: %w", api.ErrBadRequest, err)
			}
			WriteErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "done"})
	})
}
