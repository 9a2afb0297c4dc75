package resp

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// waitNode writes everything at once, and its one peer holds nothing until
// hold is called: a WAIT for it waits.
type waitNode struct {
	Node // the rest is not called
	mu   sync.Mutex
	held bool
	bell chan struct{}
	val  []byte
}

func (f *waitNode) Submit(_ context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	return func() (api.WriteResult, error) {
		return api.WriteResult{Key: w.Entry.Key, Stream: entry.StreamID{1}, Index: 1}, nil
	}, false
}
func (f *waitNode) KeptFrom(api.Write, api.WriteResult) []string { return nil }
func (f *waitNode) Peers() int                                   { return 1 }
func (f *waitNode) Holding(entry.StreamID, uint64, uint64) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held {
		return []string{"b"}, nil
	}
	return nil, nil
}
func (f *waitNode) Acks() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bell == nil {
		f.bell = make(chan struct{})
	}
	return f.bell
}
func (f *waitNode) hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = true
	if f.bell != nil {
		close(f.bell)
		f.bell = nil
	}
}
func (f *waitNode) Get(key string) (entry.Record, error) {
	return entry.Record{Value: f.val}, nil
}

func serve(t *testing.T, n Node, o Options) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(n, o)
	go s.Serve(ln)
	t.Cleanup(func() { ln.Close(); s.Close() })
	return s, ln.Addr().String()
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	return nc, bufio.NewReader(nc)
}

func expect(t *testing.T, br *bufio.Reader, want string) {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, want) {
		t.Fatalf("got %q %v, want %q", line, err, want)
	}
}

// closedSoon waits for the server to hold n connections.
func connsSoon(t *testing.T, s *Server, n int64, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.stats.conns.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the server holds %d connections, want %d", what, s.stats.conns.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWaitEndsWhenTheClientLeaves (issue 46, 5): clients that send
// WAIT 1 0 and close their sockets hold no slot; a WAIT for more peers
// than there are links answers once the links hold the writes; a WAIT is
// woken by an acknowledgement; what a client pipelines behind a WAIT is
// served after it.
func TestWaitEndsWhenTheClientLeaves(t *testing.T) {
	f := &waitNode{}
	s, addr := serve(t, f, Options{MaxConns: 64})
	for i := 0; i < 64; i++ {
		nc, br := dial(t, addr)
		fmt.Fprint(nc, "SET k v\r\nWAIT 1 0\r\n")
		expect(t, br, "+OK")
		nc.Close()
	}
	connsSoon(t, s, 0, "64 clients that left in WAIT 1 0")

	nc, br := dial(t, addr)
	fmt.Fprint(nc, "SET k v\r\nWAIT 1 100\r\nPING\r\n")
	expect(t, br, "+OK")
	expect(t, br, ":0")
	expect(t, br, "+PONG")

	fmt.Fprint(nc, "WAIT 5 0\r\nPING\r\n")
	time.Sleep(50 * time.Millisecond)
	f.hold()
	expect(t, br, ":1")
	expect(t, br, "+PONG")
}

// TestPreAuthBoundsAcrossCommands (issue 46, 5): a client without the
// token that keeps sending PING is closed at the deadline set at accept;
// refused AUTHs close the connection; at the connection bound a client
// without the token makes room for one with it.
func TestPreAuthBoundsAcrossCommands(t *testing.T) {
	_, addr := serve(t, &waitNode{}, Options{Token: "s3cret", AuthTimeout: 300 * time.Millisecond})
	nc, br := dial(t, addr)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		fmt.Fprint(nc, "PING\r\n")
		select {
		case <-closed:
		default:
			if time.Since(start) > 10*time.Second {
				t.Fatal("a client pinging without the token kept its connection for 10 s")
			}
			continue
		}
		break
	}
	nc2, br2 := dial(t, addr)
	for i := 0; i < maxAuthFailures; i++ {
		fmt.Fprint(nc2, "AUTH wrong\r\n")
		expect(t, br2, "-WRONGPASS")
	}
	if line, err := br2.ReadString('\n'); err == nil {
		t.Fatalf("after %d refused AUTHs the connection stayed open: %q", maxAuthFailures, line)
	}
	s, addr := serve(t, &waitNode{}, Options{Token: "s3cret", MaxConns: 4})
	for i := 0; i < 4; i++ {
		c, _ := dial(t, addr)
		fmt.Fprint(c, "PING\r\n")
	}
	connsSoon(t, s, 4, "four clients without the token")
	c, br3 := dial(t, addr)
	fmt.Fprint(c, "AUTH s3cret\r\nSET k v\r\n")
	expect(t, br3, "+OK")
	expect(t, br3, "+OK")
	if n := s.stats.evictedConns.Load(); n != 1 {
		t.Fatalf("%d connections evicted, want 1", n)
	}
}

// TestNodeWideBudget (issue 46, 6): the bytes held for all connections
// (replies owed, commands being read) have one bound: a reply past it is
// refused and its connection closed, the node serving the others; a
// command stalled before its last byte is cut off; a claimed argument is
// not held before it arrives.
func TestNodeWideBudget(t *testing.T) {
	stall := commandStall
	t.Cleanup(func() { commandStall = stall }) // after the server's
	commandStall = 300 * time.Millisecond
	f := &waitNode{val: bytes.Repeat([]byte("v"), 100<<10)}
	s, addr := serve(t, f, Options{MaxHeld: 1 << 20})
	nc, br := dial(t, addr)
	fmt.Fprint(nc, "MGET "+strings.Repeat("k ", 20)+"\r\n")
	expect(t, br, "-ERR resp: the node's budget")
	if _, err := br.ReadString('\n'); err == nil {
		t.Fatal("the connection stayed open after the refusal")
	}
	// Closed: what it held was given back before.
	if s.held.used.Load() != 0 {
		t.Fatalf("%d bytes held after the refusal", s.held.used.Load())
	}
	nc2, br2 := dial(t, addr)
	fmt.Fprint(nc2, "MGET k k k\r\nPING\r\n")
	br2.Discard(3*(100<<10+11) + 4)
	expect(t, br2, "+PONG")
	// The replies are given back once written, which may be just after
	// the client read them: the stalled command below must find the
	// budget whole, or it would be refused instead of cut off.
	for deadline := time.Now().Add(5 * time.Second); s.held.used.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still held after the replies were read", s.held.used.Load())
		}
	}

	// A 1 MiB argument claimed and 512 KiB sent: within the budget, cut
	// off once it stalls.
	stalled, br4 := dial(t, addr)
	fmt.Fprintf(stalled, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n", 1<<20)
	stalled.Write(make([]byte, 512<<10))
	if line, err := br4.ReadString('\n'); err == nil {
		t.Fatalf("a stalled command: %q, want the connection closed", line)
	}
	connsSoon(t, s, 1, "after the stalled command")
	if used := s.held.used.Load(); used != 0 {
		t.Fatalf("%d bytes still held after the stalled connection closed", used)
	}
}
