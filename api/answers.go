package api

import "github.com/replicator/replicator/internal/jsonstring"

// The answers a keyed request records (machine.Answer renders them, in
// commit order, from the entry and the decision alone, so every node of a
// cluster records the same bytes and a retry sent to any of them replays
// them).

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
