package forward

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/policy"
)

// A write a follower takes (a RESP connection's, an embedding program's)
// reaches the leader as a typed proposal over the raft port: the write
// itself in msgpack, and back its result or its failure by class
// (api.RemoteFailure). Nothing is re-encoded as an HTTP request of the API,
// and no status or error code is parsed back into an error.

// PathPropose is the route of a typed proposal on the raft port.
const PathPropose = "/v1/internal/propose"

// ContentType is a proposal's and its answer's media type.
const ContentType = "application/vnd.replicator.proposal+msgpack"

// Version is the proposal version this build speaks, and the only one of
// answers; a leader answers an unknown one with 400.
const Version = 1

// VersionKeys is the version of a proposal whose condition names keys'
// versions (a RESP transaction's reads and WATCH): a leader of an older
// build refuses it (400, nothing written) rather than drop the condition
// it does not know and write unconditionally.
const VersionKeys = 2

// VersionExpiry is the version of a proposal that carries an expiry (on
// the write or an op of its batch), with or without keys' versions: a
// leader of an older build refuses it rather than write a version that
// never expires.
const VersionExpiry = 3

// need is the version p needs: the oldest whose leader checks all it asks.
func (p *proposal) need() int {
	for _, op := range p.Ops {
		if op.Expires != 0 {
			return VersionExpiry
		}
	}
	switch {
	case p.Expires != 0:
		return VersionExpiry
	case p.Cond != nil && len(p.Cond.Keys) > 0:
		return VersionKeys
	}
	return Version
}

// ErrMalformed is the class of a proposal (or an answer) that does not
// decode, or decodes to no write.
var ErrMalformed = errors.New("forward: malformed proposal")

// proposal is a write as a follower sends it to its leader.
type proposal struct {
	V     int      `msgpack:"v"`
	Op    entry.Op `msgpack:"op"`
	Key   string   `msgpack:"k"`
	Value []byte   `msgpack:"val,omitempty"`
	// Expires is the write's expiry (VersionExpiry).
	Expires int64  `msgpack:"ex,omitempty"`
	End     string `msgpack:"end,omitempty"`
	// Batch: Ops is an atomic batch (even an empty one, which the leader
	// refuses as the API does).
	Batch bool          `msgpack:"batch,omitempty"`
	Ops   []api.BatchOp `msgpack:"ops,omitempty"`
	Delta int64         `msgpack:"d,omitempty"`
	Cond  *condition    `msgpack:"cond,omitempty"`
	Keyed *keyed        `msgpack:"keyed,omitempty"`
	// Scope is the idempotency scope the caller pinned on its context
	// (policy.WithKey): the leader stamps the write with it, as a write
	// proposed where it leads would be.
	Scope *scope `msgpack:"scope,omitempty"`
	// Restores names the conflict a write restores (a loser written back
	// by the operator): its context covers loser and winner, so no cluster
	// logs it as a conflict, and every cluster marks the record restored.
	Restores *restore `msgpack:"restores,omitempty"`
	// Group is one group's part of a range delete a node fans out over a
	// cluster's raft groups (WithGroup), plus one; 0 routes by key.
	Group int `msgpack:"g,omitempty"`
}

// groupKey carries on a context the raft group a range delete's part is
// for (WithGroup).
type groupKey struct{}

// WithGroup marks ctx's write as group g's part of a range delete fanned
// out over a cluster's groups (issue 51): the leader proposes it to group g
// alone, never to every group again.
func WithGroup(ctx context.Context, g int) context.Context {
	return context.WithValue(ctx, groupKey{}, g)
}

// GroupFrom is the group WithGroup put on ctx.
func GroupFrom(ctx context.Context) (int, bool) {
	g, ok := ctx.Value(groupKey{}).(int)
	return g, ok
}

type restore struct {
	Loser  stamp `msgpack:"loser"`
	Winner stamp `msgpack:"winner"`
}

type stamp struct {
	Wall    int64  `msgpack:"wall"`
	Logical uint32 `msgpack:"logical"`
	Origin  string `msgpack:"origin"`
}

func stampOf(s entry.Stamp) stamp {
	return stamp{Wall: s.HLC.Wall, Logical: s.HLC.Logical, Origin: s.Origin}
}
func (s stamp) entry() entry.Stamp {
	return entry.Stamp{HLC: hlc.Timestamp{Wall: s.Wall, Logical: s.Logical}, Origin: s.Origin}
}

type condition struct {
	IfMatch     string `msgpack:"if_match,omitempty"`
	IfNoneMatch bool   `msgpack:"if_none_match,omitempty"`
	// Keys are pairs of a key and its version (VersionKeys).
	Keys []string `msgpack:"keys,omitempty"`
}

type keyed struct {
	Key         string         `msgpack:"key"`
	Fingerprint []byte         `msgpack:"fp"`
	Answer      api.AnswerKind `msgpack:"answer"`
	OpID        string         `msgpack:"op_id,omitempty"`
}

type scope struct {
	ID      string `msgpack:"id"`
	Wall    int64  `msgpack:"wall"`
	Logical uint32 `msgpack:"logical"`
}

// EncodeProposal encodes w (and the idempotency scope on ctx).
func EncodeProposal(ctx context.Context, w api.Write) ([]byte, error) {
	p := proposal{Op: w.Entry.Op, Key: w.Entry.Key, Value: w.Entry.Value, End: w.Entry.End,
		Batch: w.Ops != nil, Ops: w.Ops, Delta: w.Delta, Expires: w.Entry.Expires}
	if p.Batch {
		p.Op = entry.OpMulti
	}
	if c := w.Cond; c != nil {
		p.Cond = &condition{IfMatch: c.IfMatch, IfNoneMatch: c.IfNoneMatch}
		if len(c.Keys) > 0 {
			p.Cond.Keys = make([]string, 0, 2*len(c.Keys))
			for _, kv := range c.Keys {
				p.Cond.Keys = append(p.Cond.Keys, kv.Key, kv.Version)
			}
		}
	}
	p.V = p.need()
	if k := w.Keyed; k != nil {
		p.Keyed = &keyed{Key: k.Key, Fingerprint: k.Fingerprint, Answer: k.Answer, OpID: k.OpID}
	}
	if k, ok := policy.KeyFrom(ctx); ok {
		p.Scope = &scope{ID: k.ID, Wall: k.HLC.Wall, Logical: k.HLC.Logical}
	}
	if g, ok := GroupFrom(ctx); ok {
		p.Group = g + 1
	}
	if r := w.Entry.Restores; r != nil && !p.Batch {
		p.Restores = &restore{Loser: stampOf(r.Loser), Winner: stampOf(r.Winner)}
	}
	return msgpack.Marshal(&p)
}

// DecodeProposal decodes a proposal: the write, and ctx with the caller's
// idempotency scope when it pinned one. It checks the shape (a known
// version and op); the leader checks the write as any other.
func DecodeProposal(ctx context.Context, b []byte) (context.Context, api.Write, error) {
	var p proposal
	if err := msgpack.Unmarshal(b, &p); err != nil {
		return ctx, api.Write{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(p.Value) == 0 {
		p.Value = nil // one shape: an empty value is sent as none (omitempty)
	}
	if want := p.need(); p.V != want {
		return ctx, api.Write{}, fmt.Errorf("%w: version %d for a proposal of version %d (this build speaks %d to %d)",
			ErrMalformed, p.V, want, Version, VersionExpiry)
	}
	w := api.Write{Entry: entry.Entry{Op: p.Op, Key: p.Key, Value: p.Value, End: p.End, Expires: p.Expires}, Delta: p.Delta}
	switch {
	case p.Batch:
		if p.Op != entry.OpMulti {
			return ctx, api.Write{}, fmt.Errorf("%w: a batch of op %s", ErrMalformed, p.Op)
		}
		w.Ops = p.Ops
		if w.Ops == nil {
			w.Ops = []api.BatchOp{}
		}
		w.Entry = entry.Entry{}
	case p.Op == entry.OpSet, p.Op == entry.OpDelete, p.Op == entry.OpCounter, p.Op == entry.OpDeleteRange:
	default:
		return ctx, api.Write{}, fmt.Errorf("%w: op %s is not a write", ErrMalformed, p.Op)
	}
	if c := p.Cond; c != nil {
		w.Cond = &api.Condition{IfMatch: c.IfMatch, IfNoneMatch: c.IfNoneMatch}
		if len(c.Keys)%2 != 0 || len(c.Keys) > 2*api.MaxConditionKeys {
			return ctx, api.Write{}, fmt.Errorf("%w: a condition of %d key and version strings", ErrMalformed, len(c.Keys))
		}
		for i := 0; i < len(c.Keys); i += 2 {
			w.Cond.Keys = append(w.Cond.Keys, api.KeyVersion{Key: c.Keys[i], Version: c.Keys[i+1]})
		}
	}
	if k := p.Keyed; k != nil {
		w.Keyed = &api.Keyed{Key: k.Key, Fingerprint: k.Fingerprint, Answer: k.Answer, OpID: k.OpID}
	}
	if s := p.Scope; s != nil {
		ctx = policy.WithKey(ctx, policy.Key{ID: s.ID, HLC: hlc.Timestamp{Wall: s.Wall, Logical: s.Logical}})
	}
	if r := p.Restores; r != nil {
		if p.Op != entry.OpSet && p.Op != entry.OpDelete {
			return ctx, api.Write{}, fmt.Errorf("%w: a restore of op %s", ErrMalformed, p.Op)
		}
		w.Entry.Restores = &entry.Restore{Loser: r.Loser.entry(), Winner: r.Winner.entry()}
	}
	if p.Group > 0 {
		if p.Op != entry.OpDeleteRange || p.Group > 64 {
			return ctx, api.Write{}, fmt.Errorf("%w: group %d of a write of op %s", ErrMalformed, p.Group-1, p.Op)
		}
		ctx = WithGroup(ctx, p.Group-1)
	}
	return ctx, w, nil
}

// answer is the leader's answer to a proposal: the write's result, or its
// failure by class; and the leader's applied index when it answered, which
// the follower applies as far before it answers its caller (it then reads
// its own write).
type answer struct {
	V       int                `msgpack:"v"`
	Applied uint64             `msgpack:"applied"`
	Failure *api.RemoteFailure `msgpack:"failure,omitempty"`
	Key     string             `msgpack:"k,omitempty"`
	Version string             `msgpack:"version,omitempty"`
	Origin  string             `msgpack:"origin,omitempty"`
	Outcome entry.Outcome      `msgpack:"outcome,omitempty"`
	Index   uint64             `msgpack:"index,omitempty"`
	Stream  []byte             `msgpack:"stream,omitempty"`
	Counter int64              `msgpack:"counter,omitempty"`
	Existed int                `msgpack:"existed,omitempty"`
	Replay  *replay            `msgpack:"replay,omitempty"`
}

type replay struct {
	Key         string `msgpack:"key"`
	Fingerprint []byte `msgpack:"fp"`
	Status      int    `msgpack:"status"`
	Body        []byte `msgpack:"body"`
	Wall        int64  `msgpack:"wall"`
	Logical     uint32 `msgpack:"logical"`
	Origin      string `msgpack:"origin"`
	Expires     int64  `msgpack:"expires"`
}

// EncodeAnswer encodes a proposal's result (err nil) or its failure.
func EncodeAnswer(res api.WriteResult, err error, applied uint64) []byte {
	a := answer{V: Version, Applied: applied}
	if err != nil {
		a.Failure = api.FailureOf(err)
	} else {
		a.Key, a.Version, a.Origin, a.Outcome = res.Key, res.Version, res.Origin, res.Outcome
		a.Index, a.Counter, a.Existed = res.Index, res.Counter, res.Existed
		if !res.Stream.IsZero() {
			a.Stream = res.Stream[:]
		}
		if r := res.Replay; r != nil {
			a.Replay = &replay{Key: r.Key, Fingerprint: r.Fingerprint, Status: r.Status, Body: r.Body,
				Wall: r.Stamp.HLC.Wall, Logical: r.Stamp.HLC.Logical, Origin: r.Stamp.Origin, Expires: r.Expires}
		}
	}
	b, _ := msgpack.Marshal(&a)
	return b
}

// DecodeAnswer decodes the leader's answer: the result, or the failure it
// names (an error of its class), and the leader's applied index.
func DecodeAnswer(b []byte) (res api.WriteResult, failure error, applied uint64, err error) {
	var a answer
	if err := msgpack.Unmarshal(b, &a); err != nil {
		return res, nil, 0, fmt.Errorf("%w: the leader's answer: %w", ErrMalformed, err)
	}
	if a.V != Version {
		return res, nil, 0, fmt.Errorf("%w: the leader's answer of version %d", ErrMalformed, a.V)
	}
	if a.Failure != nil {
		return res, a.Failure.Err(), a.Applied, nil
	}
	res = api.WriteResult{Key: a.Key, Version: a.Version, Origin: a.Origin, Outcome: a.Outcome, Index: a.Index,
		Counter: a.Counter, Existed: a.Existed}
	if len(a.Stream) > 0 {
		if len(a.Stream) != len(res.Stream) {
			return api.WriteResult{}, nil, 0, fmt.Errorf("%w: a stream ID of %d bytes", ErrMalformed, len(a.Stream))
		}
		copy(res.Stream[:], a.Stream)
	}
	if r := a.Replay; r != nil {
		res.Replay = &api.IdemRecord{Key: r.Key, Fingerprint: r.Fingerprint, Status: r.Status, Body: r.Body,
			Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: r.Wall, Logical: r.Logical}, Origin: r.Origin}, Expires: r.Expires}
	}
	return res, nil, a.Applied, nil
}

// Leader is the leader's side of a proposal.
type Leader struct {
	// Propose proposes the write here; it refuses (not written) when this
	// node no longer leads.
	Propose func(ctx context.Context, w api.Write) (api.WriteResult, error)
	// Applied is this node's applied index in the raft group the write
	// went to (a cluster of several groups: its key's, or WithGroup's).
	Applied func(ctx context.Context, w api.Write) uint64
	// MaxBody bounds a proposal's body.
	MaxBody int64
}

// ServeHTTP answers a proposal another node of the cluster forwarded over
// the raft port (which authenticated it, and checked the scope its caller
// was granted).
func (l *Leader) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "forward: a proposal is a POST", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, l.MaxBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			http.Error(w, fmt.Sprintf("forward: a proposal of over %d bytes", l.MaxBody), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "forward: reading the proposal: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, wr, err := DecodeProposal(r.Context(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	res, err := l.Propose(ctx, wr)
	// Read after the write applied here: the follower applies as far
	// before it answers, so its caller reads the write there.
	out := EncodeAnswer(res, err, l.Applied(ctx, wr))
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

// Follower is a follower's side of a proposal.
type Follower struct {
	// Self is this node's raft server ID.
	Self string
	// Leader is the leader's raft server ID (Self when this node leads),
	// waiting a while for one to be known.
	Leader func(ctx context.Context) (string, error)
	// Local proposes here, when this node was elected meanwhile.
	Local func(ctx context.Context, w api.Write) (api.WriteResult, error)
	// Send posts req to the node the URL names over the raft port
	// (URL builds it); NotSent reports an error after which the request
	// certainly never left (a failed dial).
	Send    func(req *http.Request) (*http.Response, error)
	URL     func(id, requestURI string) string
	NotSent func(error) bool
	// Header adds what the raft port's receiver reads of the caller (who
	// was verified, and its scope).
	Header http.Header
	// Await returns once this node applied index.
	Await func(ctx context.Context, index uint64) error
	// Counted counts a forward by how it ended (answered, not_sent,
	// unknown_outcome).
	Counted func(how string)
}

// ErrOlderLeader is the class of a leader that takes no typed proposals
// (a build before them answers 404): nothing was written.
var ErrOlderLeader = errors.New("forward: the leader runs an older build, which takes no typed proposals")

// maxAnswer bounds the leader's answer (a replayed answer's body is
// small: the recorded JSON of one write).
const maxAnswer = 4 << 20

// Propose sends w to the leader and returns what it did, once this node
// applied as far as the leader had when it answered. A failure is of the
// class the leader named; a request that certainly never left is retried
// once (an election may have moved the leader) and then not written; one
// that left and got no answer has an unknown outcome.
func (f *Follower) Propose(ctx context.Context, w api.Write) (api.WriteResult, error) {
	body, err := EncodeProposal(ctx, w)
	if err != nil {
		return api.WriteResult{}, fmt.Errorf("%w: %w: %w", api.ErrNotWritten, ErrMalformed, err)
	}
	var last error
	for attempt := 0; attempt < 2; attempt++ {
		id, err := f.Leader(ctx)
		if err != nil {
			return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		if id == f.Self {
			return f.Local(ctx, w) // elected meanwhile
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.URL(id, PathPropose), bytes.NewReader(body))
		if err != nil {
			return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		for k, vs := range f.Header {
			req.Header[k] = vs
		}
		req.Header.Set("Content-Type", ContentType)
		resp, err := f.Send(req)
		if err != nil {
			if f.NotSent(err) {
				last = err
				f.Counted("not_sent")
				continue
			}
			f.Counted("unknown_outcome")
			return api.WriteResult{}, fmt.Errorf("%w: proposed to the leader %s, no answer: %w", api.ErrUnknownOutcome, id, err)
		}
		return f.answered(ctx, id, resp)
	}
	return api.WriteResult{}, fmt.Errorf("%w: the leader could not be reached: %w", api.ErrNotWritten, last)
}

// answered reads the leader's answer to a proposal.
func (f *Follower) answered(ctx context.Context, id string, resp *http.Response) (api.WriteResult, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	switch {
	case err != nil:
		f.Counted("unknown_outcome")
		return api.WriteResult{}, fmt.Errorf("%w: the leader %s's answer broke off: %w", api.ErrUnknownOutcome, id, err)
	case resp.StatusCode == http.StatusNotFound:
		f.Counted("not_sent")
		return api.WriteResult{}, fmt.Errorf("%w: %w (%s): send the write to the leader, or upgrade it (docs/CLUSTER.md)", api.ErrNotWritten, ErrOlderLeader, id)
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusRequestEntityTooLarge ||
		resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusMethodNotAllowed:
		// Refused before it was proposed.
		f.Counted("answered")
		return api.WriteResult{}, fmt.Errorf("%w: the leader %s refused the proposal (%d): %s", api.ErrNotWritten, id, resp.StatusCode, bytes.TrimSpace(b))
	case resp.StatusCode != http.StatusOK:
		f.Counted("unknown_outcome")
		return api.WriteResult{}, fmt.Errorf("%w: the leader %s answered %d: %s", api.ErrUnknownOutcome, id, resp.StatusCode, bytes.TrimSpace(b))
	}
	res, failure, applied, err := DecodeAnswer(b)
	if err != nil {
		f.Counted("unknown_outcome")
		return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrUnknownOutcome, err)
	}
	f.Counted("answered")
	if failure != nil {
		return api.WriteResult{}, failure
	}
	if applied > 0 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f.Await(wctx, applied)
		cancel()
		if err != nil {
			return api.WriteResult{}, fmt.Errorf("%w: the leader %s wrote it (version %s), and this node has not applied it yet (%v): read it from the leader, or retry under the same idempotency key",
				api.ErrUnknownOutcome, id, res.Version, err)
		}
	}
	return res, nil
}

// Ask asks the leader a question of the API (a GET of requestURI, answered
// in JSON into v) over the raft port: WAIT on a follower asks which peers
// hold a write. A question changes nothing, so any failure is only an
// error.
func (f *Follower) Ask(ctx context.Context, requestURI string, v any) error {
	id, err := f.Leader(ctx)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.URL(id, requestURI), nil)
	if err != nil {
		return err
	}
	for k, vs := range f.Header {
		req.Header[k] = vs
	}
	resp, err := f.Send(req)
	if err != nil {
		return fmt.Errorf("forward: asking the leader %s: %w", id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("forward: the leader %s's answer: %w", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("forward: the leader %s answered %d: %s", id, resp.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("forward: the leader %s's answer: %w", id, err)
	}
	return nil
}

// Route answers the typed proposals other nodes send over the raft port
// (PathPropose) with l, once the scope their caller was granted allows a
// write; next answers the rest.
func (l *Leader) Route(next http.Handler, refused func(code string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request of the API a follower relayed whole carries
		// HeaderForwarded: its path is a client's, never a proposal (the
		// API serves no such route), so it goes to the routes (404).
		if r.URL.Path != PathPropose || r.Header.Get(HeaderForwarded) != "" {
			next.ServeHTTP(w, r)
			return
		}
		if got := Granted(r); !got.Allows(api.ScopeAPI) {
			refused("forbidden")
			httpjson.WriteError(w, http.StatusForbidden, httpjson.Error{Code: "forbidden",
				Message: fmt.Sprintf("proposed by %s for a caller granted the %s scope: a write needs the api scope", ServiceSender(r), got)})
			return
		}
		l.ServeHTTP(w, r)
	})
}
