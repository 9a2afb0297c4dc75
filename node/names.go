package node

import "github.com/replicator/replicator/node/api"

// The words of the Go API live in package api (httpapi shares them); these
// names keep node's API whole for its callers.

// Results and reports.
type (
	WriteResult      = api.WriteResult
	CounterResult    = api.CounterResult
	BatchOp          = api.BatchOp
	BulkRecord       = api.BulkRecord
	BulkResult       = api.BulkResult
	Condition        = api.Condition
	PeersReport      = api.PeersReport
	StreamReport     = api.StreamReport
	DigestReport     = api.DigestReport
	WALReport        = api.WALReport
	PeerBacklog      = api.PeerBacklog
	OriginReport     = api.OriginReport
	ClusterReport    = api.ClusterReport
	ClusterNode      = api.ClusterNode
	DeadLetterReport = api.DeadLetterReport
	HistorySample    = api.HistorySample
	PeerSample       = api.PeerSample
	HistoryReport    = api.HistoryReport
	IdemReport       = api.IdemReport
	LagReport        = api.LagReport
	StageReport      = api.StageReport
	SaturationReport = api.SaturationReport
	WaterMarks       = api.WaterMarks
	RejoinReport     = api.RejoinReport
)

// Errors.
type (
	NotFoundError     = api.NotFoundError
	SaturatedError    = api.SaturatedError
	PreconditionError = api.PreconditionError
)

var (
	ErrClosed              = api.ErrClosed
	ErrUnknownOutcome      = api.ErrUnknownOutcome
	ErrNotWritten          = api.ErrNotWritten
	ErrIdempotencyConflict = api.ErrIdempotencyConflict
	ErrPinOutOfWindow      = api.ErrPinOutOfWindow
	ErrInvalidKey          = api.ErrInvalidKey
	ErrKeyTooLarge         = api.ErrKeyTooLarge
	ErrValueTooLarge       = api.ErrValueTooLarge
	ErrNotFound            = api.ErrNotFound
	ErrCatchingUp          = api.ErrCatchingUp
	ErrPrecondition        = api.ErrPrecondition
	ErrKindConflict        = api.ErrKindConflict
	ErrCounterRange        = api.ErrCounterRange
	ErrSaturated           = api.ErrSaturated

	errBadRequest    = api.ErrBadRequest
	errClusterAction = api.ErrNotACluster
)

// Saturation states and overflow modes.
const (
	StateHealthy   = api.StateHealthy
	StateThrottled = api.StateThrottled
	StateSaturated = api.StateSaturated
	OverflowReject = api.OverflowReject
	OverflowDetach = api.OverflowDetach
)
