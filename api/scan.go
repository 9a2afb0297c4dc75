package api

import "github.com/replicator/replicator/entry"

// ScanOptions selects an ordered range of live keys. Prefix, Start/End and
// After combine (all must hold). Limit 0 means DefaultScanLimit.
type ScanOptions struct {
	Prefix string
	Start  string // inclusive
	End    string // exclusive; "" = no upper bound
	After  string // resume strictly after this key (a previous page's Next)
	Limit  int
	// MaxBytes bounds the keys and values of one page (at least one item
	// is returned); 0 means DefaultScanBytes.
	MaxBytes int
	// Now is the reader's time (wall ns): a version expired by then is not
	// listed. 0 lists every live version, expired or not.
	Now int64
}

// DefaultScanLimit and MaxScanLimit bound one page in items,
// DefaultScanBytes in bytes (10,000 values of 1 MiB are not one answer).
const (
	DefaultScanLimit = 100
	MaxScanLimit     = 10000
	DefaultScanBytes = 4 << 20
)

// Item is one live key of a scan.
type Item struct {
	Key string
	entry.Record
}

// IdemRecord is what an Idempotency-Key answered. Records resolve
// last-writer-wins on Stamp like data: when two clusters each took a first
// attempt of the same key before either heard of the other, both converge to
// the record of the write that won.
type IdemRecord struct {
	Key         string
	Fingerprint []byte
	Status      int
	Body        []byte
	Stamp       entry.Stamp // the stamp of the write that created it
	Expires     int64       // wall ns
}
