package store

import "github.com/replicator/replicator/entry"

// The tree's words live in entry (transport reads them from a snapshot).
type (
	Kind           = entry.Kind
	Record         = entry.Record
	Counter        = entry.Counter
	RangeTombstone = entry.RangeTombstone
	AppliedIndex   = entry.AppliedIndex
)

// Kinds of a key.
const (
	KindPlain   = entry.KindPlain
	KindCounter = entry.KindCounter
)
