package node

import (
	"context"
	"fmt"
	"github.com/replicator/replicator/internal/secret"
	"net/http"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/links"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// The node's side of replication: the acceptor of what peers send, and the
// links to them (package links) built from what the node holds.

// setupReplication builds the acceptor (the links are made at each term:
// a node alone's only one begins in the replica's Open).
func (n *Node) setupReplication() {
	secrets, pairs := make(map[string]string, len(n.opts.Peers)), map[string]*secret.Pair{}
	for _, p := range n.opts.Peers {
		secrets[p.Name], pairs[p.Name] = p.Secret, p.Secrets
	}
	var ackNodes func() []string // this cluster's nodes in acks (nil for a node alone)
	if n.multi() {
		ackNodes = n.svc.URLs
	}
	n.acceptor = acceptor.New(n.store, n.rep, n.clock, acceptor.Options{
		Local: n.cluster,
		Tree: func(ctx context.Context, sender string, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
			return n.ae.Answer(ctx, sender, req)
		},
		TreeCharge:         func(ctx context.Context, sender string, k int) error { return n.ae.Charge(ctx, sender, k) },
		Version:            n.opts.BuildVersion,
		Secrets:            secrets,
		SecretPairs:        pairs,
		Insecure:           n.opts.InsecurePeers,
		CertCluster:        n.tls.CertCluster,
		MaxBodyBytes:       n.opts.MaxReplicateBytes,
		MaxKeyBytes:        n.opts.MaxKeyBytes,
		MaxValueBytes:      n.opts.MaxValueBytes,
		TakesOriginFilters: func() bool { return n.machine.Format() >= machine.FormatOriginFilters },
		OnIdle:             n.links.NoteIdle,
		TakesOpenStreams:   func() bool { return n.machine.Format() >= machine.FormatOpenStreams },
		OpenOf:             func(peer string) []entry.StreamID { return n.machine.Link(peer).Open },
		FromPeer:           func(peer string) *entry.Filter { return n.machine.Link(peer).FromPeer },
		Onward:             func(peer string) []entry.TargetSpans { return n.machine.Link(peer).Onward },
		PinWindow:          n.opts.PinWindow,
		Permits:            n.opts.Permits,
		PermitQueue:        n.opts.PermitQueue,
		PermitWait:         n.opts.PermitWait,
		MaxBodies:          n.opts.MaxBodiesInFlight,
		ObserveLag: func(origin string, lags []acceptor.Lag) {
			n.inbound.ObserveLag(origin, time.Now().UnixNano(), lags)
			if n.opts.ObserveLag != nil {
				for _, l := range lags {
					n.opts.ObserveLag(origin, l.Total)
				}
			}
		},
		ObserveApply:    n.inbound.ObserveApply,
		OnReseedRequest: n.rejoin.OnReseedRequest,
		OnTrailer:       n.rejoin.OnTrailer,
		Leadership:      n.acceptorLeadership(),
		Nodes:           ackNodes,
		// Each field waits for the command format every member reads it at.
		TakesMarkers:  func() bool { return n.machine.Format() >= machine.FormatLinks },
		TakesContexts: func() bool { return n.machine.Format() >= machine.FormatConflicts },
		TakesExpiry:   func() bool { return n.machine.Format() >= machine.FormatExpiry },
		TakesFloors:   func() bool { return n.machine.Format() >= machine.FormatCounterFloors },
		ConflictValueMax: func() int {
			if n.machine.Format() < machine.FormatConflicts {
				return 0
			}
			return n.opts.ConflictValueMax
		},
		Now:    n.clock.Physical,
		Logger: n.log,
	})
}

// newLinks builds the links to the peer clusters (package links); none is
// made yet. What they call of parts built after them (the rejoin protocol,
// the acceptor, anti-entropy) is read when called.
func (n *Node) newLinks() *links.Set {
	rt := n.opts.PeerTransport
	if rt == nil {
		rt = &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, TLSClientConfig: n.tls.Client()}
	}
	n.peerClient = &http.Client{Transport: rt, CheckRedirect: forward.NoRedirects}
	return links.New(links.Deps{
		Local: n.cluster, Peers: n.opts.Peers, Insecure: n.opts.InsecurePeers,
		Stream: n.rep.Stream, Store: n.store, Clock: n.clock, Settings: n.settings,
		Format: func() int { return n.rep.Machine().Format() },
		LinkOf: func(peer string) entry.LinkSettings { return n.rep.Machine().Link(peer) },
		Floor:  n.com.Floor, Applied: n.rep.StreamApplied,
		Apply: n.rep.ApplyCommand, Commit: n.rep.CommitCommand, Cursors: replica.Cursors{Store: n.store, Apply: n.rep.ApplyCommand},
		Leading:         n.rep.Ready,
		Client:          n.peerClient,
		MaxBatchEntries: n.opts.MaxBatchEntries, MaxBatchBytes: n.opts.MaxBatchBytes, Linger: n.opts.BatchLinger,
		AutoReseed: !n.opts.NoAutoReseed,
		PinWindow:  n.opts.PinWindow, TombstoneRetention: n.opts.TombstoneRetention,
		Thresholds:   transport.Thresholds{Lagging: n.opts.LinkLagging, Stalled: n.opts.LinkStalled},
		OnAck:        func(peer string, ack *wire.Ack) { n.rejoin.OnAck(peer, ack) },
		OnConflict:   func(peer string, stream entry.StreamID, why string) { n.rejoin.OnConflict(peer, stream, why) },
		OnReseedDone: func(peer string, requested, rejoin bool) { n.rejoin.OnReseedDone(peer, requested, rejoin) },
		Restore:      func(sh *transport.Shipper) { n.rejoin.RestoreReseedState(sh) },
		AntiEntropy:  func(peer string) *api.AntiEntropyStatus { return n.ae.Status(peer) },
		Accepted:     func() []string { return n.acceptor.Peers() },
		Accept:       func(c string) { n.acceptor.SetPeer(c, "") },
		AcceptPeer:   func(c string, p *secret.Pair) { n.acceptor.SetPair(c, p) }, ForgetPeer: func(c string) { n.acceptor.RemovePeer(c) },
		SecretsKey:       n.opts.SecretsKey,
		Note:             n.gossip.Note,
		OnDetach:         n.sat.CountDetached,
		TruncateInterval: n.opts.TruncateInterval, CollectInterval: n.opts.GCInterval,
		HistoryInterval: n.opts.HistoryInterval, HistorySpan: n.opts.HistorySpan,
		Halted:     func() bool { return n.com.Failed() != nil || n.closing.Load() },
		Saturation: func() string { return n.sat.Evaluate(true).State },
		Logger:     n.log,
	})
}

// leadership tells the acceptor whether this node takes batches (nil for
// a node alone: it always does).
func (n *Node) acceptorLeadership() func() (bool, string, []string) {
	if !n.multi() {
		return nil
	}
	return func() (bool, string, []string) {
		if n.rep.Ready() {
			return true, "", nil
		}
		leader := "" // as the leader said of itself (forward.Service.ReplicateURL)
		if id := n.group.LeaderServer(); id != "" && id != n.group.ID() {
			leader = n.svc.ReplicateURL(id)
		}
		return false, leader, n.svc.URLs()
	}
}

// TruncateWAL drops the stream's outbound entries every peer acknowledged,
// through the cluster's log (every node drops the same).
func (n *Node) TruncateWAL() error { return n.links.Truncate() }

// Lag reports the replication lag of entries applied since since.
func (n *Node) Lag(since time.Time) api.LagReport { return n.inbound.Lags.Report(since) }

// History is the dashboard's chart: the samples later than after, oldest
// first.
func (n *Node) History(after time.Time) api.HistoryReport { return n.links.History(after) }

// Saturation reports the node's saturation state.
func (n *Node) Saturation() api.SaturationReport { return n.sat.Evaluate(true) }

// PeerStatus reports every link.
func (n *Node) PeerStatus() []api.LinkStatus { return n.links.Status() }

// Holding names the peer clusters whose links acknowledged holding the
// writes from index from to index to of stream (transport.Shipper.Holds):
// answered by the leader, which holds the links (a follower's router
// forwards GET /v1/held to it).
func (n *Node) Holding(stream entry.StreamID, from, to uint64) ([]string, error) {
	if n.multi() && !n.rep.Ready() {
		return nil, fmt.Errorf("%w: this node does not lead the cluster (any more): ask again", api.ErrNotWritten)
	}
	return n.links.Holding(stream, from, to), nil
}

// PausePeer stops shipping to a peer (its backlog is still retained).
func (n *Node) PausePeer(peer string) error { return n.links.Pause(peer) }

// ResumePeer undoes PausePeer.
func (n *Node) ResumePeer(peer string) error { return n.links.Resume(peer) }

// ReseedPeer starts a re-seed of a peer: a snapshot of the whole tree
// streamed through its acceptor, then normal shipping.
func (n *Node) ReseedPeer(peer string) error { return n.links.Reseed(peer) }

// DetachPeer stops retaining the WAL for a peer (as overflow mode detach
// does): for a peer gone for long, whose backlog should not hold the WAL.
// It is re-seeded once it is reachable again.
func (n *Node) DetachPeer(peer string) error { return n.links.Detach(peer) }
