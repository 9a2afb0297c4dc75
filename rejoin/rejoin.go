package rejoin

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Link is what a rejoin uses of the link to a peer (transport.Shipper).
type Link interface {
	Name() string
	// Rebase ships the new stream from its start.
	Rebase()
	// SetRejoining says this node's rejoin phase with the peer in its
	// heartbeats.
	SetRejoining(phase uint8)
	// Owe, Disown and RejoinSeed arm (or disarm) the re-seeds the link
	// sends the peer.
	Owe()
	Disown()
	RejoinSeed()
}

// Deps is what the rejoin needs of its node: its cluster's identity and
// records, its links, and the log.
type Deps struct {
	Cluster string
	Store   *store.Store
	Clock   *hlc.Clock
	Logger  *slog.Logger
	// Configured are the peers of this node's flags (InsecurePeers: any
	// peer may come back unconfigured); IdentityCheckWait is how long
	// writes wait at start for every peer's first answer (< 0: not).
	Configured        []string
	InsecurePeers     bool
	IdentityCheckWait time.Duration
	// Stream is the cluster's stream; Epoch its counters' epoch.
	Stream func() entry.StreamID
	Epoch  func() uint32
	// Links are the links to the peers; Link the one to peer.
	Links func() []Link
	Link  func(peer string) (Link, bool)
	// Apply and UpdateRecord go through the cluster's log; Exclusive runs
	// a function between the committer's groups; Failed says the write
	// path stopped; Closing that the node shuts down.
	Apply        func(*machine.Command) error
	UpdateRecord func(peer string, record byte, f func(byte) byte) (byte, error)
	Exclusive    func(func())
	Failed       func() error
	Closing      func() bool
}

// Rejoiner is what the node remembers in memory about its identity, and
// the rejoin it coordinates.
type Rejoiner struct {
	d  Deps
	mu struct {
		sync.Mutex
		answered  map[string]bool // links that answered since start
		fenceOpen bool
		lossSeen  bool // a peer showed this node lost data: rejoin started
	}
	fence chan struct{} // closed once writes may be stamped
	// startHLC is the highest stamp this directory remembered at start
	// (after recovery): a peer holding a write of this cluster stamped
	// above it holds a write of a later life of the directory, which a
	// restore from a backup or a wipe lost.
	startHLC hlc.Timestamp
}

// DefaultIdentityCheckWait is how long writes wait at start, when the node
// reopens a stream that existed before, for every peer to answer once (a
// peer that holds entries of the stream the WAL does not reveals a
// restored or copied directory before any index is reused).
const DefaultIdentityCheckWait = 2 * time.Second

// New makes the fence writes wait behind; InitIdentity decides when it
// opens.
func New(d Deps) *Rejoiner {
	rs := &Rejoiner{d: d, fence: make(chan struct{})}
	rs.mu.answered = map[string]bool{}
	return rs
}

// Fence is closed once writes may be stamped.
func (rs *Rejoiner) Fence() <-chan struct{} { return rs.fence }

// InitIdentity decides, at open (in a cluster of several: at this
// process's first term), whether writes wait for the peers' first
// answers, and whether the node must learn if its cluster lost data.
func (j *Rejoiner) InitIdentity(created bool) error {
	d := j.d
	rs := j
	rs.startHLC = d.Clock.Last()
	if created || len(d.Configured) == 0 || d.IdentityCheckWait < 0 {
		// A new stream's indexes were never used: nothing to check first.
		j.openFence()
		return nil
	}
	time.AfterFunc(d.IdentityCheckWait, j.fenceTimeout)
	return nil
}

// fenceTimeout opens the fence when some peer did not answer in time. The
// stream goes on (its indexes are checked with that peer at its first
// answer), but counters count under a new epoch: if that peer does hold
// entries of this stream from a past life of the directory, the totals it
// holds must not absorb increments taken meanwhile.
func (j *Rejoiner) fenceTimeout() {
	d := j.d
	rs := j
	rs.mu.Lock()
	if rs.mu.fenceOpen || d.Closing() {
		rs.mu.Unlock()
		return
	}
	var silent []string
	for _, sh := range d.Links() {
		if p := sh.Name(); !rs.mu.answered[p] {
			silent = append(silent, p)
		}
	}
	rs.mu.Unlock()
	if len(silent) > 0 {
		// Random, not the next number: the epoch is stored in the data
		// directory, and a restored backup would count up to an epoch its
		// later life already used, whose totals the peers hold.
		epoch := rand.Uint32()
		for epoch == 0 || epoch == d.Epoch() {
			epoch = rand.Uint32()
		}
		// Through the log, between groups: an increment stamped before is
		// counted under the old epoch, every later one under the new.
		var err error
		d.Exclusive(func() {
			err = d.Apply(&machine.Command{Mint: &machine.MintCmd{Stream: d.Stream(), Epoch: epoch}})
		})
		if err != nil {
			d.Logger.Error("recording a new counter epoch", "err", err)
		} else {
			d.Logger.Warn("peers did not answer before writes resumed: counting under a new epoch",
				"silent", silent, "waited", d.IdentityCheckWait, "epoch", epoch)
		}
	}
	j.openFence()
}

func (j *Rejoiner) openFence() {
	rs := j
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rs.mu.fenceOpen {
		rs.mu.fenceOpen = true
		close(rs.fence)
	}
}

// OnAck learns from a peer's answer: once every link answered, writes go
// ahead; a peer holding a write of this cluster stamped above anything this
// directory remembered at start means the directory lost data (restored
// from an older backup, or wiped), and the node rejoins.
func (j *Rejoiner) OnAck(peer string, ack *wire.Ack) {
	d := j.d
	rs := j
	theirs, _ := hlc.Parse(ack.OriginFrontier)
	rs.mu.Lock()
	rs.mu.answered[peer] = true
	all := true
	for _, sh := range d.Links() {
		if !rs.mu.answered[sh.Name()] {
			all = false
		}
	}
	lost := !rs.mu.lossSeen && rs.startHLC.Less(theirs)
	if lost {
		rs.mu.lossSeen = true
	}
	rs.mu.Unlock()
	if lost {
		// Seal before writes go ahead: this directory's stream (and its
		// counter totals) may have a later life a peer holds, even where
		// no peer holds its entries (totals relayed by a re-seed), and
		// continuing it could reuse what that life used.
		why := fmt.Sprintf("peer %s holds a write of cluster %s stamped %s, after anything this data directory remembers (%s): "+
			"it lost data (a wipe, or a restore from an older backup)", peer, d.Cluster, theirs, rs.startHLC)
		if err := j.SealStream(d.Stream(), why); err != nil {
			d.Logger.Error("sealing the stream after a loss of data", "err", err)
			j.startRejoin(why)
		}
	}
	if all {
		j.openFence()
	}
}

// OnConflict seals the stream a peer proved was used before, and rejoins.
// It runs on the shipper's goroutine; the replacement waits for the
// committer's current group.
func (j *Rejoiner) OnConflict(peer string, stream entry.StreamID, why string) {
	d := j.d
	go func() {
		// Exits once the stream is replaced (or the node closes).
		if err := j.SealStream(stream, fmt.Sprintf("peer %s: %s", peer, why)); err != nil {
			d.Logger.Error("replacing the stream after an identity conflict", "err", err)
		}
	}()
}

// SealStream ends stream old and begins a new one through the cluster's
// log, then rejoins (nothing when old was already replaced: several links
// may prove the same conflict). Entries of the old stream the peers did not
// have reach them by the rejoin's re-seeds (they are all applied to the
// store); the old stream's entries stay in the tree until then.
func (j *Rejoiner) SealStream(old entry.StreamID, why string) (err error) {
	j.d.Exclusive(func() { err = j.sealStreamLocked(old, why) })
	return err
}

// sealStreamLocked is SealStream with no group of the committer in flight.
func (j *Rejoiner) sealStreamLocked(old entry.StreamID, why string) error {
	d := j.d
	if d.Closing() {
		return api.ErrClosed
	}
	if d.Stream() != old {
		return nil
	}
	if err := d.Failed(); err != nil {
		return fmt.Errorf("rejoin: not sealing stream %s while the write path is failed (restart the node): %w", old, err)
	}
	// The rejoin is recorded before the new stream: a crash in between
	// restarts on the old stream, which a peer proves used again.
	asked := j.recordRejoin()
	if err := d.Apply(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
		return fmt.Errorf("rejoin: begin a new stream after sealing %s: %w", old, err)
	}
	// The rejoin is recorded: the peers' answers need not start another.
	j.mu.Lock()
	j.mu.lossSeen = true
	j.mu.Unlock()
	for _, sh := range d.Links() {
		sh.Rebase()
	}
	d.Logger.Error("stream sealed: its indexes were used before; began a new stream and rejoining the peers",
		"why", why, "sealed_stream", old, "new_stream", d.Stream(), "peers", len(asked))
	for _, sh := range asked {
		sh.SetRejoining(store.RejoinRequesting)
	}
	return nil
}

// recordRejoin records a rejoin with every linked peer and returns their
// links (not asked yet).
func (j *Rejoiner) recordRejoin() []Link {
	d := j.d
	var out []Link
	for _, sh := range d.Links() {
		p := sh.Name()
		if err := j.updateRejoin(p, func(byte) byte { return store.RejoinRequesting }); err != nil {
			d.Logger.Error("recording the rejoin", "peer", p, "err", err)
			continue
		}
		out = append(out, sh)
	}
	return out
}

// startRejoin asks every linked peer for a re-seed (recorded, so a restart
// goes on asking).
func (j *Rejoiner) startRejoin(why string) {
	d := j.d
	asked := j.recordRejoin()
	if len(asked) == 0 {
		d.Logger.Warn("lost data, but no peer to rejoin", "why", why)
		return
	}
	for _, sh := range asked {
		sh.SetRejoining(store.RejoinRequesting)
	}
	d.Logger.Warn("rejoining: asking every peer for a re-seed", "why", why, "peers", len(asked))
}

// PruneReseedState forgets R and J records of peers no longer configured: a
// rejoin must not wait forever for a peer that was removed.
func (j *Rejoiner) PruneReseedState() error {
	d := j.d
	if d.InsecurePeers {
		return nil // peers need no configuration: any may come back
	}
	configured := map[string]bool{}
	for _, p := range d.Configured {
		configured[p] = true
	}
	req, err := d.Store.ReseedRequests()
	if err != nil {
		return err
	}
	rj, err := d.Store.Rejoin()
	if err != nil {
		return err
	}
	zero := func(byte) byte { return 0 }
	for p := range req {
		if !configured[p] {
			d.Logger.Warn("forgetting a re-seed request of a peer no longer configured", "peer", p)
			if err := j.updateReseed(p, zero); err != nil {
				return err
			}
		}
	}
	for p := range rj {
		if !configured[p] {
			d.Logger.Warn("rejoin: forgetting a peer no longer configured", "peer", p)
			if err := j.updateRejoin(p, zero); err != nil {
				return err
			}
		}
	}
	return nil
}

// RestoreReseedState applies the persisted R and J records to a new link.
func (j *Rejoiner) RestoreReseedState(sh Link) {
	d := j.d
	p := sh.Name()
	req, err := d.Store.ReseedRequests()
	if err != nil {
		d.Logger.Error("reading re-seed requests", "err", err)
	}
	if req[p]&store.ReseedRequested != 0 {
		sh.Owe()
	}
	rj, err := d.Store.Rejoin()
	if err != nil {
		d.Logger.Error("reading rejoin records", "err", err)
	}
	sh.SetRejoining(rj[p])
	if rj[p] == store.RejoinSeeding && allSeeding(rj) {
		sh.RejoinSeed()
	}
}

func allSeeding(rj map[string]byte) bool {
	for _, ph := range rj {
		if ph != store.RejoinSeeding {
			return false
		}
	}
	return true
}

// OnReseedRequest: a peer lost data and asked for a re-seed (or no longer
// needs the one it asked for).
func (j *Rejoiner) OnReseedRequest(peer string, owed bool) {
	d := j.d
	if sh, ok := d.Link(peer); ok {
		if owed {
			sh.Owe()
		} else {
			sh.Disown()
		}
	}
}

// OnTrailer: a re-seed ended here. When the last one this node asked for is
// in, it re-seeds every peer in turn.
func (j *Rejoiner) OnTrailer(peer string, requested, _ bool) {
	d := j.d
	if !requested {
		return
	}
	if sh, ok := d.Link(peer); ok {
		sh.SetRejoining(store.RejoinSeeding)
	}
	rj, err := d.Store.Rejoin()
	if err != nil {
		d.Logger.Error("reading rejoin records", "err", err)
		return
	}
	if !allSeeding(rj) {
		d.Logger.Info("rejoin: re-seed received", "peer", peer, "waiting_for", waitingFor(rj))
		return
	}
	d.Logger.Info("rejoin: every peer's re-seed is in; re-seeding the peers in turn")
	for _, sh := range d.Links() {
		if rj[sh.Name()] == store.RejoinSeeding {
			sh.RejoinSeed()
		}
	}
}

func waitingFor(rj map[string]byte) []string {
	var out []string
	for p, ph := range rj {
		if ph == store.RejoinRequesting {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// OnReseedDone: a re-seed this node sent was acknowledged to its trailer.
func (j *Rejoiner) OnReseedDone(peer string, requested, rejoin bool) {
	d := j.d
	// A failed record (the node lost its lead, say) would leave the log
	// saying the re-seed is still owed while the link believes it done:
	// the peer would wait for it forever. The link owes it again instead,
	// and its next end records it (a re-seed may be sent twice).
	rearm := func(f func(Link)) {
		if sh, ok := d.Link(peer); ok {
			f(sh)
		}
	}
	if requested {
		err := j.updateReseed(peer, func(f byte) byte { return f &^ store.ReseedRequested })
		if err != nil {
			d.Logger.Error("clearing a re-seed request; the re-seed is owed again", "peer", peer, "err", err)
			rearm(Link.Owe)
		}
	}
	if rejoin {
		// Only a rejoin still at seeding ends: a newer one (the node lost
		// data again meanwhile) goes on.
		err := j.updateRejoin(peer, func(ph byte) byte {
			if ph == store.RejoinSeeding {
				return 0
			}
			return ph
		})
		if err != nil {
			d.Logger.Error("recording the rejoin's end; the rejoin's re-seed is owed again", "peer", peer, "err", err)
			rearm(Link.RejoinSeed)
			return
		}
		if rj, err := d.Store.Rejoin(); err == nil {
			if sh, ok := d.Link(peer); ok {
				sh.SetRejoining(rj[peer])
			}
		}
		if rj, err := d.Store.Rejoin(); err == nil && len(rj) == 0 {
			d.Logger.Info("rejoin complete: every peer has this node's data")
		}
	}
}

func (j *Rejoiner) Report() api.RejoinReport {
	d := j.d
	var r api.RejoinReport
	if rj, err := d.Store.Rejoin(); err == nil {
		for p, ph := range rj {
			if r.Phases == nil {
				r.Phases = map[string]string{}
			}
			r.Phases[p] = map[byte]string{store.RejoinRequesting: "requesting", store.RejoinSeeding: "seeding"}[ph]
		}
	}
	if rr, err := d.Store.ReseedRequests(); err == nil {
		for p, f := range rr {
			if r.Requests == nil {
				r.Requests = map[string][]string{}
			}
			if f&store.ReseedRequested != 0 {
				r.Requests[p] = append(r.Requests[p], "owed")
			}
			if f&store.AwaitRejoin != 0 {
				r.Requests[p] = append(r.Requests[p], "awaiting")
			}
		}
	}
	return r
}

// updateReseed and updateRejoin change a peer's R record (re-seed request
// flags) and J record (this node's rejoin phase) through the log.
func (j *Rejoiner) updateReseed(peer string, f func(byte) byte) error {
	d := j.d
	_, err := d.UpdateRecord(peer, machine.RecordReseed, f)
	return err
}

func (j *Rejoiner) updateRejoin(peer string, f func(byte) byte) error {
	d := j.d
	_, err := d.UpdateRecord(peer, machine.RecordRejoin, f)
	return err
}
