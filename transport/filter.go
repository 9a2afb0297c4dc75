package transport

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/wire"
)

// A link's filter decides what of each entry crosses it (docs/DATAMODEL.md,
// "Filters"). The filter for an entry is the one the cluster's log says
// held at its index, so every node, and every later leader, sends the same
// thing for the same index. An entry whose keys all stay home is left out,
// and the run of such entries travels as one filtered marker (its index
// range and the commit of its last entry); an entry some of whose keys
// cross is cut to them.

// errNoMarkers: the link's filter leaves entries out, and the peer does not
// say it takes filtered markers (a build before them, or a cluster whose
// log has not moved to them yet). Nothing is sent: sending the entries
// whole would cross the filter.
var errNoMarkers = errors.New("transport: the link's filter leaves entries out, and the peer does not take filtered markers yet (upgrade every node of it)")

// maxScan bounds the indexes one batch looks at, so that a long run of
// entries the filter leaves out still moves the cursor in steps.
const maxScan = 1 << 16

// Keep says what of an entry crosses a filter.
type Keep uint8

const (
	KeepNone Keep = iota // nothing: a marker stands for it
	KeepAll              // the entry as it is
	KeepPart             // the entry cut to the keys that cross
)

// Project returns what of e crosses f: KeepAll (e unchanged), KeepNone, or
// KeepPart with the entry cut to the keys that cross. A range delete is
// clipped to the filter's spans (several become an atomic batch of range
// deletes); an atomic batch keeps the ops that cross, still atomic. An
// idempotency record crosses only with every key its request wrote: a part
// of a request is not the request, and a retry at the receiver must not be
// answered as though all of it were written there.
func Project(e *entry.Entry, f entry.Filter) (entry.Entry, Keep) {
	if f.All() {
		return *e, KeepAll
	}
	switch e.Op {
	case entry.OpDeleteRange:
		spans := f.Clip(e.Key, e.End)
		switch {
		case len(spans) == 0:
			return entry.Entry{}, KeepNone
		case len(spans) == 1 && spans[0].Start == e.Key && spans[0].End == e.End:
			return *e, KeepAll
		case len(spans) == 1:
			out := *e
			out.Key, out.End, out.Idem = spans[0].Start, spans[0].End, nil
			return out, KeepPart
		}
		out := *e
		out.Op, out.Key, out.End, out.Idem = entry.OpMulti, "", "", nil
		out.Ops = make([]entry.BatchOp, 0, len(spans))
		for _, sp := range spans {
			out.Ops = append(out.Ops, entry.BatchOp{Op: entry.OpDeleteRange, Key: sp.Start, End: sp.End})
		}
		return out, KeepPart
	case entry.OpMulti:
		var ops []entry.BatchOp
		whole := true
		for _, op := range e.Ops {
			if op.Op != entry.OpDeleteRange {
				if f.Match(op.Key) {
					ops = append(ops, op)
				} else {
					whole = false
				}
				continue
			}
			spans := f.Clip(op.Key, op.End)
			if len(spans) != 1 || spans[0].Start != op.Key || spans[0].End != op.End {
				whole = false
			}
			for _, sp := range spans {
				ops = append(ops, entry.BatchOp{Op: entry.OpDeleteRange, Key: sp.Start, End: sp.End})
			}
		}
		switch {
		case whole:
			return *e, KeepAll
		case len(ops) == 0:
			return entry.Entry{}, KeepNone
		}
		out := *e
		out.Ops, out.Idem = ops, nil
		return out, KeepPart
	default:
		// A set, a delete, a counter's totals: they follow their key, as a
		// conditional write does (it is a set or a delete once decided).
		if f.Match(e.Key) {
			return *e, KeepAll
		}
		return entry.Entry{}, KeepNone
	}
}

// projector cuts the entries of one batch to the link's filter.
type projector struct {
	settings entry.LinkSettings
	stream   entry.StreamID
	defs     wire.Defaults
	codec    *wire.Codec
	// marker is the run being left out (marker.Index 0: none).
	marker entry.Entry
	// filter and until cache the filter of the last index looked at.
	filter entry.Filter
	until  uint64
	from   uint64
}

// newProjector returns a projector of the entries of stream after acked,
// or nil when no filter leaves anything out of them.
func newProjector(ls entry.LinkSettings, stream entry.StreamID, local string, acked uint64) *projector {
	if !ls.Filtering(stream, acked) {
		return nil
	}
	return &projector{settings: ls, stream: stream, defs: wire.Defaults{Origin: local, Stream: stream}, codec: wire.NewCodec()}
}

// filterAt is the filter for entry i.
func (p *projector) filterAt(i uint64) entry.Filter {
	if p.from == 0 || i < p.from || i > p.until {
		p.filter, p.until = p.settings.FilterAt(p.stream, i)
		p.from = i
	}
	return p.filter
}

// project returns what of raw, the entry at i, crosses: raw itself, a new
// encoding of the part that crosses, or nil when nothing does (the entry
// joins the pending marker).
func (p *projector) project(i uint64, raw []byte) ([]byte, error) {
	f := p.filterAt(i)
	if f.All() {
		return raw, nil
	}
	e, err := p.codec.DecodeEntry(raw, p.defs)
	if err != nil {
		return nil, fmt.Errorf("transport: decode wal entry %d to filter it: %w", i, err)
	}
	out, keep := Project(&e, f)
	switch keep {
	case KeepNone:
		if p.marker.Index == 0 {
			p.marker = entry.Entry{Index: i, Origin: e.Origin, Stream: e.Stream}
		}
		p.marker.FilteredTo, p.marker.Commit = i, e.Commit
		return nil, nil
	case KeepPart:
		return p.codec.AppendEntry(nil, &out, p.defs), nil
	}
	return raw, nil
}

// flush returns the pending marker's encoding (nil: none), and forgets it.
func (p *projector) flush() []byte {
	if p.marker.Index == 0 {
		return nil
	}
	b := p.codec.AppendEntry(nil, &p.marker, p.defs)
	p.marker = entry.Entry{}
	return b
}

// settings is what the log says of this link now.
func (s *Shipper) settings() entry.LinkSettings {
	if s.opts.Link == nil {
		return entry.LinkSettings{}
	}
	return s.opts.Link(s.peer.Name)
}

// projector returns the projector of the entries after acked (nil: every
// key of them crosses).
func (s *Shipper) projector(stream entry.StreamID, acked uint64) *projector {
	if s.opts.Link == nil {
		return nil
	}
	return newProjector(s.settings(), stream, s.opts.Local, acked)
}

// takesMarkers reports whether the peer said it takes filtered markers.
func (s *Shipper) takesMarkers() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.Markers
}

// takesContexts reports whether the peer said its log keeps causal
// contexts: to another, entries go without them.
// tellsFilter says whether the peer records this cluster's filter toward
// it (heartbeats then carry it).
func (s *Shipper) tellsFilter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.OriginFilters
}

// takesIdle says whether the peer takes an idle frontier in heartbeats.
func (s *Shipper) takesIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.IdleFrontiers
}

// takesOpen says whether the peer records this cluster's open streams.
func (s *Shipper) takesOpen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.OpenStreams
}

// openUntold says the peer records this cluster's open streams and was not
// told the ones open now (a heartbeat goes out at once: a stream begun is
// told before its entries flow).
func (s *Shipper) openUntold() bool {
	if s.opts.OpenStreams == nil || !s.takesOpen() {
		return false
	}
	open := s.opts.OpenStreams()
	if !slices.Contains(open, s.log.Stream()) {
		return false // read across a change of the stream: the next look tells
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !slices.Equal(s.mu.openTold, open)
}

// filterUntold says the peer takes this cluster's filter and was not told
// the one in force now (a heartbeat goes out at once).
func (s *Shipper) filterUntold() bool {
	if !s.tellsFilter() {
		return false
	}
	_, _, now := s.filterNow()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.filterTold != now
}

// filterNow is what heartbeats tell the peer of this cluster's filters: its
// filter toward the peer, the ranges it keeps for its other links, and
// both as one string (what filterTold holds once told).
func (s *Shipper) filterNow() (entry.Filter, []wire.TargetSpans, string) {
	ls := s.settings()
	f := ls.Current().Normal()
	var keeps []wire.TargetSpans
	if s.opts.Keeps != nil {
		keeps = s.opts.Keeps(s.peer.Name)
		// Past the wire's bounds the peer keeps less (nothing this
		// cluster holds is lost by it: only a wiped cluster's way back).
		if len(keeps) > wire.MaxKeeps {
			keeps = keeps[:wire.MaxKeeps]
		}
		for i := range keeps {
			if len(keeps[i].Spans) > wire.MaxKeepSpans {
				keeps[i].Spans = keeps[i].Spans[:wire.MaxKeepSpans]
			}
		}
	}
	var b strings.Builder
	b.WriteString(f.String())
	for _, k := range keeps {
		fmt.Fprintf(&b, ";%s:%v", k.Target, k.Spans)
	}
	return f, keeps, b.String()
}

func (s *Shipper) takesExpiry() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.Expiry
}

func (s *Shipper) takesFloors() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.Floors
}

// errNoExpiry: the next entry carries an expiry (or counter floors) and
// the peer's build cannot keep it: it waits (and every entry behind it)
// until the peer is upgraded. Dropping the expiry would keep the key there
// for ever, dropping floors a deleted counter's increments.
var errNoExpiry = errors.New("transport: the next entry expires or carries counter floors, and the peer does not keep them yet (upgrade every node of it); the link waits")

// How an expiry, floors and a clear begin on the wire (msgpack's fixstr
// "ex", "fl", "cl"): an entry without these bytes carries none.
var exField, flField, clField = []byte("\xa2ex"), []byte("\xa2fl"), []byte("\xa2cl")

// heldBack reports whether the encoded entry p carries what the peer does
// not keep: an expiry (without expiryOK) or floors (without floorsOK).
func heldBack(codec *wire.Codec, p []byte, d wire.Defaults, expiryOK, floorsOK bool) (bool, error) {
	ex := !expiryOK && bytes.Contains(p, exField)
	fl := !floorsOK && (bytes.Contains(p, flField) || bytes.Contains(p, clField))
	if !ex && !fl {
		return false, nil
	}
	e, err := codec.DecodeEntry(p, d)
	if err != nil {
		return false, err
	}
	return (ex && e.HasExpiry()) || (fl && e.HasFloors()), nil
}

func (s *Shipper) takesContexts() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil && s.mu.limits.Contexts
}

// ctxField is how an entry's context field begins on the wire (msgpack's
// fixstr "cx"): an entry without these bytes has none to strip.
var ctxField, rsField = []byte("\xa2cx"), []byte("\xa2rs")

// stripContexts re-encodes a WAL entry without its causal contexts, for a
// peer that does not take them (an entry that has none is returned as is).
func stripContexts(codec *wire.Codec, raw []byte, defs wire.Defaults) ([]byte, error) {
	if !bytes.Contains(raw, ctxField) && !bytes.Contains(raw, rsField) {
		return raw, nil
	}
	e, err := codec.DecodeEntry(raw, defs)
	if err != nil {
		return nil, err
	}
	if len(e.Ctx) == 0 && e.Restores == nil && !opsHaveContexts(&e) {
		return raw, nil
	}
	e.Ctx, e.Restores = nil, nil
	for i := range e.Ops {
		e.Ops[i].Ctx = nil
	}
	return codec.AppendEntry(nil, &e, defs), nil
}

func opsHaveContexts(e *entry.Entry) bool {
	for i := range e.Ops {
		if len(e.Ops[i].Ctx) > 0 {
			return true
		}
	}
	return false
}

// knowsLimits reports whether the peer has told its limits yet.
func (s *Shipper) knowsLimits() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits != nil
}
