package resp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/secret"
)

// Node is what the front door asks of a node: the same Go API the HTTP
// surface calls (no second write path).
type Node interface {
	ClusterID() string
	Get(key string) (entry.Record, error)
	Scan(o api.ScanOptions) ([]api.Item, string, error)
	// Submit queues a write behind every write the caller submitted before
	// it and returns without waiting; wait returns its outcome once it is
	// committed as an HTTP write's 200 is (synced; in a cluster of several,
	// by the group). The writes of one connection so reach the log in its
	// order, and a pipeline's join one group commit. An error is returned
	// by wait, also when the write was not queued. A node that must send
	// the write elsewhere (a follower) may do so in wait, which the caller
	// calls in order: ctx cancelled first means the write must not be sent.
	// deferred says it does so: the connection then waits for that write
	// before it submits another, which the node might queue at once (it
	// became the leader meanwhile) ahead of it.
	Submit(ctx context.Context, w api.Write) (wait func() (api.WriteResult, error), deferred bool)
	// Figures are kept figures for INFO and WAITAOF (no scan); they read
	// every link's status and the group's.
	Figures() Figures
	// Keys is Figures' Keys alone (DBSIZE).
	Keys() int64
	// Holding names the peer clusters that hold this cluster's writes
	// from index from to index to of stream, as their links'
	// acknowledgements say (WAIT; docs/RESP.md).
	Holding(stream entry.StreamID, from, to uint64) ([]string, error)
	// KeptFrom names the peers whose link's filter, at the write's index,
	// keeps some of w (answered res) home: they never hold all of it.
	KeptFrom(w api.Write, res api.WriteResult) []string
	// Peers is the number of peer links (WAIT before any write).
	Peers() int
	// Acks returns a channel closed at the next acknowledgement a link of
	// this node receives (nil: this node cannot tell, a follower): WAIT
	// looks again then rather than poll.
	Acks() <-chan struct{}
}

// Figures are what INFO and DBSIZE say.
type Figures struct {
	Version string
	Keys    int64 // live plain keys
	Role    string
	Links   []Link
	// Nodes are the nodes of the cluster (1 alone); Quorum of them hold
	// a committed write.
	Nodes, Quorum int
}

// Link is one peer link as INFO and WAIT see it.
type Link struct {
	Peer  string
	State string
	Acked uint64 // the last index of this cluster's stream the peer holds
	Last  uint64
	// Lag is the age of the oldest write the peer does not hold yet.
	Lag time.Duration
}

// Options configure a server.
type Options struct {
	// Token is the API token: AUTH (or HELLO ... AUTH) must give it before
	// any other command ("": no AUTH needed).
	Token  string
	Limits Limits
	// Version is the node's build, which HELLO tells.
	Version string
	// MaxConns bounds the connections served at once (more are answered
	// an error and closed). Default 10,000.
	MaxConns int
	// MaxReply bounds the replies a connection may owe at once; WriteTimeout
	// how long a reply may wait for the client to read (a client that
	// pipelines without reading is cut off, not buffered without end).
	// Defaults 64 MiB, 30 s.
	MaxReply     int
	WriteTimeout time.Duration
	// MaxHeld bounds the bytes the door holds for all its connections
	// together: arguments of commands read and not yet run, replies owed
	// and not yet written. A connection that would pass it is answered
	// an error and closed. Default 512 MiB.
	MaxHeld int64
	// AuthTimeout is how long a connection may take from accept to AUTH
	// (with a token set); then it is closed. One deadline, not one per
	// command: a client that keeps sending PING without the token does
	// not keep its slot. Default 10 s.
	AuthTimeout time.Duration
	// Timeout bounds one write's wait for its commit (10 s, as HTTP's).
	Timeout time.Duration
	Logger  *slog.Logger
	// Committed, when set, sees every write of a key once it committed and
	// before it is answered (tests: a crash between the two).
	Committed func(key string)
	// Now is the node's clock in Unix nanoseconds (TIME answers it).
	// Default: the system clock.
	Now func() int64
}

// EnsureDefaults fills in zero fields.
func (o *Options) EnsureDefaults() {
	if o.Limits == (Limits{}) {
		o.Limits = DefaultLimits()
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixNano() }
	}
	if o.MaxConns == 0 {
		o.MaxConns = 10000
	}
	if o.MaxReply == 0 {
		o.MaxReply = 64 << 20
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.AuthTimeout == 0 {
		o.AuthTimeout = 10 * time.Second
	}
	if o.MaxHeld == 0 {
		o.MaxHeld = 512 << 20
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server serves RESP connections.
type Server struct {
	node  Node
	opts  Options
	log   *slog.Logger
	stats Stats

	cursors cursors
	nextID  atomic.Int64
	// held is the node-wide budget of bytes held for connections.
	held budget

	mu struct {
		sync.Mutex
		conns  map[net.Conn]*connState
		closed bool
	}
	// done is closed by Close: a WAIT waiting for peers answers then.
	done chan struct{}
	wg   sync.WaitGroup
}

// New returns a server of n.
func New(n Node, o Options) *Server {
	o.EnsureDefaults()
	s := &Server{node: n, opts: o, log: o.Logger, done: make(chan struct{}), held: budget{max: o.MaxHeld}}
	s.mu.conns = map[net.Conn]*connState{}
	s.stats.init()
	return s
}

// Serve accepts connections on ln until Close; it returns nil then (a
// failed Accept is retried, with a backoff up to a second). Each
// connection is served by a goroutine of its own, which exits when the
// client leaves, on a protocol error, or at Close.
func (s *Server) Serve(ln net.Listener) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.mu.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors, an aborted handshake: the door
			// stays open and tries again, as net/http's does, rather
			// than stop taking clients until a restart.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("resp: accept failed; retrying", "err", err, "in", backoff)
			select {
			case <-s.done:
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		if len(s.mu.conns) >= s.opts.MaxConns && s.evictUnauthenticatedLocked() {
			s.stats.evictedConns.Add(1)
		}
		if len(s.mu.conns) >= s.opts.MaxConns {
			s.mu.Unlock()
			s.stats.refusedConns.Add(1)
			// A whole deadline: over TLS the write first runs the
			// handshake, which reads, and must not hold the accept loop.
			nc.SetDeadline(time.Now().Add(time.Second))
			io.WriteString(nc, "-ERR max number of clients reached\r\n")
			nc.Close()
			continue
		}
		st := &connState{since: time.Now()}
		st.authed.Store(s.opts.Token == "")
		st.proto.Store(2)
		st.multi.Store(-1)
		s.mu.conns[nc] = st
		s.stats.conns.Add(1)
		s.stats.accepted.Add(1)
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(nc, st)
			s.mu.Lock()
			delete(s.mu.conns, nc)
			s.stats.conns.Add(-1) // with the slot it frees: the gauge never shows a slot free that is not
			s.mu.Unlock()
		}()
	}
}

// evictUnauthenticatedLocked closes the oldest connection that has not
// authenticated, to make room at the bound: clients without the token
// must not lock out one that holds it. It reports whether one was.
func (s *Server) evictUnauthenticatedLocked() bool {
	var oldest net.Conn
	var at time.Time
	for nc, st := range s.mu.conns {
		if !st.authed.Load() && (oldest == nil || st.since.Before(at)) {
			oldest, at = nc, st.since
		}
	}
	if oldest == nil {
		return false
	}
	oldest.Close()
	// Its slot is free now; its goroutine's delete finds nothing.
	delete(s.mu.conns, oldest)
	return true
}

// Close closes every connection and waits for their goroutines. The
// listener is the caller's to close (Serve then returns).
func (s *Server) Close() {
	s.mu.Lock()
	if !s.mu.closed {
		close(s.done)
	}
	s.mu.closed = true
	for nc := range s.mu.conns {
		nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Stats returns the server's counters.
func (s *Server) Stats() *Stats { return &s.stats }

// conn is one client connection's state.
type conn struct {
	s      *Server
	nc     net.Conn
	id     int64
	w      writer
	authed bool
	name   string
	// src is the socket as the reader reads it; state the accept loop's
	// view of the connection.
	src   *source
	state *connState
	// authFails counts refused AUTHs: past maxAuthFailures the
	// connection closes.
	authFails int
	// replyHeld is the part of the node's budget the replies owed hold.
	replyHeld int64
	// pending are writes submitted and not yet answered, in order.
	pending []pendingWrite
	// ctx bounds the writes of the pipeline being run (Options.Timeout);
	// cancel withdraws those still queued when one fails.
	ctx    context.Context
	cancel context.CancelFunc
	// wait is what WAIT asks of the peers: every write of this
	// connection (docs/RESP.md "WAIT").
	written waitMark
	// deferred: a pending write is sent only when waited for (Submit).
	deferred bool
	// broken: a write was not written or its outcome is unknown; the rest
	// of the pipeline fails and the connection closes.
	broken error
	quit   bool
	// tx is the transaction between MULTI and EXEC (nil: none).
	tx *txn
	// watched are the keys WATCHed for the next EXEC, with their
	// versions as read then ("" for none).
	watched map[string]string
}

type pendingWrite struct {
	w     api.Write
	wait  func() (api.WriteResult, error)
	reply func(c *conn, res api.WriteResult, err error)
}

// waitMark is where a connection's writes are in the cluster's stream, for
// WAIT: they lie from index from to index to of stream (a connection's
// writes reach the stream in its order; other connections' writes lie
// between), and kept are the peers whose link's filter kept some of one
// home. A write in a later stream (the node sealed its stream) starts the
// mark again: the earlier ones' holders cannot be told any more.
type waitMark struct {
	stream   entry.StreamID
	from, to uint64
	kept     map[string]bool
	// sealed: the connection wrote in a stream the node has replaced
	// since (it lost data): which peers hold those writes cannot be told,
	// and WAIT counts none.
	sealed bool
}

// note adds a written write to the mark.
func (m *waitMark) note(res api.WriteResult, kept []string) {
	if res.Index == 0 {
		return // nothing written (a replay)
	}
	if m.from != 0 && res.Stream != m.stream {
		m.sealed = true
	}
	if res.Stream != m.stream || m.from == 0 {
		m.stream, m.from, m.to = res.Stream, res.Index, res.Index
	}
	m.from, m.to = min(m.from, res.Index), max(m.to, res.Index)
	for _, p := range kept {
		if m.kept == nil {
			m.kept = map[string]bool{}
		}
		m.kept[p] = true
	}
}

// maxPipeline and maxPipelineBytes bound the commands taken from one read
// before answering, by count and by their arguments' bytes (a command
// alone may be larger, up to Limits.MaxCommand).
const (
	maxPipeline      = 1024
	maxPipelineBytes = 1 << 20
)

// preAuthLimits bound a command read before AUTH, when a token is set: AUTH
// and HELLO take a few short arguments (Redis bounds the same way).
var preAuthLimits = Limits{MaxArgs: 16, MaxBulk: 16 << 10, MaxInline: 16 << 10, MaxCommand: 64 << 10}

// maxAuthFailures is how many refused AUTHs close a connection.
const maxAuthFailures = 10

func (s *Server) serveConn(nc net.Conn, st *connState) {
	defer nc.Close()
	src := &source{nc: nc}
	c := &conn{s: s, nc: nc, id: s.nextID.Add(1), authed: s.opts.Token == "", w: writer{proto: 2}, src: src, state: st}
	st.id.Store(c.id)
	rd := newReader(src, s.opts.Limits)
	rd.src, rd.budget = src, &s.held
	defer func() {
		rd.release()
		s.held.give(c.replyHeld)
	}()
	if !c.authed {
		src.authBy = time.Now().Add(s.opts.AuthTimeout)
	}
	for {
		var batch [][][]byte
		size := 0
		for len(batch) < maxPipeline && size < maxPipelineBytes {
			if !c.authed {
				// Before AUTH a client gets a command at a time, each
				// small, and until the deadline set at accept: it cannot
				// make the server hold megabytes, or a slot for long.
				rd.limits = preAuthLimits
			} else if rd.limits != s.opts.Limits {
				rd.limits, src.authBy = s.opts.Limits, time.Time{}
			}
			args, err := rd.read()
			if err != nil {
				c.run(batch)
				switch {
				case errors.Is(err, ErrHTTP):
					s.stats.error("http")
					s.log.Warn("resp: an HTTP request on the RESP port; connection closed", "remote", nc.RemoteAddr().String())
				case errors.Is(err, ErrBudget):
					s.stats.error("budget")
					c.w.err("ERR " + ErrBudget.Error() + " (docs/RESP.md); the connection closes")
				case errors.Is(err, ErrProtocol):
					s.stats.error("protocol")
					c.w.err("ERR Protocol error: " + err.Error())
				}
				c.flush()
				return
			}
			batch = append(batch, args)
			for _, a := range args {
				size += len(a)
			}
			if !rd.buffered() || !c.authed {
				break
			}
		}
		st.noted(batch)
		c.run(batch)
		rd.release()
		if err := c.flush(); err != nil || c.quit || c.broken != nil {
			return
		}
	}
}

// flush writes the replies owed, within the write timeout.
func (c *conn) flush() error {
	if len(c.w.buf) == 0 {
		return nil
	}
	c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
	_, err := c.nc.Write(c.w.buf)
	if len(c.w.buf) > 64<<10 {
		c.w.buf = nil // do not keep a large buffer for an idle connection
	} else {
		c.w.buf = c.w.buf[:0]
	}
	c.s.held.give(c.replyHeld)
	c.replyHeld = 0
	return err
}

// run executes a pipeline in order: writes are submitted as they come and
// answered in order; anything else first waits for the writes before it
// (a read after a write on one connection sees it).
func (c *conn) run(batch [][][]byte) {
	// Each run of writes gets its context from submit; the last one's is
	// released here.
	c.cancel = func() {}
	defer func() { c.cancel() }()
	for _, args := range batch {
		if c.quit {
			break
		}
		if c.broken != nil {
			c.settle()
			c.w.err("NOTWRITTEN an earlier command of this pipeline failed (" + c.broken.Error() + "); not executed, the connection closes")
			continue
		}
		start := len(c.w.buf)
		c.dispatch(args)
		if len(c.w.buf) > c.s.opts.MaxReply {
			c.settle()
			c.w.err("ERR the replies owed exceed the connection's bound; the connection closes")
			c.quit = true
		} else if !c.holdReplies() {
			c.w.buf = c.w.buf[:max(start, 0)]
			c.overBudget()
		}
	}
	c.settle()
}

// settle waits for the pending writes and writes their replies in order.
func (c *conn) settle() {
	for _, p := range c.pending {
		if c.broken != nil {
			// The rest of the pipeline fails: a write still queued is
			// withdrawn (not written), one already in a group commit
			// keeps its fate (its answer says which).
			c.cancel()
		}
		res, err := p.wait()
		if err == nil && c.s.opts.Committed != nil {
			c.s.opts.Committed(res.Key)
		}
		if err == nil && res.Index > 0 {
			c.written.note(res, c.s.node.KeptFrom(p.w, res))
		}
		if err != nil && c.broken == nil && (errors.Is(err, api.ErrNotWritten) || errors.Is(err, api.ErrUnknownOutcome)) {
			c.broken = err
		}
		p.reply(c, res, err)
	}
	c.pending = c.pending[:0]
	c.deferred = false
}

// submit queues a write of this connection.
func (c *conn) submit(w api.Write, reply func(c *conn, res api.WriteResult, err error)) {
	if c.deferred {
		// The writes before it are sent as they are waited for: they go
		// first, whatever this one's path.
		c.settle()
		if c.broken != nil {
			reply(c, api.WriteResult{}, fmt.Errorf("%w: an earlier command of this pipeline failed (%w); not executed", api.ErrNotWritten, c.broken))
			return
		}
	}
	if len(c.pending) == 0 {
		// A run of writes shares one bound, from its first write: a
		// command that waited before it (WAIT) does not spend it.
		c.cancel()
		c.ctx, c.cancel = context.WithTimeout(context.Background(), c.s.opts.Timeout)
	}
	wait, deferred := c.s.node.Submit(c.ctx, w)
	c.pending = append(c.pending, pendingWrite{w: w, wait: wait, reply: reply})
	c.deferred = c.deferred || deferred
}

// now submits a write and waits for it (a command whose reply decides the
// next step).
func (c *conn) now(w api.Write) (api.WriteResult, error) {
	c.settle()
	var res api.WriteResult
	var err error
	c.submit(w, func(_ *conn, r api.WriteResult, e error) { res, err = r, e })
	c.settle()
	return res, err
}

// writeErr replies an error of the write path with a class a client can act
// on (docs/RESP.md "Errors"): NOTWRITTEN (nothing was written: retry is
// safe), UNKNOWNOUTCOME (it may or may not be written: retry only what is
// idempotent), WRONGTYPE (a key of the other kind), ERR (bad input).
func (c *conn) writeErr(err error) {
	kind, msg := classify(err)
	c.s.stats.error(kind)
	c.w.err(msg)
}

func classify(err error) (kind, msg string) {
	text := api.ClientText(err.Error())
	switch {
	case errors.Is(err, api.ErrUnknownOutcome):
		return "unknown_outcome", "UNKNOWNOUTCOME the write may or may not be committed: " + text
	case errors.Is(err, api.ErrKindConflict):
		return "wrongtype", "WRONGTYPE Operation against a key holding the wrong kind of value: " + text
	case errors.Is(err, api.ErrNotInteger):
		return "bad_request", "ERR value is not an integer or out of range"
	case errors.Is(err, api.ErrCrossGroup):
		// Redis Cluster's answer, which its clients know: use a hash tag.
		return "crossslot", "CROSSSLOT Keys in request don't hash to the same slot: " + text
	case errors.Is(err, api.ErrNotWritten):
		return "not_written", "NOTWRITTEN nothing was written: " + strings.TrimPrefix(text, "not written: ")
	case errors.Is(err, api.ErrCounterRange):
		return "bad_request", "ERR increment or decrement would overflow: " + text
	case errors.Is(err, api.ErrInvalidKey), errors.Is(err, api.ErrKeyTooLarge), errors.Is(err, api.ErrValueTooLarge), errors.Is(err, api.ErrBadRequest):
		return "bad_request", "ERR " + text
	case errors.Is(err, api.ErrCatchingUp):
		return "not_written", "NOTWRITTEN " + text
	}
	return "internal", "ERR " + text
}

func (c *conn) auth(token string) bool {
	if c.s.opts.Token == "" {
		return true
	}
	ok := secret.Equal(token, c.s.opts.Token)
	if ok && !c.authed {
		c.authed = true
		c.state.authed.Store(true)
	}
	if !ok {
		if c.authFails++; c.authFails >= maxAuthFailures {
			c.quit = true
		}
	}
	return ok
}

// holdReplies takes from the node's budget what the replies owed grew by;
// false: the budget cannot hold them.
func (c *conn) holdReplies() bool {
	grew := int64(len(c.w.buf)) - c.replyHeld
	if grew <= 0 {
		return true
	}
	if !c.s.held.take(grew) {
		return false
	}
	c.replyHeld += grew
	return true
}

// overBudget answers a command whose reply the node's budget could not
// hold, and closes the connection.
func (c *conn) overBudget() {
	c.s.stats.error("budget")
	c.w.err("ERR " + ErrBudget.Error() + " (docs/RESP.md); the connection closes")
	c.quit = true
}

func wrongArgs(name string) string {
	return fmt.Sprintf("ERR wrong number of arguments for '%s' command", name)
}

// Door is a Server serving one listener on a goroutine of its own, from
// Open until Shutdown.
type Door struct {
	*Server
	ln   net.Listener
	errc chan error
}

// Open serves n on ln with o.
func Open(n Node, o Options, ln net.Listener) *Door {
	d := &Door{Server: New(n, o), ln: ln, errc: make(chan error, 1)}
	go func() {
		// Exits when Shutdown closes the listener.
		d.errc <- d.Serve(ln)
	}()
	return d
}

// Addr is the address the door listens on.
func (d *Door) Addr() net.Addr { return d.ln.Addr() }

// Shutdown stops taking connections and closes those open, once their
// pending writes are answered (the node's write path must still run).
// A nil door has nothing to shut.
func (d *Door) Shutdown() error {
	if d == nil {
		return nil
	}
	err := d.ln.Close()
	d.Close()
	if serr := <-d.errc; serr != nil {
		err = errors.Join(err, serr)
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
