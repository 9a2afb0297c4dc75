package resp

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// The door's bounds beyond one command's (docs/RESP.md "Bounds"): what a
// connection may hold of the node's memory, how slowly it may send a
// command, how long it may take to authenticate.

// ErrBudget is a command or a reply the node's budget of held bytes could
// not take: the connection is answered an error and closed.
var ErrBudget = errors.New("resp: the node's budget for commands being read and replies owed is spent")

// budget is the node-wide bound on bytes the door holds for its
// connections: the arguments of commands read and not yet run, and the
// replies owed and not yet written. Each connection holds its share in
// conn.held and gives it back when the bytes go.
type budget struct {
	max  int64
	used atomic.Int64
}

// take reserves n bytes, or reports that the budget cannot hold them.
func (b *budget) take(n int64) bool {
	if n <= 0 {
		return true
	}
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *budget) give(n int64) { b.used.Add(-n) }

// Rate bounds of a command being read after AUTH: a command must arrive at
// minReadRate, after a grace of commandGrace, and never stall for longer
// than commandStall. A connection that waits between commands has no
// bound (clients keep idle connections), only one in the middle of a
// command does. Variables for tests.
var (
	commandGrace = 10 * time.Second
	commandStall = 10 * time.Second
	minReadRate  = int64(256 << 10) // bytes a second
)

// source is a connection as its reader reads it: bytes the WAIT watcher
// read ahead first, then the socket, each read under the deadline that
// applies (before AUTH the one set at accept; in a command the rate
// bound).
type source struct {
	nc      net.Conn
	pending []byte // read ahead while a WAIT watched the socket
	err     error  // the end the watcher saw, after pending
	// authBy is the deadline to authenticate by (zero once authenticated,
	// or with no token).
	authBy time.Time
	// inCommand: a command's first byte came; started and got say when
	// and how much since.
	inCommand bool
	started   time.Time
	got       int64
}

func (s *source) Read(p []byte) (int, error) {
	if len(s.pending) > 0 {
		n := copy(p, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	}
	if s.err != nil {
		return 0, s.err
	}
	var d time.Time
	switch {
	case !s.authBy.IsZero():
		d = s.authBy
	case s.inCommand:
		d = s.started.Add(commandGrace + time.Duration(s.got*int64(time.Second)/minReadRate))
		if stall := time.Now().Add(commandStall); stall.Before(d) {
			d = stall
		}
	}
	s.nc.SetReadDeadline(d)
	n, err := s.nc.Read(p)
	s.got += int64(n)
	return n, err
}

// begin and end mark a command being read (after its first byte).
func (s *source) begin() {
	if !s.inCommand {
		s.inCommand, s.started, s.got = true, time.Now(), 0
	}
}

func (s *source) end() { s.inCommand = false }

// maxReadAhead bounds what the WAIT watcher reads ahead of the next
// command (a client pipelining behind a WAIT): past it the socket is
// left unread, and TCP holds the client back.
const maxReadAhead = 1 << 20

// watch reads the socket while the connection waits (WAIT), so that a
// client that leaves is seen at once: gone is closed when the socket ends
// or fails; bytes that arrive are kept for the next command. stop ends the
// watch and returns once the watcher has (its goroutine exits then).
func (s *source) watch() (gone <-chan struct{}, stop func()) {
	g, done := make(chan struct{}), make(chan struct{})
	if s.err != nil {
		close(g)
		close(done)
		return g, func() {}
	}
	var stopping atomic.Bool
	// Set here, before the watcher reads: stop's deadline comes after it.
	s.nc.SetReadDeadline(time.Time{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for len(s.pending) < maxReadAhead {
			n, err := s.nc.Read(buf)
			s.pending = append(s.pending, buf[:n]...)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) && stopping.Load() {
					return
				}
				s.err = err
				close(g)
				return
			}
		}
	}()
	return g, func() {
		stopping.Store(true)
		s.nc.SetReadDeadline(time.Now())
		<-done
	}
}
