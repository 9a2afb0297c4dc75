package links

import (
	"cmp"
	"fmt"
	"github.com/replicator/replicator/internal/secret"
	"log/slog"
	"net/url"
	"sync"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
)

// Configured is a peer as this node's flags or YAML name it: the filter and
// bandwidth limit its link starts with until the cluster's log says
// otherwise.
type Configured struct {
	Name      string
	Filter    entry.Filter
	Bandwidth int64
	// Compression is "zstd", "none" or "" (none, not declared).
	Compression string
}

// SettingsDeps is what Settings needs of its node.
type SettingsDeps struct {
	// Configured are this node's peers.
	Configured []Configured
	// Machine is the state machine (it may be replaced: read it each
	// time); Stream the cluster's stream.
	Machine func() *machine.Machine
	Stream  func() entry.StreamID
	// Apply and Commit put a command through the cluster's log.
	Apply  func(*machine.Command) error
	Commit func(*machine.Command) (*machine.Result, error)
	// Leading: this node leads and its term began.
	Leading func() bool
	// Status is every link's report (its peers known); Kept and
	// KeptForPeerLinks what the last collection kept for a link.
	Status                 func() []api.LinkStatus
	Kept, KeptForPeerLinks func(peer string) *api.KeptTombstones
	// SecretsKey seals the secrets of peers added at run time (none: only
	// peers without a secret may be).
	SecretsKey []byte
	Logger     *slog.Logger
}

// Settings keeps each link's settings in step with the cluster's log
// (filters, bandwidth) and answers the admin API on them.
type Settings struct {
	d     SettingsDeps
	seeds linkSeeds // what of flags and log differences was said
}

// NewSettings builds a link's settings from d.
func NewSettings(d SettingsDeps) *Settings { return &Settings{d: d} }

// linkSeeds remembers which differences between flags and log a node
// already logged, so that it says so once per process.
type linkSeeds struct {
	mu     sync.Mutex
	warned map[string]bool
}

// Of is what the links ship by: the log's settings of the link or, before
// the log says anything of it, the filter of this node's flags, as holding
// from the first entry (the seed command records it so).
func (l *Settings) Of(peer string) entry.LinkSettings {
	ls := l.d.Machine().Links()[peer]
	if p, ok := l.peerOption(peer); ok {
		if len(ls.Filters) == 0 && !p.Filter.All() {
			ls.Filters = []entry.FilterEpoch{{Filter: p.Filter.Normal()}}
		}
		if !ls.BandwidthSet {
			ls.Bandwidth = p.Bandwidth
		}
		if !ls.CompressionSet {
			ls.Compression = p.Compression
		}
	}
	return ls
}

// peerOption is the configured peer of that name.
func (l *Settings) peerOption(name string) (Configured, bool) {
	for _, p := range l.d.Configured {
		if p.Name == name {
			return p, true
		}
	}
	return Configured{}, false
}

// Seed, at the leader, records the filter of each configured peer's
// flags in the log if the log says nothing of that link yet, and says once
// where the flags differ from what the log says (the log wins).
func (l *Settings) Seed() {
	d := l.d
	m := d.Machine()
	if !d.Leading() || m.Format() < machine.FormatLinks {
		return
	}
	links := m.Links()
	for _, p := range d.Configured {
		f := p.Filter.Normal()
		ls, ok := links[p.Name]
		seed := &machine.LinkCmd{Peer: p.Name, Seed: true}
		if !ok || len(ls.Filters) == 0 {
			seed.SetFilter, seed.Filter = !f.All(), f
		}
		if !ls.BandwidthSet {
			seed.SetBandwidth, seed.Bandwidth = p.Bandwidth > 0, p.Bandwidth
		}
		if !ls.CompressionSet && p.Compression != "" && m.Format() >= machine.FormatLinkCompression {
			seed.SetCompression, seed.Compression = true, p.Compression
		}
		for _, dr := range l.Drift(p.Name) {
			if l.seeds.warnOnce(p.Name + "/" + dr.Setting) {
				d.Logger.Warn("this node's flags or YAML declare another "+dr.Setting+" for this link than the cluster's log holds: "+
					"the log's is in force (change it with replicator "+dr.Setting+" PEER, or make the flag match)",
					"peer", p.Name, "declared", dr.Declared, "in_force", dr.InForce)
			}
		}
		if !seed.SetFilter && !seed.SetBandwidth && !seed.SetCompression {
			continue
		}
		if err := d.Apply(&machine.Command{Link: seed}); err != nil {
			d.Logger.Warn("could not record the link's settings in the log; trying again", "peer", p.Name, "err", err)
			return
		}
		d.Logger.Info("the link's settings, from this node's flags, are now the cluster's", "peer", p.Name, "filter", f.String(), "bandwidth", p.Bandwidth,
			"compression", p.Compression)
	}
}

func (s *linkSeeds) warnOnce(peer string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned[peer] {
		return false
	}
	if s.warned == nil {
		s.warned = map[string]bool{}
	}
	s.warned[peer] = true
	return true
}

// LinkFilter is what the log says of the filter of the link to peer (and
// where each of its epochs took effect).
func (l *Settings) LinkFilter(peer string) (api.FilterReport, error) {
	if !l.Known(peer) {
		return api.FilterReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	return l.filterReport(peer), nil
}

func (l *Settings) filterReport(peer string) api.FilterReport {
	d := l.d
	m := d.Machine()
	ls := l.Of(peer)
	recorded := len(m.Links()[peer].Filters) > 0
	r := api.FilterReport{Peer: peer, Filter: ls.Current(), Recorded: recorded, Backfill: ls.Backfill, BackfillGeneration: ls.BackfillGen,
		Released: ls.Released, Kept: d.Kept(peer), PeerKeeps: ls.Onward, KeptForPeerLinks: d.KeptForPeerLinks(peer),
		PeerFilter: ls.FromPeer}
	for _, st := range ls.Partial {
		r.PartialStreams = append(r.PartialStreams, st.String())
	}
	if m.Format() >= machine.FormatKeptTombstones {
		r.Keep = ls.KeepSpans()
	}
	stream := d.Stream()
	for _, ep := range ls.Filters {
		e := api.FilterEpochReport{Filter: ep.Filter, From: ep.From}
		if ep.Stream != stream {
			e.From = 1 // holds from the start of this stream
		}
		r.Epochs = append(r.Epochs, e)
	}
	return r
}

// SetLinkFilter makes f the filter of the link to peer, from the stream's
// next index on. Widening it backfills the newly included keys to the peer;
// narrowing it stops shipping them (the peer keeps what it has).
func (l *Settings) SetLinkFilter(peer string, f entry.Filter) (api.FilterReport, error) {
	d := l.d
	if !l.Known(peer) {
		return api.FilterReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if err := f.Validate(); err != nil {
		return api.FilterReport{}, fmt.Errorf("%w: %w", api.ErrBadRequest, err)
	}
	if v := d.Machine().Format(); v < machine.FormatLinks {
		return api.FilterReport{}, fmt.Errorf("%w: the cluster's log is at format %d; filters need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatLinks)
	}
	if ls := d.Machine().Links()[peer]; len(ls.Filters) == 0 {
		// What the links ship by until now is the flags' filter: the log
		// records it first, so that the change widens or narrows from it.
		if p, ok := l.peerOption(peer); ok && !p.Filter.All() {
			seed := &machine.LinkCmd{Peer: peer, SetFilter: true, Filter: p.Filter.Normal(), Seed: true}
			if err := d.Apply(&machine.Command{Link: seed}); err != nil {
				return api.FilterReport{}, err
			}
		}
	}
	res, err := d.Commit(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetFilter: true, Filter: f.Normal()}})
	if err != nil {
		return api.FilterReport{}, err
	}
	if !res.Swapped && !res.Skipped {
		return api.FilterReport{}, fmt.Errorf("%w: the link to %s has %d filters in force for entries its stream still keeps (the bound): "+
			"change it again once the peer has acknowledged those entries and the stream was cut", api.ErrNotWritten, peer, machine.MaxFilterEpochs)
	}
	d.Logger.Warn("the link's filter changed", "peer", peer, "filter", f.Normal().String())
	return l.filterReport(peer), nil
}

// ReleaseLinkFilter declares the narrowing of the link to peer permanent:
// the ranges its filter keeps home now keep no tombstones for a later
// widening any more (the next collection drops them once past the cutoff).
// A later widening of them backfills what the tree holds then; keys the
// peer holds that this cluster deleted meanwhile stay there, and a
// comparison lists them as possible resurrections (docs/DATAMODEL.md
// "Filters").
func (l *Settings) ReleaseLinkFilter(peer string) (api.FilterReport, error) {
	d := l.d
	if !l.Known(peer) {
		return api.FilterReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if v := d.Machine().Format(); v < machine.FormatKeptTombstones {
		return api.FilterReport{}, fmt.Errorf("%w: the cluster's log is at format %d; releasing a narrowing needs format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatKeptTombstones)
	}
	if ls := l.Of(peer); ls.Current().All() {
		return api.FilterReport{}, fmt.Errorf("%w: the link to %s lets every key cross: there is no narrowing to release", api.ErrBadRequest, peer)
	}
	if ls := d.Machine().Links()[peer]; len(ls.Filters) == 0 {
		// The flags' filter, not recorded yet: the log records it first.
		if p, ok := l.peerOption(peer); ok && !p.Filter.All() {
			seed := &machine.LinkCmd{Peer: peer, SetFilter: true, Filter: p.Filter.Normal(), Seed: true}
			if err := d.Apply(&machine.Command{Link: seed}); err != nil {
				return api.FilterReport{}, err
			}
		}
	}
	if _, err := d.Commit(&machine.Command{Link: &machine.LinkCmd{Peer: peer, Release: true}}); err != nil {
		return api.FilterReport{}, err
	}
	d.Logger.Warn("the link's narrowing declared permanent: the tombstones kept for a widening go at the next collection", "peer", peer,
		"released", l.Of(peer).Released)
	return l.filterReport(peer), nil
}

// Known reports a peer this node links to or takes writes from.
func (l *Settings) Known(peer string) bool {
	if _, ok := l.peerOption(peer); ok {
		return true
	}
	for _, st := range l.d.Status() {
		if st.Peer == peer {
			return true
		}
	}
	return false
}

// SetLinkBandwidth sets the link's limit in bytes per second of request
// bodies as sent (0: none), through the log: it holds at once, at every
// node that leads later too.
func (l *Settings) SetLinkBandwidth(peer string, bytesPerSec int64) (api.BandwidthReport, error) {
	d := l.d
	if !l.Known(peer) {
		return api.BandwidthReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if bytesPerSec < 0 || (bytesPerSec > 0 && bytesPerSec < 1024) {
		return api.BandwidthReport{}, fmt.Errorf("%w: bandwidth %d bytes/s: 0 (no limit) or at least 1024", api.ErrBadRequest, bytesPerSec)
	}
	if v := d.Machine().Format(); v < machine.FormatLinks {
		return api.BandwidthReport{}, fmt.Errorf("%w: the cluster's log is at format %d; link settings need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatLinks)
	}
	if _, err := d.Commit(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetBandwidth: true, Bandwidth: bytesPerSec}}); err != nil {
		return api.BandwidthReport{}, err
	}
	d.Logger.Warn("the link's bandwidth limit changed", "peer", peer, "bytes_per_second", bytesPerSec)
	return l.LinkBandwidth(peer)
}

// LinkBandwidth is the link's bandwidth limit and how long it throttled.
func (l *Settings) LinkBandwidth(peer string) (api.BandwidthReport, error) {
	d := l.d
	if !l.Known(peer) {
		return api.BandwidthReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	ls := l.Of(peer)
	r := api.BandwidthReport{Peer: peer, BytesPerSecond: ls.Bandwidth, Recorded: ls.BandwidthSet}
	for _, st := range d.Status() {
		if st.Peer == peer {
			r.ThrottledSeconds = st.ThrottledSeconds
		}
	}
	return r, nil
}

// Drift lists the settings of the link to peer that this node's flags or
// YAML declare otherwise than the cluster's log holds (the log's are in
// force: docs/OPERATIONS.md "Declared and in force"). A setting the log
// never recorded is the flags' own, and never drifts.
func (l *Settings) Drift(peer string) []api.ConfigDrift {
	p, ok := l.peerOption(peer)
	if !ok {
		return nil
	}
	return DriftOf(p, l.d.Machine().Links()[peer])
}

// DriftOf lists the settings of a link that p declares otherwise than ls,
// what the cluster's log holds of it, says (Settings.Drift).
func DriftOf(p Configured, ls entry.LinkSettings) []api.ConfigDrift {
	return api.DriftOf(p.Filter, p.Bandwidth, p.Compression, ls)
}

// SetLinkCompression sets the link's compression of batch bodies ("zstd"
// or "none") through the log: it holds at once, at every node that leads
// later too.
func (l *Settings) SetLinkCompression(peer, c string) (api.CompressionReport, error) {
	d := l.d
	if !l.Known(peer) {
		return api.CompressionReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if c != "zstd" && c != "none" {
		return api.CompressionReport{}, fmt.Errorf("%w: compression %q: zstd or none", api.ErrBadRequest, c)
	}
	if v := d.Machine().Format(); v < machine.FormatLinkCompression {
		return api.CompressionReport{}, fmt.Errorf("%w: the cluster's log is at format %d; a link's compression needs format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatLinkCompression)
	}
	if _, err := d.Commit(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetCompression: true, Compression: c}}); err != nil {
		return api.CompressionReport{}, err
	}
	d.Logger.Warn("the link's compression changed", "peer", peer, "compression", c)
	return l.LinkCompression(peer)
}

// LinkCompression is the link's compression and whether the log holds it.
func (l *Settings) LinkCompression(peer string) (api.CompressionReport, error) {
	if !l.Known(peer) {
		return api.CompressionReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	ls := l.Of(peer)
	return api.CompressionReport{Peer: peer, Compression: cmp.Or(ls.Compression, "none"), Recorded: ls.CompressionSet}, nil
}

// AddPeer adds a peer cluster at run time, through the log (machine.PeerCmd):
// every node lets it in, the leader links to it. Its secret is sealed
// under the secrets key before it is proposed: the log, its snapshots and
// backups never hold it in clear. The peer must add this cluster too.
func (l *Settings) AddPeer(name string, urls []string, sec string) (api.PeerReport, error) {
	d := l.d
	switch {
	case !entry.ValidClusterID(name):
		return api.PeerReport{}, fmt.Errorf("%w: peer name %q", api.ErrBadRequest, name)
	case len(urls) == 0 || len(urls) > 16:
		return api.PeerReport{}, fmt.Errorf("%w: %d URLs: give 1 to 16", api.ErrBadRequest, len(urls))
	}
	for _, u := range urls {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return api.PeerReport{}, fmt.Errorf("%w: URL %q: want http(s)://HOST:PORT", api.ErrBadRequest, u)
		}
	}
	if _, ok := l.peerOption(name); ok {
		return api.PeerReport{}, fmt.Errorf("%w: %q is a peer of this node's flags or YAML: change them (docs/OPERATIONS.md \"Declared and in force\")",
			api.ErrBadRequest, name)
	}
	if v := d.Machine().Format(); v < machine.FormatRuntimePeers {
		return api.PeerReport{}, fmt.Errorf("%w: the cluster's log is at format %d; peers added at run time need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatRuntimePeers)
	}
	var sealed []byte
	if sec != "" {
		if len(sec) < 16 {
			return api.PeerReport{}, fmt.Errorf("%w: a link secret of %d bytes: at least 16", api.ErrBadRequest, len(sec))
		}
		var err error
		if sealed, err = secret.Seal(d.SecretsKey, name, sec); err != nil {
			return api.PeerReport{}, fmt.Errorf("%w: %w", api.ErrBadRequest, err)
		}
	}
	if _, err := d.Commit(&machine.Command{Peer: &machine.PeerCmd{Name: name, URLs: urls, Secret: sealed}}); err != nil {
		return api.PeerReport{}, err
	}
	d.Logger.Warn("peer added at run time", "peer", name, "urls", urls, "secret", sec != "")
	return l.Peer(name)
}

// RemovePeer removes a peer added at run time, through the log: its link
// stops, the stream is no longer kept for it, and its requests are
// refused; its marks and dead letters stay (docs/OPERATIONS.md).
func (l *Settings) RemovePeer(name string) (api.PeerReport, error) {
	d := l.d
	if d.Machine().Link(name).Runtime == nil {
		if _, ok := l.peerOption(name); ok {
			return api.PeerReport{}, fmt.Errorf("%w: %q is a peer of this node's flags or YAML: remove it there", api.ErrBadRequest, name)
		}
		return api.PeerReport{}, fmt.Errorf("%w: no peer %q added at run time", api.ErrNotFound, name)
	}
	if _, err := d.Commit(&machine.Command{Peer: &machine.PeerCmd{Name: name, Remove: true}}); err != nil {
		return api.PeerReport{}, err
	}
	d.Logger.Warn("peer removed at run time", "peer", name)
	return api.PeerReport{Name: name, Removed: true}, nil
}

// Peer is what the log holds of a peer added at run time (never its
// secret, sealed or not).
func (l *Settings) Peer(name string) (api.PeerReport, error) {
	rp := l.d.Machine().Link(name).Runtime
	if rp == nil {
		return api.PeerReport{}, fmt.Errorf("%w: no peer %q added at run time", api.ErrNotFound, name)
	}
	return api.PeerReport{Name: name, URLs: rp.URLs, Secret: len(rp.Secret) > 0, AddedAt: rp.Added}, nil
}
