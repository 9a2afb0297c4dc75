package entry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Filter says which keys cross one link: a key crosses when it starts with
// one of Include (or Include is empty) and with none of Exclude. The zero
// Filter lets every key cross. Filters are state of the cluster's log (a
// link command), so every node of a cluster, and every later leader, ships
// the same entries for the same index.
type Filter struct {
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
}

// MaxFilterPrefixes bounds the prefixes of one filter, and MaxPrefix one
// prefix (a key's own bound).
const (
	MaxFilterPrefixes = 64
	MaxPrefix         = 4096
)

// ErrFilter is the class of errors for a filter that cannot be used.
var ErrFilter = errors.New("entry: invalid filter")

// All reports whether every key crosses.
func (f Filter) All() bool { return len(f.Include) == 0 && len(f.Exclude) == 0 }

// Match reports whether key crosses.
func (f Filter) Match(key string) bool {
	for _, p := range f.Exclude {
		if strings.HasPrefix(key, p) {
			return false
		}
	}
	if len(f.Include) == 0 {
		return true
	}
	for _, p := range f.Include {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// Equal reports whether f and g let the same keys cross, as written
// (Normal forms compare equal exactly when they do).
func (f Filter) Equal(g Filter) bool {
	f, g = f.Normal(), g.Normal()
	return slices.Equal(f.Include, g.Include) && slices.Equal(f.Exclude, g.Exclude)
}

// Normal returns f with its prefixes sorted and deduplicated, and any
// prefix another of its list already covers dropped: the form the log
// records, so that two ways of writing one filter are one filter.
func (f Filter) Normal() Filter {
	return Filter{Include: minimalPrefixes(f.Include), Exclude: minimalPrefixes(f.Exclude)}
}

func minimalPrefixes(ps []string) []string {
	if len(ps) == 0 {
		return nil
	}
	s := slices.Clone(ps)
	slices.Sort(s)
	out := s[:0]
	for _, p := range s {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue // covered by a shorter prefix (or a repeat)
		}
		out = append(out, p)
	}
	return slices.Clip(out)
}

// Validate reports every problem of f at once.
func (f Filter) Validate() error {
	var errs []error
	if n := len(f.Include) + len(f.Exclude); n > MaxFilterPrefixes {
		errs = append(errs, fmt.Errorf("%w: %d prefixes, at most %d", ErrFilter, n, MaxFilterPrefixes))
	}
	for _, l := range []struct {
		name string
		ps   []string
	}{{"include", f.Include}, {"exclude", f.Exclude}} {
		for _, p := range l.ps {
			switch {
			case p == "":
				errs = append(errs, fmt.Errorf("%w: an empty %s prefix (leave the list empty to include every key)", ErrFilter, l.name))
			case len(p) > MaxPrefix:
				errs = append(errs, fmt.Errorf("%w: %s prefix of %d bytes, at most %d", ErrFilter, l.name, len(p), MaxPrefix))
			case !utf8.ValidString(p):
				errs = append(errs, fmt.Errorf("%w: %s prefix %q is not UTF-8", ErrFilter, l.name, p))
			}
		}
	}
	return errors.Join(errs...)
}

// String is the filter as an operator writes it.
func (f Filter) String() string {
	if f.All() {
		return "every key"
	}
	var parts []string
	for _, p := range f.Include {
		parts = append(parts, "+"+p)
	}
	for _, p := range f.Exclude {
		parts = append(parts, "-"+p)
	}
	return strings.Join(parts, " ")
}

// Span is a range of keys [Start, End); End "" is the end of the key space.
type Span struct {
	Start string `json:"start"`
	End   string `json:"end,omitempty"`
}

// Widened returns the key ranges f lets cross and old did not.
func (f Filter) Widened(old Filter) []Span {
	spans := f.Spans()
	for _, o := range old.Spans() {
		var out []Span
		for _, s := range spans {
			out = append(out, s.minus(o)...)
		}
		spans = out
	}
	return spans
}

// MergeSpans sorts spans and joins those that overlap or touch.
func MergeSpans(spans []Span) []Span {
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b Span) int { return strings.Compare(a.Start, b.Start) })
	var out []Span
	for _, sp := range s {
		if n := len(out); n > 0 && (out[n-1].End == "" || sp.Start <= out[n-1].End) {
			if out[n-1].End != "" && (sp.End == "" || sp.End > out[n-1].End) {
				out[n-1].End = sp.End
			}
			continue
		}
		out = append(out, sp)
	}
	return out
}

// ClipSpans returns the parts of spans f lets cross.
func (f Filter) ClipSpans(spans []Span) []Span {
	var out []Span
	for _, sp := range spans {
		out = append(out, f.Clip(sp.Start, sp.End)...)
	}
	return MergeSpans(out)
}

// Spans returns the key ranges f lets cross, sorted and disjoint.
func (f Filter) Spans() []Span {
	f = f.Normal()
	var in []Span
	if len(f.Include) == 0 {
		in = []Span{{}}
	}
	for _, p := range f.Include {
		in = append(in, Span{Start: p, End: PrefixEnd(p)})
	}
	// Includes are minimal and sorted, so their spans are disjoint and in
	// order. Take each exclude's span out of them.
	for _, p := range f.Exclude {
		cut := Span{Start: p, End: PrefixEnd(p)}
		var out []Span
		for _, s := range in {
			out = append(out, s.minus(cut)...)
		}
		in = out
	}
	return in
}

// Clip returns the parts of [start, end) that f lets cross, in order.
func (f Filter) Clip(start, end string) []Span {
	var out []Span
	for _, s := range f.Spans() {
		lo := max(s.Start, start)
		hi := minEnd(s.End, end)
		if hi == "" || lo < hi {
			out = append(out, Span{Start: lo, End: hi})
		}
	}
	return out
}

// KeepsHome reports that f, a cluster's filter toward a peer, keeps e home:
// a set, delete or increment of a key it does not let cross, or a range
// delete no part of which crosses (a part that does is sent whole). What a
// third cluster relays of that cluster's writes is judged by it too.
func (f Filter) KeepsHome(e *Entry) bool {
	if f.All() {
		return false
	}
	switch e.Op {
	case OpDeleteRange:
		return len(f.Clip(e.Key, e.End)) == 0
	case OpSet, OpDelete, OpCounter:
		return !f.Match(e.Key)
	}
	return false
}

// Excluded returns the key ranges f keeps home (the complement of Spans),
// sorted and disjoint.
func (f Filter) Excluded() []Span {
	if f.All() {
		return nil
	}
	return SpansMinus([]Span{{}}, f.Spans())
}

// SpansMinus returns the parts of a outside every span of b.
func SpansMinus(a, b []Span) []Span {
	out := MergeSpans(a)
	for _, c := range b {
		var next []Span
		for _, s := range out {
			next = append(next, s.minus(c)...)
		}
		out = next
	}
	return out
}

// SpanHolds reports whether one of spans holds key.
func SpanHolds(spans []Span, key string) bool {
	for _, s := range spans {
		if key >= s.Start && (s.End == "" || key < s.End) {
			return true
		}
	}
	return false
}

// SpansMeet reports whether [start, end) (end "": the end of the key
// space) meets one of spans.
func SpansMeet(spans []Span, start, end string) bool {
	for _, s := range spans {
		if (end == "" || s.Start < end) && (s.End == "" || start < s.End) {
			return true
		}
	}
	return false
}

// minus returns s without c.
func (s Span) minus(c Span) []Span {
	var out []Span
	// The part below c.
	if s.Start < c.Start {
		out = append(out, Span{Start: s.Start, End: minEnd(s.End, c.Start)})
	}
	// The part above c (nothing when c runs to the end).
	if c.End != "" && (s.End == "" || c.End < s.End) {
		out = append(out, Span{Start: max(s.Start, c.End), End: s.End})
	}
	return out
}

// minEnd is the lower of two span ends, "" being the end of the key space.
func minEnd(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return min(a, b)
}

// PrefixEnd is the least key above every key that starts with p ("" when
// there is none): p with its last rune raised by one. UTF-8 orders bytes as
// code points, so raising the rune, not the byte, keeps the end UTF-8 (a
// range's end is a key on the wire).
func PrefixEnd(p string) string {
	for p != "" {
		r, size := utf8.DecodeLastRuneInString(p)
		p = p[:len(p)-size]
		switch {
		case r == utf8.MaxRune:
			continue // nothing above it: raise the rune before
		case r == 0xD7FF:
			r = 0xE000 // past the surrogates, which UTF-8 cannot hold
		default:
			r++
		}
		return p + string(r)
	}
	return ""
}

// FilterEpoch is one filter of a link and where it takes effect: the
// entries of Stream from index From on (an epoch recorded under an earlier
// stream holds from the start of every later one, until the next epoch).
type FilterEpoch struct {
	Stream StreamID `json:"stream"`
	From   uint64   `json:"from"`
	Filter Filter   `json:"filter"`
}

// LinkSettings are what the cluster's log says of one link: its filters
// over the stream, oldest first, and its bandwidth limit.
type LinkSettings struct {
	Filters []FilterEpoch `json:"filters,omitempty"`
	// Bandwidth is the link's limit in bytes per second of request bodies
	// as sent (0: none).
	Bandwidth int64 `json:"bandwidth,omitempty"`
	// BandwidthSet: the log set Bandwidth (a node's flags seed it only
	// until then).
	BandwidthSet bool `json:"bandwidth_set,omitempty"`
	// Compression is the link's compression of batch bodies ("zstd" or
	// "none"); CompressionSet says the log set it (from format 13: a
	// node's flags seed it only until then).
	Compression    string `json:"compression,omitempty"`
	CompressionSet bool   `json:"compression_set,omitempty"`
	// Runtime is the peer as `replicator peer add` added it (from format
	// 13; nil: a peer of the flags, or removed): the links are made from
	// it as from a configured peer.
	Runtime *RuntimePeer `json:"runtime,omitempty"`
	// Backfill are the ranges widened filters newly included that the
	// peer has not been sent yet: the leader's link sends what the tree
	// holds of them, and a command clears them once the peer took it.
	Backfill []Span `json:"backfill,omitempty"`
	// BackfillGen counts the widenings; the command that clears Backfill
	// names the generation it sent, so a widening meanwhile stays pending.
	BackfillGen uint64 `json:"backfill_gen,omitempty"`
	// Released are ranges the filter keeps home whose narrowing the
	// operator declared permanent: the cluster keeps no tombstone of them
	// for a later widening (KeepSpans). A widening takes its ranges out.
	Released []Span `json:"released,omitempty"`
	// FromPeer is the peer's own filter toward this cluster, as its
	// heartbeats last said (nil: it never said, a build before it): what
	// other clusters relay of the peer's writes in snapshots is kept to it
	// (issue 45).
	FromPeer *Filter `json:"from_peer,omitempty"`
	// Onward are the peer's KeepSpans toward each of its other links, as
	// its heartbeats last said: this cluster keeps the peer's own deletes
	// there too (a delete the peer holds back for a link, and loses with
	// its data, comes back to it by its rejoin).
	Onward []TargetSpans `json:"onward,omitempty"`
	// Partial are the peer's streams of which this cluster may lack
	// entries, or parts of them, because the peer's filter toward it
	// kept them home (recorded whenever a heartbeat told a filter that is
	// not every key, or the change from one): a re-seed from here does not
	// claim to hold them whole (no mark of them in its trailer).
	Partial []StreamID `json:"partial,omitempty"`
	// Open are the peer's open streams, as its heartbeats last said (nil:
	// it never said, a build before it; issue 51): every stream of the
	// peer's that may still carry entries. Tombstone collection waits for
	// the least advanced of them (links.Set.TombstoneCutoff).
	Open []StreamID `json:"open,omitempty"`
}

// MaxPartialStreams bounds LinkSettings.Partial (the newest are kept: a
// peer's streams before are long sealed).
const MaxPartialStreams = 64

// TargetSpans are ranges of a link to Target.
type TargetSpans struct {
	Target string `json:"target"`
	Spans  []Span `json:"spans"`
}

// KeepSpans are the ranges whose tombstones and range tombstones the
// cluster keeps for this link, whatever the collection cutoff (issue 45):
// what its filter keeps home now (a delete there was not delivered: a
// filtered marker stood for it, and only a widening's backfill can carry
// it), less what the operator released, and what a widening has still to
// backfill.
func (l *LinkSettings) KeepSpans() []Span {
	f := l.Current()
	spans := SpansMinus(f.Excluded(), l.Released)
	return MergeSpans(append(spans, l.Backfill...))
}

// Current is the filter in force for entries appended from now on.
func (l *LinkSettings) Current() Filter {
	if len(l.Filters) == 0 {
		return Filter{}
	}
	return l.Filters[len(l.Filters)-1].Filter
}

// Widenings returns the ranges the current filter lets cross that a filter
// the settings still record kept home: what a widening's backfill carried
// to the peer, which a peer that lost data may have lost with it.
func (l *LinkSettings) Widenings() []Span {
	cur := l.Current()
	var wide []Span
	for _, ep := range l.Filters {
		wide = append(wide, cur.Widened(ep.Filter)...)
	}
	return cur.ClipSpans(wide)
}

// FilterAt returns the filter for entry index of stream, and the last index
// it holds for (math.MaxUint64: every later one).
func (l *LinkSettings) FilterAt(stream StreamID, index uint64) (Filter, uint64) {
	var f Filter
	until := ^uint64(0)
	for i := len(l.Filters) - 1; i >= 0; i-- {
		ep := l.Filters[i]
		if ep.Stream == stream && ep.From > index {
			until = ep.From - 1
			continue
		}
		f = ep.Filter
		break
	}
	return f, until
}

// Filtering reports whether any filter of the settings leaves keys out of
// the entries of stream after index.
func (l *LinkSettings) Filtering(stream StreamID, after uint64) bool {
	for i := len(l.Filters) - 1; i >= 0; i-- {
		ep := l.Filters[i]
		if !ep.Filter.All() {
			return true
		}
		if ep.Stream != stream || ep.From <= after+1 {
			return false // epochs before it hold for no entry after `after`
		}
	}
	return false
}

// RuntimePeer is a peer cluster added at run time.
type RuntimePeer struct {
	// URLs are the peer's replicate endpoints (any of its nodes).
	URLs []string `json:"urls"`
	// Secret is the link's secret sealed under the cluster's secrets key
	// (internal/secret.Seal, bound to the peer's name); none: the peer is
	// authenticated by its certificate.
	Secret []byte `json:"secret,omitempty"`
	// Added is the log index of the command that added it.
	Added uint64 `json:"added"`
}
