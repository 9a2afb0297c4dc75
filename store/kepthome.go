package store

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// A kept-home window says that a peer's filter toward this cluster kept
// the keys of Spans home for entries of its streams committed at Since or
// later (filtered markers stood for them), and that no backfill from the
// peer has carried those ranges since. A rejoin's re-seed from that peer
// may then carry versions of its own there older than this tree's
// collection horizon: not deletes collected here but writes this cluster
// never received (machine.applyInbound takes them as a backfill's).

// KeptHome is one window.
type KeptHome struct {
	Spans []entry.Span  `json:"spans"`
	Since hlc.Timestamp `json:"since"`
}

// MaxKeptHome bounds a peer's windows: past it they merge into one (the
// union of their ranges since the earliest).
const MaxKeptHome = 16

func keptHomeKey(peer string) []byte { return append([]byte{prefixKeptHome}, peer...) }

// KeptHome reads peer's committed windows.
func (b *Batch) KeptHome(peer string) ([]KeptHome, error) {
	v, closer, err := b.s.db.Get(keptHomeKey(peer))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	var out []KeptHome
	if err := json.Unmarshal(v, &out); err != nil {
		return nil, fmt.Errorf("%w: kept-home windows of %q: %v", ErrCorrupt, peer, err)
	}
	return out, nil
}

// SetKeptHome records peer's windows in the batch (none: forgets them).
func (b *Batch) SetKeptHome(peer string, ws []KeptHome) error {
	if len(ws) == 0 {
		return b.pb.Delete(keptHomeKey(peer), nil)
	}
	v, err := json.Marshal(ws)
	if err != nil {
		return err
	}
	return b.pb.Set(keptHomeKey(peer), v, nil)
}

// AddKeptHome returns ws with spans kept home since since: into the
// window of the same ranges (its Since the earlier), or a new one; past
// MaxKeptHome every window merges into one.
func AddKeptHome(ws []KeptHome, spans []entry.Span, since hlc.Timestamp) []KeptHome {
	spans = entry.MergeSpans(spans)
	for i := range ws {
		if spansEqual(ws[i].Spans, spans) {
			if since.Less(ws[i].Since) {
				ws[i].Since = since
			}
			return ws
		}
	}
	ws = append(ws, KeptHome{Spans: spans, Since: since})
	if len(ws) <= MaxKeptHome {
		return ws
	}
	one := KeptHome{Since: ws[0].Since}
	for _, w := range ws {
		one.Spans = append(one.Spans, w.Spans...)
		if w.Since.Less(one.Since) {
			one.Since = w.Since
		}
	}
	one.Spans = entry.MergeSpans(one.Spans)
	return []KeptHome{one}
}

// CarriedKeptHome returns ws less the ranges a backfill carried.
func CarriedKeptHome(ws []KeptHome, carried []entry.Span) []KeptHome {
	var out []KeptHome
	for _, w := range ws {
		if w.Spans = entry.SpansMinus(w.Spans, carried); len(w.Spans) > 0 {
			out = append(out, w)
		}
	}
	return out
}

// KeptHomeHolds reports whether a window of ws kept key home at stamp.
func KeptHomeHolds(ws []KeptHome, key string, stamp hlc.Timestamp) bool {
	for _, w := range ws {
		if !stamp.Less(w.Since) && entry.SpanHolds(w.Spans, key) {
			return true
		}
	}
	return false
}

func spansEqual(a, b []entry.Span) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
