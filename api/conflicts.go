package api

import (
	"net/url"
	"strconv"
	"time"
)

// Conflict is one record of a cluster's conflict log: a version
// last-writer-wins discarded although the winner's author had not seen it
// (GET /admin/conflicts). The same discard has the same ID at every cluster
// that logged it.
type Conflict struct {
	ID     string          `json:"id"`
	Key    string          `json:"key"`
	Loser  ConflictVersion `json:"loser"`
	Winner ConflictVersion `json:"winner"`
	// Discarded says which side lost: "incoming" (the entry that arrived)
	// or "stored" (the version the key held).
	Discarded string `json:"discarded"`
	// Peer is the link the incoming version came over.
	Peer string `json:"peer"`
	// At is the stamp of the command that applied the discard (the log's
	// time, the same on every node of the cluster), Time its wall clock.
	At   string    `json:"at"`
	Time time.Time `json:"time"`
	// Possible: the winner carried no context (a peer of an older build,
	// or a version stored before the log kept contexts), so whether its
	// author had seen the loser is not known.
	Possible bool `json:"possible,omitempty"`
	// Restored is the version of the write that brought the loser back
	// ("": not restored).
	Restored string `json:"restored,omitempty"`
	// Aliases are the IDs the record had before the key moved on and the
	// loss was named against its new version: a restore by one answers
	// 412 naming this record.
	Aliases []string `json:"aliases,omitempty"`
}

// ConflictVersion is one side of a conflict.
type ConflictVersion struct {
	Version string `json:"version"`
	// Time is the version's wall clock (the HLC's), for people.
	Time   time.Time `json:"time"`
	Origin string    `json:"origin"`
	// Deleted: the version was a delete.
	Deleted bool `json:"deleted,omitempty"`
	// Value is the loser's value (base64 in JSON) when the log kept it
	// whole; ValueLen and ValueSHA256 describe it always.
	Value       []byte `json:"value,omitempty"`
	ValueLen    int    `json:"value_len,omitempty"`
	ValueSHA256 string `json:"value_sha256,omitempty"`
	// ValueOmitted: the value was larger than the log keeps.
	ValueOmitted bool `json:"value_omitted,omitempty"`
	// Expires is when the version expired or expires (none: never).
	Expires *time.Time `json:"expires,omitempty"`
}

// ConflictPage is one page of the conflict log, in key order.
type ConflictPage struct {
	Items []Conflict `json:"items"`
	Next  string     `json:"next,omitempty"`
}

// ConflictQuery selects records: one key, or keys under a prefix, logged
// since a time; After is a previous page's Next.
type ConflictQuery struct {
	Key    string
	Prefix string
	Since  time.Time
	After  string
	Limit  int
}

// Values is the query as URL parameters.
func (q ConflictQuery) Values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"key": q.Key, "prefix": q.Prefix, "after": q.After} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}
