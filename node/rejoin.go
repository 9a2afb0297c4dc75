package node

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// Stream identity and rejoining after data loss.
//
// A stream's indexes must never mean two different writes. A data directory
// restored from a backup (or copied) holds a WAL whose tail peers may have
// seen with other content: a peer that answers a high-water mark the WAL
// does not hold, or another commit HLC at an index it does, proves it. The
// node then seals the stream (sets the WAL aside) and begins a new one, and
// rejoins. A node whose WAL is new (wiped, or its WAL moved away) learns the
// same from the first peer that holds streams of its cluster it no longer
// has.
//
// Rejoining: the node asks every peer for a re-seed (recorded by the peer,
// and only such a requested re-seed may bring back writes of the node's own
// cluster: what it lost). Once every peer's snapshot is in, it re-seeds every
// peer in turn, so that what only some peers had of its lost stream reaches
// the others. Both sides keep tombstones until the rejoin ends. Every step
// is recorded in the store (R and J records), so restarts resume it.

// rejoiner is what the node remembers in memory about its identity.
type rejoiner struct {
	n  *Node // whose stream, store and links the rejoin coordinates
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

// IdentityCheckWait is how long writes wait at start, when the node reopens
// a stream that existed before, for every peer to answer once (a peer that
// holds entries of the stream the WAL does not reveals a restored or copied
// directory before any index is reused).
const defaultIdentityCheckWait = 2 * time.Second

// init makes the fence writes wait behind; initIdentity decides when it
// opens.
func (rs *rejoiner) init() {
	rs.fence = make(chan struct{})
	rs.mu.answered = map[string]bool{}
}

// initIdentity decides, at open (in a cluster of several: at this
// process's first term), whether writes wait for the peers' first
// answers, and whether the node must learn if its cluster lost data.
func (j *rejoiner) initIdentity(created bool) error {
	n := j.n
	rs := j
	rs.startHLC = n.clock.Last()
	if created || len(n.opts.Peers) == 0 || n.opts.IdentityCheckWait < 0 {
		// A new stream's indexes were never used: nothing to check first.
		j.openFence()
		return nil
	}
	time.AfterFunc(n.opts.IdentityCheckWait, j.fenceTimeout)
	return nil
}

// fenceTimeout opens the fence when some peer did not answer in time. The
// stream goes on (its indexes are checked with that peer at its first
// answer), but counters count under a new epoch: if that peer does hold
// entries of this stream from a past life of the directory, the totals it
// holds must not absorb increments taken meanwhile.
func (j *rejoiner) fenceTimeout() {
	n := j.n
	rs := j
	rs.mu.Lock()
	if rs.mu.fenceOpen || n.closing.Load() {
		rs.mu.Unlock()
		return
	}
	var silent []string
	for _, sh := range n.repl.links() {
		if p := sh.Peer().Name; !rs.mu.answered[p] {
			silent = append(silent, p)
		}
	}
	rs.mu.Unlock()
	if len(silent) > 0 {
		// Random, not the next number: the epoch is stored in the data
		// directory, and a restored backup would count up to an epoch its
		// later life already used, whose totals the peers hold.
		epoch := rand.Uint32()
		for epoch == 0 || epoch == n.machine.Epoch() {
			epoch = rand.Uint32()
		}
		// Through the log, between groups: an increment stamped before is
		// counted under the old epoch, every later one under the new.
		var err error
		n.com.Exclusive(func() {
			err = n.cons.applyCommand(&machine.Command{Mint: &machine.MintCmd{Stream: n.out.Stream(), Epoch: epoch}})
		})
		if err != nil {
			n.log.Error("recording a new counter epoch", "err", err)
		} else {
			n.log.Warn("peers did not answer before writes resumed: counting under a new epoch",
				"silent", silent, "waited", n.opts.IdentityCheckWait, "epoch", epoch)
		}
	}
	j.openFence()
}

func (j *rejoiner) openFence() {
	rs := j
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rs.mu.fenceOpen {
		rs.mu.fenceOpen = true
		close(rs.fence)
	}
}

// onAck learns from a peer's answer: once every link answered, writes go
// ahead; a peer holding a write of this cluster stamped above anything this
// directory remembered at start means the directory lost data (restored
// from an older backup, or wiped), and the node rejoins.
func (j *rejoiner) onAck(peer string, ack *wire.Ack) {
	n := j.n
	rs := j
	theirs, _ := hlc.Parse(ack.OriginFrontier)
	rs.mu.Lock()
	rs.mu.answered[peer] = true
	all := true
	for _, sh := range n.repl.links() {
		if !rs.mu.answered[sh.Peer().Name] {
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
			"it lost data (a wipe, or a restore from an older backup)", peer, n.cluster, theirs, rs.startHLC)
		if err := j.sealStream(n.out.Stream(), why); err != nil {
			n.log.Error("sealing the stream after a loss of data", "err", err)
			j.startRejoin(why)
		}
	}
	if all {
		j.openFence()
	}
}

// onConflict seals the stream a peer proved was used before, and rejoins.
// It runs on the shipper's goroutine; the replacement waits for the
// committer's current group.
func (j *rejoiner) onConflict(peer string, stream entry.StreamID, why string) {
	n := j.n
	go func() {
		// Exits once the stream is replaced (or the node closes).
		if err := j.sealStream(stream, fmt.Sprintf("peer %s: %s", peer, why)); err != nil {
			n.log.Error("replacing the stream after an identity conflict", "err", err)
		}
	}()
}

// sealStream ends stream old and begins a new one through the cluster's
// log, then rejoins (nothing when old was already replaced: several links
// may prove the same conflict). Entries of the old stream the peers did not
// have reach them by the rejoin's re-seeds (they are all applied to the
// store); the old stream's entries stay in the tree until then.
func (j *rejoiner) sealStream(old entry.StreamID, why string) (err error) {
	j.n.com.Exclusive(func() { err = j.sealStreamLocked(old, why) })
	return err
}

// sealStreamLocked is sealStream with no group of the committer in flight.
func (j *rejoiner) sealStreamLocked(old entry.StreamID, why string) error {
	n := j.n
	if n.closing.Load() {
		return api.ErrClosed
	}
	if n.out.Stream() != old {
		return nil
	}
	if err := n.com.Failed(); err != nil {
		return fmt.Errorf("node: not sealing stream %s while the write path is failed (restart the node): %w", old, err)
	}
	// The rejoin is recorded before the new stream: a crash in between
	// restarts on the old stream, which a peer proves used again.
	asked := j.recordRejoin()
	if err := n.cons.applyCommand(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
		return fmt.Errorf("node: begin a new stream after sealing %s: %w", old, err)
	}
	// The rejoin is recorded: the peers' answers need not start another.
	j.mu.Lock()
	j.mu.lossSeen = true
	j.mu.Unlock()
	for _, sh := range n.repl.links() {
		sh.Rebase()
	}
	n.log.Error("stream sealed: its indexes were used before; began a new stream and rejoining the peers",
		"why", why, "sealed_stream", old, "new_stream", n.out.Stream(), "peers", len(asked))
	for _, sh := range asked {
		sh.SetRejoining(store.RejoinRequesting)
	}
	return nil
}

// recordRejoin records a rejoin with every linked peer and returns their
// links (not asked yet).
func (j *rejoiner) recordRejoin() []*transport.Shipper {
	n := j.n
	var out []*transport.Shipper
	for _, sh := range n.repl.links() {
		p := sh.Peer().Name
		if err := j.updateRejoin(p, func(byte) byte { return store.RejoinRequesting }); err != nil {
			n.log.Error("recording the rejoin", "peer", p, "err", err)
			continue
		}
		out = append(out, sh)
	}
	return out
}

// startRejoin asks every linked peer for a re-seed (recorded, so a restart
// goes on asking).
func (j *rejoiner) startRejoin(why string) {
	n := j.n
	asked := j.recordRejoin()
	if len(asked) == 0 {
		n.log.Warn("lost data, but no peer to rejoin", "why", why)
		return
	}
	for _, sh := range asked {
		sh.SetRejoining(store.RejoinRequesting)
	}
	n.log.Warn("rejoining: asking every peer for a re-seed", "why", why, "peers", len(asked))
}

// pruneReseedState forgets R and J records of peers no longer configured: a
// rejoin must not wait forever for a peer that was removed.
func (j *rejoiner) pruneReseedState() error {
	n := j.n
	if n.opts.InsecurePeers {
		return nil // peers need no configuration: any may come back
	}
	configured := map[string]bool{}
	for _, p := range n.opts.Peers {
		configured[p.Name] = true
	}
	req, err := n.store.ReseedRequests()
	if err != nil {
		return err
	}
	rj, err := n.store.Rejoin()
	if err != nil {
		return err
	}
	zero := func(byte) byte { return 0 }
	for p := range req {
		if !configured[p] {
			n.log.Warn("forgetting a re-seed request of a peer no longer configured", "peer", p)
			if err := j.updateReseed(p, zero); err != nil {
				return err
			}
		}
	}
	for p := range rj {
		if !configured[p] {
			n.log.Warn("rejoin: forgetting a peer no longer configured", "peer", p)
			if err := j.updateRejoin(p, zero); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreReseedState applies the persisted R and J records to a new link.
func (j *rejoiner) restoreReseedState(sh *transport.Shipper) {
	n := j.n
	p := sh.Peer().Name
	req, err := n.store.ReseedRequests()
	if err != nil {
		n.log.Error("reading re-seed requests", "err", err)
	}
	if req[p]&store.ReseedRequested != 0 {
		sh.Owe()
	}
	rj, err := n.store.Rejoin()
	if err != nil {
		n.log.Error("reading rejoin records", "err", err)
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

// onReseedRequest: a peer lost data and asked for a re-seed (or no longer
// needs the one it asked for).
func (j *rejoiner) onReseedRequest(peer string, owed bool) {
	n := j.n
	if sh, err := n.repl.shipper(peer); err == nil {
		if owed {
			sh.Owe()
		} else {
			sh.Disown()
		}
	}
}

// onTrailer: a re-seed ended here. When the last one this node asked for is
// in, it re-seeds every peer in turn.
func (j *rejoiner) onTrailer(peer string, requested, _ bool) {
	n := j.n
	if !requested {
		return
	}
	if sh, err := n.repl.shipper(peer); err == nil {
		sh.SetRejoining(store.RejoinSeeding)
	}
	rj, err := n.store.Rejoin()
	if err != nil {
		n.log.Error("reading rejoin records", "err", err)
		return
	}
	if !allSeeding(rj) {
		n.log.Info("rejoin: re-seed received", "peer", peer, "waiting_for", waitingFor(rj))
		return
	}
	n.log.Info("rejoin: every peer's re-seed is in; re-seeding the peers in turn")
	for _, sh := range n.repl.links() {
		if rj[sh.Peer().Name] == store.RejoinSeeding {
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

// onReseedDone: a re-seed this node sent was acknowledged to its trailer.
func (j *rejoiner) onReseedDone(peer string, requested, rejoin bool) {
	n := j.n
	// A failed record (the node lost its lead, say) would leave the log
	// saying the re-seed is still owed while the link believes it done:
	// the peer would wait for it forever. The link owes it again instead,
	// and its next end records it (a re-seed may be sent twice).
	rearm := func(f func(*transport.Shipper)) {
		if sh, err := n.repl.shipper(peer); err == nil {
			f(sh)
		}
	}
	if requested {
		err := j.updateReseed(peer, func(f byte) byte { return f &^ store.ReseedRequested })
		if err != nil {
			n.log.Error("clearing a re-seed request; the re-seed is owed again", "peer", peer, "err", err)
			rearm((*transport.Shipper).Owe)
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
			n.log.Error("recording the rejoin's end; the rejoin's re-seed is owed again", "peer", peer, "err", err)
			rearm((*transport.Shipper).RejoinSeed)
			return
		}
		if rj, err := n.store.Rejoin(); err == nil {
			if sh, err := n.repl.shipper(peer); err == nil {
				sh.SetRejoining(rj[peer])
			}
		}
		if rj, err := n.store.Rejoin(); err == nil && len(rj) == 0 {
			n.log.Info("rejoin complete: every peer has this node's data")
		}
	}
}

func (j *rejoiner) rejoinReport() api.RejoinReport {
	n := j.n
	var r api.RejoinReport
	if rj, err := n.store.Rejoin(); err == nil {
		for p, ph := range rj {
			if r.Phases == nil {
				r.Phases = map[string]string{}
			}
			r.Phases[p] = map[byte]string{store.RejoinRequesting: "requesting", store.RejoinSeeding: "seeding"}[ph]
		}
	}
	if rr, err := n.store.ReseedRequests(); err == nil {
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
func (j *rejoiner) updateReseed(peer string, f func(byte) byte) error {
	n := j.n
	_, err := n.cons.UpdateRecord(peer, machine.RecordReseed, f)
	return err
}

func (j *rejoiner) updateRejoin(peer string, f func(byte) byte) error {
	n := j.n
	_, err := n.cons.UpdateRecord(peer, machine.RecordRejoin, f)
	return err
}
