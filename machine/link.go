package machine

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Link settings are state of the cluster's log: a filter takes effect at a
// stream index (the next one when its command applies), so every node and
// every later leader ships the same entries for the same index, and a
// bandwidth limit survives a failover. The commands exist from command
// format 3 on: a leader proposes one only once the log's Format says every
// node reads it (FormatLinks).

// FormatLinks is the format from which the log may carry link commands.
const FormatLinks = 3

// LinkCmd changes what the log says of the link to Peer.
type LinkCmd struct {
	Peer string
	// SetFilter: Filter is the link's filter for the entries appended from
	// now on (the zero Filter lets every key cross).
	SetFilter bool
	Filter    entry.Filter
	// SetBandwidth: Bandwidth is the link's limit in bytes per second (0:
	// none).
	SetBandwidth bool
	Bandwidth    int64
	// Seed: the command comes from a node's flags, and applies only to a
	// link the log says nothing of yet (after that, the log wins).
	Seed bool
	// BackfillDone: the peer took the backfill of this generation
	// (LinkSettings.BackfillGen); its ranges are no longer pending, unless
	// a widening since made a later generation.
	BackfillDone uint64
	// Release: the operator declares the link's narrowing permanent: the
	// ranges its filter keeps home now keep no tombstones for a later
	// widening (entry.LinkSettings.Released; from format 7).
	Release bool
	// SetFromPeer: Filter is the peer's own filter toward this cluster,
	// and Onward its keep spans toward its other links, as its heartbeat
	// said (entry.LinkSettings.FromPeer, Onward; from format 7).
	SetFromPeer bool
	Onward      []entry.TargetSpans
	// Rebackfill: the peer lost data (its shipper rewound): the ranges a
	// widening backfilled that a recorded filter kept home are backfilled
	// again, as a new generation (entry.LinkSettings.Widenings; from
	// format 7). A backfill has no place in the stream, so a peer restored
	// from a backup taken before it came lacks it whatever its marks say.
	Rebackfill bool
	// SetCompression: Compression ("zstd" or "none") is the link's
	// compression of batch bodies (entry.LinkSettings.Compression; from
	// format 13, FormatLinkCompression).
	SetCompression bool
	Compression    string
	// SetOpen: Open are the peer's open streams, as its heartbeat said
	// (entry.LinkSettings.Open; alone in its command, from format 14,
	// FormatOpenStreams).
	SetOpen bool
	Open    []entry.StreamID
}

// Link command flags, as encoded.
const (
	linkSetFilter    = 1 << 0
	linkSetBandwidth = 1 << 1
	linkSeed         = 1 << 2
	linkRelease      = 1 << 3 // from format 7
	linkFromPeer     = 1 << 4 // from format 7
	linkRebackfill   = 1 << 5 // from format 7
	linkCompression  = 1 << 6 // from format 13
	linkOpenStreams  = 1 << 7 // from format 14, alone
)

// maxFilterEpochs bounds a link's filter history: epochs go once the
// stream no longer keeps entries of them; a change that would keep more is
// refused until the peers acknowledge and the stream is cut.
const maxFilterEpochs = 64

// MaxFilterEpochs is maxFilterEpochs, for the refusal's message.
const MaxFilterEpochs = maxFilterEpochs

func encodeLink(enc *msgpack.Encoder, lc *LinkCmd) error {
	var flags uint8
	if lc.SetFilter {
		flags |= linkSetFilter
	}
	if lc.SetBandwidth {
		flags |= linkSetBandwidth
	}
	if lc.Seed {
		flags |= linkSeed
	}
	if lc.Release {
		flags |= linkRelease
	}
	if lc.SetFromPeer {
		flags |= linkFromPeer
	}
	if lc.Rebackfill {
		flags |= linkRebackfill
	}
	if lc.SetCompression {
		flags |= linkCompression
	}
	if lc.SetOpen {
		flags |= linkOpenStreams
	}
	fields := 7
	if lc.SetFromPeer {
		fields = 8 // and the onward ranges
	}
	if lc.SetCompression {
		fields++ // and the compression, last
	}
	if lc.SetOpen {
		fields++ // and the streams, last
	}
	err := errors.Join(enc.EncodeArrayLen(fields), enc.EncodeUint(uint64(KindLink)), enc.EncodeString(lc.Peer),
		enc.EncodeUint(uint64(flags)), enc.EncodeArrayLen(len(lc.Filter.Include)))
	for _, p := range lc.Filter.Include {
		err = errors.Join(err, enc.EncodeString(p))
	}
	err = errors.Join(err, enc.EncodeArrayLen(len(lc.Filter.Exclude)))
	for _, p := range lc.Filter.Exclude {
		err = errors.Join(err, enc.EncodeString(p))
	}
	err = errors.Join(err, enc.EncodeInt(lc.Bandwidth), enc.EncodeUint(lc.BackfillDone))
	if lc.SetFromPeer {
		err = errors.Join(err, enc.EncodeArrayLen(len(lc.Onward)))
		for _, k := range lc.Onward {
			err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeString(k.Target), enc.EncodeArrayLen(2*len(k.Spans)))
			for _, sp := range k.Spans {
				err = errors.Join(err, enc.EncodeString(sp.Start), enc.EncodeString(sp.End))
			}
		}
	}
	if lc.SetCompression {
		err = errors.Join(err, enc.EncodeString(lc.Compression))
	}
	if lc.SetOpen {
		err = errors.Join(err, enc.EncodeArrayLen(len(lc.Open)))
		for _, st := range lc.Open {
			err = errors.Join(err, enc.EncodeBytes(st[:]))
		}
	}
	return err
}

func decodeLink(dec *msgpack.Decoder, c *Command, n int) error {
	lc := &LinkCmd{}
	var err error
	if lc.Peer, err = dec.DecodeString(); err != nil {
		return err
	}
	if !entry.ValidClusterID(lc.Peer) {
		return fmt.Errorf("link of peer %q", lc.Peer)
	}
	flags, err := dec.DecodeUint8()
	if err != nil {
		return err
	}
	if flags == linkOpenStreams {
		return decodeLinkOpen(dec, c, lc, n)
	}
	if flags&^(linkSetFilter|linkSetBandwidth|linkSeed|linkRelease|linkFromPeer|linkRebackfill|linkCompression) != 0 ||
		flags&(linkSetFilter|linkFromPeer) == linkSetFilter|linkFromPeer || flags&(linkCompression|linkFromPeer) == linkCompression|linkFromPeer {
		return fmt.Errorf("link flags %#x", flags)
	}
	lc.SetFilter, lc.SetBandwidth, lc.Seed = flags&linkSetFilter != 0, flags&linkSetBandwidth != 0, flags&linkSeed != 0
	lc.Release, lc.SetFromPeer, lc.Rebackfill = flags&linkRelease != 0, flags&linkFromPeer != 0, flags&linkRebackfill != 0
	lc.SetCompression = flags&linkCompression != 0
	for _, list := range []*[]string{&lc.Filter.Include, &lc.Filter.Exclude} {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if n < 0 || n > entry.MaxFilterPrefixes {
			return fmt.Errorf("a filter of %d prefixes", n)
		}
		for i := 0; i < n; i++ {
			p, err := dec.DecodeString()
			if err != nil {
				return err
			}
			*list = append(*list, p)
		}
	}
	if err := lc.Filter.Validate(); err != nil {
		return err
	}
	if lc.Bandwidth, err = dec.DecodeInt64(); err != nil {
		return err
	}
	if lc.Bandwidth < 0 {
		return fmt.Errorf("bandwidth %d", lc.Bandwidth)
	}
	if lc.BackfillDone, err = dec.DecodeUint64(); err != nil {
		return err
	}
	want := 7
	if lc.SetFromPeer || lc.SetCompression {
		want = 8
	}
	if n != want {
		return fmt.Errorf("link of %d elements, from-peer %v, compression %v", n, lc.SetFromPeer, lc.SetCompression)
	}
	if lc.SetCompression {
		if lc.Compression, err = dec.DecodeString(); err != nil {
			return err
		}
		if lc.Compression != "zstd" && lc.Compression != "none" {
			return fmt.Errorf("compression %q", lc.Compression)
		}
	}
	if lc.SetFromPeer {
		m, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if m > 0 {
			// The shape of a heartbeat's (wire.DecodeTargetSpans).
			if lc.Onward, err = wire.DecodeTargetSpansAfter(dec, m); err != nil {
				return err
			}
		}
	}
	c.Link = lc
	return nil
}

// decodeLinkOpen reads the rest of a link command that records a peer's
// open streams: no filter, no bandwidth, no generation, and the streams
// (wire.Header.Open's shape).
func decodeLinkOpen(dec *msgpack.Decoder, c *Command, lc *LinkCmd, n int) error {
	if n != 8 {
		return fmt.Errorf("open streams' link of %d elements", n)
	}
	for range 2 {
		if m, err := dec.DecodeArrayLen(); err != nil || m != 0 {
			return fmt.Errorf("open streams' link with a filter (%v)", err)
		}
	}
	bw, err := dec.DecodeInt64()
	if err != nil {
		return err
	}
	gen, err := dec.DecodeUint64()
	if err != nil {
		return err
	}
	if bw != 0 || gen != 0 {
		return fmt.Errorf("open streams' link with bandwidth %d, backfill %d", bw, gen)
	}
	open, err := wire.DecodeOpen(dec)
	if err != nil {
		return err
	}
	lc.SetOpen, lc.Open = true, open
	c.Link = lc
	return nil
}

// applyLink records a link's settings: a filter from the stream's next index
// on, a bandwidth limit at once.
func (m *Machine) applyLink(b *store.Batch, lc *LinkCmd) (*Result, func(), error) {
	links := m.Links()
	ls, had := links[lc.Peer]
	res := &Result{}
	if lc.Seed {
		// A node's flags seed each setting the log does not hold yet;
		// after that, the log's settings win.
		lc2 := *lc
		lc2.SetFilter = lc.SetFilter && (!had || len(ls.Filters) == 0)
		lc2.SetBandwidth = lc.SetBandwidth && !ls.BandwidthSet
		lc2.SetCompression = lc.SetCompression && !ls.CompressionSet
		if !lc2.SetFilter && !lc2.SetBandwidth && !lc2.SetCompression {
			return res, nil, nil
		}
		lc = &lc2
	}
	res.Swapped = true
	if lc.SetOpen {
		ls.Open = slices.Clone(lc.Open)
		if err := b.SetLinkSettings(lc.Peer, ls); err != nil {
			return nil, nil, err
		}
		next := maps.Clone(links)
		next[lc.Peer] = ls
		return res, func() { m.links.Store(&next) }, nil
	}
	ls.Filters = append([]entry.FilterEpoch(nil), ls.Filters...)
	if lc.SetFilter {
		f := lc.Filter.Normal()
		switch {
		case lc.Seed:
			// Flags hold from the start: until this command, leaders
			// shipped by them (Node's link settings), so the log records
			// the filter as holding from the first entry of every stream.
			ls.Filters = []entry.FilterEpoch{{Filter: f}}
		case len(ls.Filters) == 0 || !ls.Current().Equal(f):
			old := ls.Current()
			ls.Filters = append(ls.Filters, entry.FilterEpoch{Stream: m.stream, From: m.last + 1, Filter: f})
			// What the new filter lets cross and the old did not was
			// left out until now: the peer gets what the tree holds of
			// it. Pending ranges the new filter keeps home are dropped.
			wide := f.Widened(old)
			if len(wide) > 0 {
				ls.BackfillGen++
			}
			ls.Backfill = f.ClipSpans(append(slices.Clone(ls.Backfill), wide...))
			// Released ranges the filter lets cross again are released no
			// more: a later narrowing of them keeps their tombstones.
			ls.Released = entry.SpansMinus(ls.Released, f.Spans())
			if len(ls.Released) == 0 {
				ls.Released = nil
			}
			if len(ls.Backfill) > wire.MaxBackfillSpans {
				// Too many ranges for one trailer (widened piecemeal many
				// times): the backfill sends all the filter lets cross.
				ls.Backfill = f.Spans()
			}
		}
		ls.Filters = pruneEpochs(ls.Filters, m.stream, m.out.First())
		if len(ls.Filters) > maxFilterEpochs {
			// The stream still keeps entries of every one of them: none
			// may go (an entry would ship by another filter than its
			// own), so the change is refused (Swapped false).
			return &Result{}, nil, nil
		}
	}
	if lc.SetBandwidth {
		ls.Bandwidth, ls.BandwidthSet = lc.Bandwidth, true
	}
	if lc.SetCompression {
		ls.Compression, ls.CompressionSet = lc.Compression, true
	}
	if lc.BackfillDone != 0 && lc.BackfillDone == ls.BackfillGen {
		ls.Backfill = nil
	}
	if lc.Release {
		ls.Released = ls.Current().Excluded()
	}
	if lc.Rebackfill {
		if wide := ls.Widenings(); len(wide) > 0 {
			cur := ls.Current()
			ls.BackfillGen++
			ls.Backfill = cur.ClipSpans(append(slices.Clone(ls.Backfill), wide...))
			if len(ls.Backfill) > wire.MaxBackfillSpans {
				ls.Backfill = cur.Spans()
			}
		}
	}
	if lc.SetFromPeer {
		f := lc.Filter.Normal()
		if !f.All() || (ls.FromPeer != nil && !ls.FromPeer.All()) {
			// Every stream of the peer held here may lack what the filter
			// kept home, or kept until now (a widening's backfill brings
			// the keys, not the entries' identities).
			hwms, err := b.HWMsOf(lc.Peer)
			if err != nil {
				return nil, nil, err
			}
			ls.Partial = slices.Clone(ls.Partial)
			for _, h := range hwms {
				if !slices.Contains(ls.Partial, entry.StreamID(h.Stream)) {
					ls.Partial = append(ls.Partial, entry.StreamID(h.Stream))
				}
			}
			if n := len(ls.Partial); n > entry.MaxPartialStreams {
				ls.Partial = ls.Partial[n-entry.MaxPartialStreams:]
			}
		}
		ls.FromPeer = &f
		ls.Onward = lc.Onward
	}
	if err := b.SetLinkSettings(lc.Peer, ls); err != nil {
		return nil, nil, err
	}
	next := maps.Clone(links)
	next[lc.Peer] = ls
	return res, func() { m.links.Store(&next) }, nil
}

// pruneEpochs drops the epochs no entry still kept needs: those of an
// earlier stream but the last, and those of stream superseded at or before
// first (the first index the stream still keeps).
func pruneEpochs(eps []entry.FilterEpoch, stream entry.StreamID, first uint64) []entry.FilterEpoch {
	keep := eps[:0:0]
	for i, ep := range eps {
		if i+1 < len(eps) {
			nx := eps[i+1]
			if nx.Stream != stream && ep.Stream != stream {
				continue // both before this stream: the later one holds
			}
			if nx.Stream == stream && nx.From <= first {
				continue // superseded before every entry kept
			}
		}
		keep = append(keep, ep)
	}
	return keep
}

// Links is what the log says of every link (read-only: a new map replaces
// it at each change).
func (m *Machine) Links() map[string]entry.LinkSettings {
	if p := m.links.Load(); p != nil {
		return *p
	}
	return nil
}

// Link is what the log says of the link to peer.
func (m *Machine) Link(peer string) entry.LinkSettings { return m.Links()[peer] }

func (m *Machine) loadLinks() error {
	links, err := m.st.LinkSettings()
	if err != nil {
		return fmt.Errorf("machine: open: %w", err)
	}
	m.links.Store(&links)
	return nil
}
