package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
)

// flakyListener fails its first Accepts, as a listener out of file
// descriptors does.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, errors.New("accept: too many open files")
	}
	return l.Listener.Accept()
}

// TestServeOutlivesAFailedAccept: a failed Accept does not end the door: it
// serves the next client, and Close still ends Serve.
func TestServeOutlivesAFailedAccept(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	fl.fails.Store(3)
	s := New(nil, Options{})
	served := make(chan error, 1)
	go func() { served <- s.Serve(fl) }()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(nc).ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING after failed accepts: %q %v", line, err)
	}
	ln.Close()
	s.Close()
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
}

// TestCursorsOfAScanInProgress: a long scan holds at most two places (the
// page before stays for a retry until the next is used), so it cannot push
// out another client's cursor however many pages it reads.
func TestCursorsOfAScanInProgress(t *testing.T) {
	var cs cursors
	other := cs.put("x", "", 0, 1)
	cur := uint64(0)
	for i := 0; i < 3*maxCursors; i++ {
		if cur != 0 {
			if _, ok := cs.take(cur, ""); !ok {
				t.Fatalf("page %d: the cursor given for it is gone", i)
			}
			if _, ok := cs.take(cur, ""); !ok {
				t.Fatalf("page %d: a retried cursor is gone", i)
			}
		}
		cur = cs.put("k", "", cur, 2)
	}
	if len(cs.byID) > 3 {
		t.Fatalf("%d places kept for one scan and one idle cursor", len(cs.byID))
	}
	if after, ok := cs.take(other, ""); !ok || after != "x" {
		t.Fatal("the other client's cursor was pushed out by one long scan")
	}
	// Many scans begun and never continued (SCAN 0 again and again) by
	// one connection push out its own, not another's; cursors are not a
	// sequence another client could walk.
	var ids []uint64
	for i := 0; i < 3*maxCursors; i++ {
		ids = append(ids, cs.put("k", "", 0, 3))
	}
	if after, ok := cs.take(other, ""); !ok || after != "x" {
		t.Fatal("the other client's cursor was pushed out by one connection's many SCAN 0")
	}
	if cs.of[3] > perConnCursors {
		t.Fatalf("one connection holds %d cursors, at most %d", cs.of[3], perConnCursors)
	}
	seq := 0
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1]+1 {
			seq++
		}
	}
	if seq > 2 {
		t.Fatalf("%d cursors follow the one before: guessable", seq)
	}
}

// TestPreAuthBounds: with a token set, a command before AUTH may not claim
// more than preAuthLimits (a client without the token cannot make the
// server hold megabytes); it is answered a protocol error and closed.
func TestPreAuthBounds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(nil, Options{Token: "s3cret"})
	go s.Serve(ln)
	defer func() { ln.Close(); s.Close() }()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	// A small command is read and refused; a 1 MiB argument is not read.
	if _, err := nc.Write([]byte("*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1048576\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	if line, err := br.ReadString('\n'); err != nil || line[:7] != "-NOAUTH" {
		t.Fatalf("PING before AUTH: %q %v", line, err)
	}
	if line, err := br.ReadString('\n'); err != nil || line[:20] != "-ERR Protocol error:" {
		t.Fatalf("a 1 MiB argument before AUTH: %q %v", line, err)
	}
	if rest, err := br.ReadString('\n'); err == nil {
		t.Fatalf("the connection stayed open: %q", rest)
	}
}

// failoverNode forwards its first writes when they are waited for (a
// follower) and queues the later ones at once (it became the leader):
// log is the order the writes reach the cluster's log.
type failoverNode struct {
	Node // the rest is not called
	mu   sync.Mutex
	log  []string
	subs int
}

func (f *failoverNode) Submit(_ context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs++
	key := w.Entry.Key
	reach := func() { f.mu.Lock(); f.log = append(f.log, key); f.mu.Unlock() }
	if f.subs <= 2 {
		return func() (api.WriteResult, error) { reach(); return api.WriteResult{Key: key}, nil }, true
	}
	f.log = append(f.log, key)
	return func() (api.WriteResult, error) { return api.WriteResult{Key: key}, nil }, false
}

// TestPipelineOrderAcrossAFailover: a pipeline whose first writes a
// follower forwards as they are waited for, and whose next ones the node,
// leader meanwhile, would queue at once: every write reaches the log in the
// pipeline's order.
func TestPipelineOrderAcrossAFailover(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &failoverNode{}
	s := New(f, Options{})
	go s.Serve(ln)
	defer func() { ln.Close(); s.Close() }()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write([]byte("SET k1 v\r\nSET k2 v\r\nSET k3 v\r\nSET k4 v\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	for i := 0; i < 4; i++ {
		if line, err := br.ReadString('\n'); err != nil || line != "+OK\r\n" {
			t.Fatalf("reply %d: %q %v", i, line, err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := fmt.Sprint(f.log); got != "[k1 k2 k3 k4]" {
		t.Fatalf("the writes reached the log as %s", got)
	}
}

// TestIdleBeforeAuthIsClosed: a connection that never authenticates does
// not hold its slot for ever; one that did may idle.
func TestIdleBeforeAuthIsClosed(t *testing.T) {
	const preAuthIdle = 100 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(nil, Options{Token: "s3cret", AuthTimeout: preAuthIdle})
	go s.Serve(ln)
	defer func() { ln.Close(); s.Close() }()
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	authed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer authed.Close()
	authed.SetDeadline(time.Now().Add(10 * time.Second))
	ar := bufio.NewReader(authed)
	authed.Write([]byte("AUTH s3cret\r\n"))
	if line, err := ar.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("AUTH: %q %v", line, err)
	}
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err == nil {
		t.Fatal("an idle connection before AUTH was answered, not closed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("an idle connection before AUTH is still open after 10 s")
	}
	time.Sleep(3 * preAuthIdle) // past the pre-AUTH bound
	authed.Write([]byte("PING\r\n"))
	if line, err := ar.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING on an authenticated connection after idling: %q %v", line, err)
	}
}
