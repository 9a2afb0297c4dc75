package machine

import (
	"encoding/json"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
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

// The recorded answers' shapes are the contract's words (package api).
type (
	AnswerKind    = api.AnswerKind
	WriteAnswer   = api.WriteAnswer
	RangeAnswer   = api.RangeAnswer
	CounterAnswer = api.CounterAnswer
	BatchAnswer   = api.BatchAnswer
)

const (
	AnswerWrite   = api.AnswerWrite
	AnswerRange   = api.AnswerRange
	AnswerCounter = api.AnswerCounter
	AnswerBatch   = api.AnswerBatch
	answerKinds   = api.AnswerBatch + 1
)

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

// AppendWriteAnswer appends the JSON of WriteAnswer (api.AppendWriteAnswer).
func AppendWriteAnswer(dst []byte, key, version, origin string) []byte {
	return api.AppendWriteAnswer(dst, key, version, origin)
}
