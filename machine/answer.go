package machine

import (
	"encoding/json"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/jsonstring"
)

// The answers a keyed request records. A keyed write's record (status and
// body) rides in its entry, so it is decided where the write is, in commit
// order, from the entry and the decision alone: every node of a cluster
// records the same bytes, and a retry sent to any of them replays them.

// recordedStatus is the status every recorded answer carries: only a write
// that succeeded records one (a refusal is answered, never recorded), and a
// retry replays it as the HTTP status. The answer is bytes by nature, since
// any node of any cluster replays it verbatim, so the machine encodes the
// answer's value itself; it never sees a request or a response.
const recordedStatus = 200

// AnswerKind names the shape of a recorded answer.
type AnswerKind uint8

const (
	// AnswerWrite: a single-key put or delete, WriteAnswer.
	AnswerWrite AnswerKind = iota + 1
	// AnswerRange: a range delete, RangeAnswer.
	AnswerRange
	// AnswerCounter: an increment, CounterAnswer.
	AnswerCounter
	// AnswerBatch: an atomic batch, BatchAnswer (with its operation ID).
	AnswerBatch
	answerKinds
)

// WriteAnswer is the answer to a single-key write.
type WriteAnswer struct {
	Key     string `json:"key"`
	Version string `json:"version"`
	Origin  string `json:"origin"`
}

// RangeAnswer is the answer to a range delete.
type RangeAnswer struct {
	Start   string `json:"start"`
	End     string `json:"end"`
	Version string `json:"version"`
	Origin  string `json:"origin"`
}

// CounterAnswer is the answer to an increment.
type CounterAnswer struct {
	Key     string `json:"key"`
	Value   int64  `json:"value"`
	Version string `json:"version"`
	Origin  string `json:"origin"`
}

// BatchAnswer is the answer to an atomic batch.
type BatchAnswer struct {
	OperationID string `json:"operation_id,omitempty"`
	Ops         int    `json:"ops"`
	Version     string `json:"version"`
	Origin      string `json:"origin"`
}

// Answer renders the answer of kind to the stamped write e; counterValue is
// an increment's result here, opID a batch's operation ID.
func Answer(kind AnswerKind, e *entry.Entry, counterValue int64, opID string) (status int, body []byte) {
	st := e.LWW()
	var v any
	switch kind {
	case AnswerWrite:
		return recordedStatus, AppendWriteAnswer(nil, e.Key, st.String(), st.Origin)
	case AnswerRange:
		v = RangeAnswer{Start: e.Key, End: e.End, Version: st.String(), Origin: st.Origin}
	case AnswerCounter:
		v = CounterAnswer{Key: e.Key, Value: counterValue, Version: st.String(), Origin: st.Origin}
	default:
		v = BatchAnswer{OperationID: opID, Ops: len(e.Ops), Version: st.String(), Origin: st.Origin}
	}
	b, _ := json.Marshal(v)
	return recordedStatus, append(b, '\n')
}

// AppendWriteAnswer appends the JSON of WriteAnswer (as encoding/json
// writes it, newline included) without reflection: it is every single write's answer.
func AppendWriteAnswer(dst []byte, key, version, origin string) []byte {
	dst = append(dst, `{"key":`...)
	dst = jsonstring.Append(dst, key)
	dst = append(dst, `,"version":`...)
	dst = jsonstring.Append(dst, version)
	dst = append(dst, `,"origin":`...)
	dst = jsonstring.Append(dst, origin)
	return append(dst, "}\n"...)
}
