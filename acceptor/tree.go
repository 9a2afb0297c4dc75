package acceptor

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/wire"
)

// ServeTree answers a peer's anti-entropy request (wire.PathTree,
// docs/ANTIENTROPY.md): authenticated as a batch is (the sender's secret
// or certificate), its answer signed as an ack is when the sender sent a
// nonce. Any node of the cluster answers from its own tree (a follower's
// lags its leader's by what it has not applied yet, which a comparison
// already treats as in flight). answer builds the answer; it is told the
// sender, so that a filtered link compares only what it carries.
//
// Only the leader answers, as only the leader takes batches: a sender's
// requests then meet one pace and one bandwidth limit for the whole
// cluster, not one per node (a follower answers 503 not_leader).
func (a *Acceptor) ServeTree(w http.ResponseWriter, r *http.Request, answer func(ctx context.Context, sender string, req *wire.TreeRequest) (*wire.TreeAnswer, error)) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.Error{Code: "method_not_allowed", Message: "POST a msgpack tree request"})
		return
	}
	sender, err := a.authenticate(r)
	if err != nil {
		a.refuseUnread(w, "", err)
		return
	}
	w, finish := a.signed(w, r, sender)
	defer finish()
	if a.opts.Leadership != nil {
		if leading, leader, nodes := a.opts.Leadership(); !leading {
			a.refuseUnread(w, sender, &NotLeaderError{Leader: leader, Nodes: nodes})
			return
		}
	}
	// Read as a batch is: content type, length bound, a body slot.
	body, err := a.readBody(w, r, sender)
	if err != nil {
		a.refuseUnread(w, sender, err)
		return
	}
	req, err := wire.DecodeTreeRequest(body)
	if err != nil {
		a.refuse(w, sender, fmt.Errorf("%w: %w", ErrBadBatch, err))
		return
	}
	release, err := a.treeSlot(sender)
	if err != nil {
		httpjson.RetryAfter(w, time.Second)
		httpjson.WriteError(w, http.StatusTooManyRequests, httpjson.Error{Code: "tree_busy", Retryable: true, Message: err.Error()})
		return
	}
	defer release()
	ans, err := answer(r.Context(), sender, req)
	if err != nil {
		httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.Error{Code: "tree_unavailable", Message: err.Error()})
		return
	}
	b, err := wire.EncodeTree(ans)
	if err != nil {
		httpjson.WriteError(w, http.StatusInternalServerError, httpjson.Error{Code: "internal", Message: err.Error()})
		return
	}
	if a.opts.TreeCharge != nil {
		// Both ways: what the sender sent and what goes back.
		if err := a.opts.TreeCharge(r.Context(), sender, len(body)+len(b)); err != nil {
			httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.Error{Code: "tree_unavailable", Retryable: true, Message: err.Error()})
			return
		}
	}
	w.Header().Set("Content-Type", wire.ContentType)
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// An answer may scan the tree, hold a copy of its leaves (16 MiB) and up to
// antientropy.AnswerBudget of versions: MaxTreeAnswers bounds the answers
// a node works on at once, MaxTreeAnswersOf those of one sender. A
// comparison asks one request at a time, so two per sender let a background
// pass and an operator's diff run together; more is refused (429
// tree_busy), not queued.
const (
	MaxTreeAnswers   = 4
	MaxTreeAnswersOf = 2
)

func (a *Acceptor) treeSlot(sender string) (release func(), err error) {
	release, all, of, ok := a.take(&a.mu.trees, sender, MaxTreeAnswers, MaxTreeAnswersOf)
	if !ok {
		return nil, fmt.Errorf("acceptor: %d tree requests being answered (at most %d), %d of them from %s (at most %d)",
			all, MaxTreeAnswers, of, sender, MaxTreeAnswersOf)
	}
	return release, nil
}
