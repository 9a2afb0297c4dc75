package client

import "github.com/replicator/replicator/api"

// The link's report types live in package api (the contract's words): the
// transport reports in them, and the client decodes them.
type (
	LinkStatus        = api.LinkStatus
	KeptTombstones    = api.KeptTombstones
	BackfillStatus    = api.BackfillStatus
	Span              = api.Span
	ReseedStatus      = api.ReseedStatus
	Thresholds        = api.Thresholds
	PeerLimits        = api.PeerLimits
	AntiEntropyStatus = api.AntiEntropyStatus
)
