package raftconn

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
)

// Binding (issue 24, docs/CLUSTER.md "A node's identity"): raft counts a
// vote under the server ID it dialled and grants one whenever its own
// configuration is empty. A node whose data directory was wiped (or put back
// from an older copy) listens at the same address as before, remembers no
// vote and no acknowledged entry, and would answer for the identity it had.
// So every connection a node dials names the raft server ID it means, and
// the node that accepts it answers only for its own: its data directory's
// incarnation is part of that ID, so a node that lost its memory is a new
// identity nobody counts a vote from, and it joins as a new member.
//
// A bound connection opens with a preamble, inside TLS when the port has
// TLS:
//
//	0xA7 | version 1 | len(target) | target | len(sender) | sender
//
// and the accepting end answers
//
//	status | len(id) | id (its own server ID) | applied (8, big-endian) | len(msg) (2) | msg
//
// status ok lets raft's RPCs follow on the same connection; any other
// status closes it. An empty target asks who answers (Identify): the leader
// learns a node's incarnation and how far it applied without trusting
// gossip, and the answer's message carries what the node says of itself
// (Options.Describe: its API and replication URLs), which a node trusts
// because it came over the raft port, from the address the configuration
// holds. raft's own streams begin with an RPC type (0-4), so a connection
// without the preamble (a node of an older build, in a rolling upgrade) is
// told apart by its first byte and served unbound, as before.
//
// Version 2 of the preamble names a purpose after the version:
//
//	0xA7 | version 2 | purpose | len(target) | target | len(sender) | sender
//
// purpose 0 is raft (the dial writes version 1 for it, which every build
// reads); purpose 1 is a request of one node of the cluster to another
// (forwarding to the leader, asking a member's state: ServiceListener,
// DialService), authenticated by the raft port's credential. A build that
// reads version 1 only answers a version-2 preamble as malformed: the
// dialler learns it runs an older build (ErrOlderBuild).

const (
	preambleMagic   = 0xA7
	preambleVersion = 1
	// preambleService is the preamble's version that names a purpose.
	preambleService = 2
	purposeRaft     = 0
	purposeService  = 1
	// purposeGroup is raft of a group other than the cluster's first
	// (groups.go): a group byte follows the purpose.
	purposeGroup = 2
	// alpnBound is offered first by nodes that bind; an older build's
	// port answers alpnLegacy, and the dial then does not bind.
	alpnBound  = "replicator-raft/2"
	alpnLegacy = "replicator-raft/1"
)

// Answer statuses.
const (
	statusOK        = 0
	statusWrongID   = 1 // the target is not the server ID that answers here
	statusRefused   = 2 // the sender is refused (Options.Refuse)
	statusIdentity  = 3 // an answer to Identify: no RPC follows
	statusMalformed = 4
)

// ErrWrongIdentity: the node at a raft address is not the server the dial
// meant (its data directory was wiped or replaced: a new incarnation).
var ErrWrongIdentity = errors.New("raftconn: another identity answers at this address")

// ErrRefused: the node dialled refuses this node (it was removed from the
// cluster, or lost in a recovery).
var ErrRefused = errors.New("raftconn: refused by the other node")

// ErrOlderBuild: the node dialled runs a build that serves raft only on its
// port (a rolling upgrade is under way).
var ErrOlderBuild = errors.New("raftconn: the other node runs an older build")

// BindAddress is the address raft's transport dials to reach server id at
// addr: the layer connects to addr and names id in the preamble.
func BindAddress(id raft.ServerID, addr raft.ServerAddress) raft.ServerAddress {
	return raft.ServerAddress(string(id) + "@" + string(addr))
}

// splitBound undoes BindAddress.
func splitBound(a raft.ServerAddress) (id, addr string, bound bool) {
	id, addr, bound = strings.Cut(string(a), "@")
	if !bound {
		return "", string(a), false
	}
	return id, addr, true
}

// Identity is what a node's raft port says of itself.
type Identity struct {
	// ID is its raft server ID (node ID and incarnation).
	ID string
	// Applied is the last log index its state machine applied.
	Applied uint64
	// Description is what the node says of itself (Options.Describe):
	// empty from an older build.
	Description string
}

// Transport binds every RPC raft sends to the server ID it is meant for.
// It is raft's NetworkTransport over a Layer, with the target's ID put into
// the address the layer dials.
type Transport struct {
	*raft.NetworkTransport
}

var (
	_ raft.Transport   = Transport{}
	_ raft.WithPreVote = Transport{}
	_ raft.WithClose   = Transport{}
)

// NewTransport returns raft's network transport over the layer, bound.
func NewTransport(l *Layer, cfg *raft.NetworkTransportConfig) Transport {
	c := *cfg
	c.Stream = l
	return Transport{raft.NewNetworkTransportWithConfig(&c)}
}

func (t Transport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	return t.NetworkTransport.AppendEntriesPipeline(id, BindAddress(id, target))
}

func (t Transport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return t.NetworkTransport.AppendEntries(id, BindAddress(id, target), args, resp)
}

func (t Transport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return t.NetworkTransport.RequestVote(id, BindAddress(id, target), args, resp)
}

func (t Transport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.NetworkTransport.RequestPreVote(id, BindAddress(id, target), args, resp)
}

func (t Transport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	return t.NetworkTransport.InstallSnapshot(id, BindAddress(id, target), args, resp, data)
}

func (t Transport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return t.NetworkTransport.TimeoutNow(id, BindAddress(id, target), args, resp)
}

// writePreamble names target (empty: Identify) and this node, for raft.
func writePreamble(w io.Writer, target, sender string) error {
	return writePreambleFor(w, purposeRaft, 0, target, sender)
}

// writePreambleFor writes the preamble of a purpose: raft's in version 1
// (which every build reads), another in version 2; group is written after
// the purpose for purposeGroup only.
func writePreambleFor(w io.Writer, purpose, group byte, target, sender string) error {
	if len(target) > 255 || len(sender) > 255 {
		return fmt.Errorf("raftconn: server ID longer than 255 bytes")
	}
	b := make([]byte, 0, 6+len(target)+len(sender))
	switch purpose {
	case purposeRaft:
		b = append(b, preambleMagic, preambleVersion)
	case purposeGroup:
		b = append(b, preambleMagic, preambleService, purpose, group)
	default:
		b = append(b, preambleMagic, preambleService, purpose)
	}
	b = append(b, byte(len(target)))
	b = append(b, target...)
	b = append(b, byte(len(sender)))
	b = append(b, sender...)
	_, err := w.Write(b)
	return err
}

// readPreamble reads what follows the magic byte.
func readPreamble(r io.Reader) (purpose, group byte, target, sender string, err error) {
	var v [1]byte
	if _, err := io.ReadFull(r, v[:]); err != nil {
		return 0, 0, "", "", err
	}
	switch v[0] {
	case preambleVersion:
	case preambleService:
		var p [1]byte
		if _, err := io.ReadFull(r, p[:]); err != nil {
			return 0, 0, "", "", err
		}
		switch p[0] {
		case purposeRaft, purposeService:
		case purposeGroup:
			var g [1]byte
			if _, err := io.ReadFull(r, g[:]); err != nil {
				return 0, 0, "", "", err
			}
			if g[0] == 0 {
				return 0, 0, "", "", fmt.Errorf("preamble names group 0, which is raft's own purpose")
			}
			group = g[0]
		default:
			return 0, 0, "", "", fmt.Errorf("preamble purpose %d is unknown", p[0])
		}
		purpose = p[0]
	default:
		return 0, 0, "", "", fmt.Errorf("preamble version %d, want %d or %d", v[0], preambleVersion, preambleService)
	}
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return 0, 0, "", "", err
	}
	t := make([]byte, n[0])
	if _, err := io.ReadFull(r, t); err != nil {
		return 0, 0, "", "", err
	}
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return 0, 0, "", "", err
	}
	s := make([]byte, n[0])
	if _, err := io.ReadFull(r, s); err != nil {
		return 0, 0, "", "", err
	}
	return purpose, group, string(t), string(s), nil
}

func writeAnswer(w io.Writer, status byte, id string, applied uint64, msg string) error {
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	if len(id) > 255 {
		id = id[:255]
	}
	b := make([]byte, 0, 12+len(id)+len(msg))
	b = append(b, status, byte(len(id)))
	b = append(b, id...)
	b = binary.BigEndian.AppendUint64(b, applied)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	_, err := w.Write(b)
	return err
}

func readAnswer(r io.Reader) (status byte, id string, applied uint64, msg string, err error) {
	var h [2]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	status = h[0]
	idb := make([]byte, h[1])
	if _, err = io.ReadFull(r, idb); err != nil {
		return
	}
	var rest [10]byte
	if _, err = io.ReadFull(r, rest[:]); err != nil {
		return
	}
	applied = binary.BigEndian.Uint64(rest[:8])
	mb := make([]byte, binary.BigEndian.Uint16(rest[8:]))
	if _, err = io.ReadFull(r, mb); err != nil {
		return
	}
	return status, string(idb), applied, string(mb), nil
}

// bindsTo reports whether a dialled connection speaks the preamble: every
// plain one (loopback and the insecure mode serve one build's nodes), and a
// TLS one whose other end chose the bound protocol (an older build chooses
// the legacy one, and cannot be bound).
func bindsTo(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.ConnectionState().NegotiatedProtocol == alpnBound
	}
	return true
}

// bind sends the preamble on a dialled connection and reads the answer.
// It returns the answering node's identity.
func (l *Layer) bind(c net.Conn, target, addr string, timeout time.Duration) (Identity, error) {
	return l.bindFor(c, purposeRaft, 0, target, addr, timeout)
}

func (l *Layer) bindFor(c net.Conn, purpose, group byte, target, addr string, timeout time.Duration) (Identity, error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if err := writePreambleFor(c, purpose, group, target, l.id); err != nil {
		return Identity{}, fmt.Errorf("raftconn: dial %s at %s: %w", target, addr, err)
	}
	status, id, applied, msg, err := readAnswer(c)
	if err != nil {
		return Identity{}, fmt.Errorf("raftconn: dial %s at %s: no answer to the preamble: %w", target, addr, err)
	}
	who := Identity{ID: id, Applied: applied}
	switch status {
	case statusOK:
		return who, nil
	case statusIdentity:
		who.Description = msg
		return who, nil
	case statusMalformed:
		if purpose != purposeRaft && (strings.HasPrefix(msg, "preamble version") || strings.HasPrefix(msg, "preamble purpose")) {
			// A build before version 2, or before a purpose this dial
			// names (a build with services and no groups).
			return who, fmt.Errorf("%w: %s at %s: %s", ErrOlderBuild, id, addr, msg)
		}
		if purpose == purposeGroup && strings.HasPrefix(msg, noGroupAnswer) {
			return who, fmt.Errorf("%w: %s at %s: %s", ErrNoGroup, id, addr, msg)
		}
		err = fmt.Errorf("raftconn: dial %s at %s: refused (status %d): %s", target, addr, status, msg)
	case statusWrongID:
		err = fmt.Errorf("%w: %s answers at %s, not %s (%s)", ErrWrongIdentity, id, addr, target, msg)
	case statusRefused:
		err = fmt.Errorf("%w: %s at %s refuses this node (%s): %s", ErrRefused, id, addr, l.id, msg)
		l.noteRefused(id, addr, msg)
	default:
		err = fmt.Errorf("raftconn: dial %s at %s: refused (status %d): %s", target, addr, status, msg)
	}
	l.logOnce("dial:"+addr+":"+fmt.Sprint(status), slog.LevelWarn, err.Error())
	return who, err
}

// Identify asks the node at a raft address which server it is and how far
// it applied the log.
func (l *Layer) Identify(addr string, timeout time.Duration) (Identity, error) {
	c, err := l.dialRaw(addr, timeout)
	if err != nil {
		return Identity{}, err
	}
	defer c.Close()
	if !bindsTo(c) {
		return Identity{}, fmt.Errorf("raftconn: identify %s: the node runs an older build (no identity on its raft port)", addr)
	}
	return l.bind(c, "", addr, timeout)
}

// DialService connects to server target at addr for a request of one node
// to another (ServiceListener): the node there must be target, and must not
// refuse this one.
func (l *Layer) DialService(target, addr string, timeout time.Duration) (net.Conn, error) {
	if target == "" {
		return nil, fmt.Errorf("raftconn: dial a service at %s: no server named", addr)
	}
	c, err := l.dialRaw(addr, timeout)
	if err != nil {
		return nil, err
	}
	if !bindsTo(c) {
		c.Close()
		return nil, fmt.Errorf("%w: %s at %s speaks the legacy protocol", ErrOlderBuild, target, addr)
	}
	if _, err := l.bindFor(c, purposeService, 0, target, addr, timeout); err != nil {
		c.Close()
		return nil, err
	}
	return l.trackTo(c, addr)
}

// ServiceConn is a connection another node of the cluster dialled for a
// request (DialService): the raft port's credential authenticated it, and
// the preamble named Sender.
type ServiceConn struct {
	net.Conn
	// Sender is the raft server ID the other node named.
	Sender string
}

// ServiceListener returns the connections other nodes dial for requests
// (DialService). Without a call, such a dial is refused. Closing it stops
// them; the layer's Close closes it too.
func (l *Layer) ServiceListener() net.Listener {
	l.svc.serving.Store(true)
	return serviceListener{l}
}

type serviceListener struct{ l *Layer }

func (s serviceListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.l.svc.ch:
		return c, nil
	case <-s.l.svc.done:
		return nil, net.ErrClosed
	}
}

func (s serviceListener) Close() error {
	s.l.closeService()
	return nil
}

func (s serviceListener) Addr() net.Addr { return s.l.advertise }

func (l *Layer) closeService() {
	l.svc.closeOnce.Do(func() { close(l.svc.done) })
}

// handTo answers the preamble and gives the connection to a listener's
// channel (the service listener's, a raft group's: ch, with done closed when
// it stops), waiting at most the handshake timeout for it to be taken. The
// taker reads and writes without the handshake's deadlines. Raft's handler
// of the first group, which read the preamble, then stops and leaves the
// connection open.
func (c *boundConn) handTo(ch chan<- net.Conn, done <-chan struct{}, conn net.Conn) {
	l := c.l
	if err := writeAnswer(c.Conn, statusOK, l.id, l.applied(), ""); err != nil {
		c.fail(err)
		return
	}
	c.Conn.SetWriteDeadline(time.Time{})
	c.Conn.SetReadDeadline(time.Time{})
	t := time.NewTimer(l.timeout)
	defer t.Stop()
	select {
	case ch <- conn:
		c.handed = true
		c.err = errHandedOff
		return
	case <-done:
	case <-t.C:
	}
	c.fail(errHandedOff)
}

// boundConn is an accepted connection: its first read takes the preamble,
// when there is one, and answers it.
type boundConn struct {
	net.Conn
	l    *Layer
	once sync.Once
	err  error
	// peeked is the first byte of a connection without a preamble, given
	// back to raft.
	peeked []byte
	// handed: the connection went to the service listener, and raft's
	// handler (which closes what it stops reading) must leave it open.
	handed bool
}

// errHandedOff ends the first group's raft handling of a connection that
// went to a service or to another group.
var errHandedOff = errors.New("raftconn: a connection for a service or another raft group, not this raft's")

// Close closes the connection unless it went to the service listener
// (raft's handler, the only caller, reads and closes in one goroutine).
func (c *boundConn) Close() error {
	if c.handed {
		return nil
	}
	return c.Conn.Close()
}

func (c *boundConn) Read(p []byte) (int, error) {
	c.once.Do(c.check)
	if c.err != nil {
		return 0, c.err
	}
	if len(c.peeked) > 0 {
		n := copy(p, c.peeked)
		c.peeked = c.peeked[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// check reads the preamble within the handshake timeout and answers it.
func (c *boundConn) check() {
	l := c.l
	c.Conn.SetReadDeadline(time.Now().Add(l.timeout))
	defer c.Conn.SetReadDeadline(time.Time{})
	var first [1]byte
	if _, err := io.ReadFull(c.Conn, first[:]); err != nil {
		c.fail(err)
		return
	}
	if first[0] != preambleMagic {
		c.peeked = first[:] // an older build's node: raft's stream as is
		return
	}
	purpose, group, target, sender, err := readPreamble(c.Conn)
	if err != nil {
		writeAnswer(c.Conn, statusMalformed, l.id, l.applied(), err.Error())
		c.fail(fmt.Errorf("raftconn: malformed preamble: %w", err))
		return
	}
	c.Conn.SetWriteDeadline(time.Now().Add(l.timeout))
	defer c.Conn.SetWriteDeadline(time.Time{})
	if l.refuse != nil {
		// Before anything else, Identify included: a node kept out learns
		// it at its first dial.
		if why := l.refuse(sender); why != "" {
			writeAnswer(c.Conn, statusRefused, l.id, l.applied(), why)
			l.noteRefusing(sender, why)
			l.logOnce("refused:"+sender, slog.LevelWarn, "raftconn: refused raft traffic from "+sender+": "+why)
			c.fail(fmt.Errorf("%w: %s: %s", ErrRefused, sender, why))
			return
		}
	}
	switch {
	case target == "":
		writeAnswer(c.Conn, statusIdentity, l.id, l.applied(), l.describe())
		c.fail(io.EOF)
		return
	case target != l.id:
		msg := fmt.Sprintf("this node is %s; %s is another incarnation (a data directory wiped or put back from a copy is a new member)", l.id, target)
		writeAnswer(c.Conn, statusWrongID, l.id, l.applied(), msg)
		l.logOnce("wrong:"+target, slog.LevelWarn, "raftconn: refused a connection meant for "+target+" from "+sender+": "+msg)
		c.fail(fmt.Errorf("%w: %s", ErrWrongIdentity, msg))
		return
	}
	if purpose == purposeGroup {
		c.handOffGroup(group, sender)
		return
	}
	if purpose == purposeService {
		if !l.svc.serving.Load() {
			writeAnswer(c.Conn, statusMalformed, l.id, l.applied(), "this node serves no requests on its raft port")
			c.fail(errHandedOff)
			return
		}
		c.handTo(l.svc.ch, l.svc.done, &ServiceConn{Conn: c.Conn, Sender: sender})
		return
	}
	if err := writeAnswer(c.Conn, statusOK, l.id, l.applied(), ""); err != nil {
		c.fail(err)
	}
}

// describe is what this node says of itself to Identify.
func (l *Layer) describe() string {
	if l.describeFn == nil {
		return ""
	}
	return l.describeFn()
}

func (c *boundConn) fail(err error) {
	c.err = err
	c.Conn.Close()
}

func (l *Layer) applied() uint64 {
	if l.appliedFn == nil {
		return 0
	}
	return l.appliedFn()
}

// Refusal is the last time another node refused this one (api.Refusal).
type Refusal = api.Refusal

func (l *Layer) noteRefused(by, addr, why string) {
	l.notes.Lock()
	l.notes.refusal = Refusal{By: by, Reason: why, At: time.Now()}
	l.notes.Unlock()
	if l.onRefused != nil {
		l.onRefused(by, addr, why)
	}
}

// noteRefusing keeps who this node refused lately (an operator sees them in
// admin cluster even when gossip does not).
func (l *Layer) noteRefusing(sender, why string) {
	l.notes.Lock()
	defer l.notes.Unlock()
	if l.notes.refusing == nil || len(l.notes.refusing) > 100 {
		l.notes.refusing = map[string]Refusal{}
	}
	l.notes.refusing[sender] = Refusal{By: l.id, Reason: why, At: time.Now()}
}

// Refusing returns whom this node refused within the last d, and why.
func (l *Layer) Refusing(d time.Duration) map[string]Refusal {
	l.notes.Lock()
	defer l.notes.Unlock()
	out := map[string]Refusal{}
	for id, r := range l.notes.refusing {
		if time.Since(r.At) < d {
			out[id] = r
		}
	}
	return out
}

// Refused returns the last refusal this node got (zero: none).
func (l *Layer) Refused() Refusal {
	l.notes.Lock()
	defer l.notes.Unlock()
	return l.notes.refusal
}

// logOnce logs a line of a kind at most every 10 s: raft retries every few
// milliseconds.
func (l *Layer) logOnce(kind string, level slog.Level, msg string) {
	if l.logger == nil {
		return
	}
	l.notes.Lock()
	if l.notes.logged == nil {
		l.notes.logged = map[string]time.Time{}
	}
	if t, ok := l.notes.logged[kind]; ok && time.Since(t) < 10*time.Second {
		l.notes.Unlock()
		return
	}
	if len(l.notes.logged) > 1000 {
		l.notes.logged = map[string]time.Time{}
	}
	l.notes.logged[kind] = time.Now()
	l.notes.Unlock()
	l.logger.Log(context.Background(), level, msg, "component", "raft")
}
