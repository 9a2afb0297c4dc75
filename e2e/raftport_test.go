package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 25, finding 3: with an API token, a loopback raft port without
// credentials let any local process without the token join the cluster,
// read every write and depose the leader. Such a node now refuses to start
// and says why; without a token (the demo, the README's loopback recipe)
// the loopback port stays.
func TestLoopbackRaftPortRefusedBesideAnAPIToken(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	raft := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := newProc(t, "a1", "a", "--node-id", "a1", "--raft-listen", raft, "--gossip-bind", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--api-token-file", token)
	mark := p.logMark()
	p.start()
	if !p.waitExit(20 * time.Second) {
		t.Fatal("a node with an API token and a loopback raft port without credentials started")
	}
	if log := p.logSince(mark); !strings.Contains(log, "raft port needs credentials") {
		t.Fatalf("it did not say why: %s", tail(log, 5))
	}
	if c, err := net.DialTimeout("tcp", raft, time.Second); err == nil {
		c.Close()
		t.Fatal("its raft port listens")
	}
}

// Issue 25, finding 7: the raft port held every connection opened to it
// (600 idle ones, for ever). It holds at most --max-connections; the rest
// are closed at once, and the node goes on serving.
func TestRaftPortConnectionsBounded(t *testing.T) {
	raft := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := newProc(t, "a1", "a", "--node-id", "a1", "--raft-listen", raft, "--gossip-bind", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--bootstrap-expect", "1", "--max-connections", "20")
	p.startReady()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 100; i++ {
		c, err := net.DialTimeout("tcp", raft, time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	// A connection the port closed reads EOF; one it holds times out a
	// read. Polled until the port closed all but 20 (a loaded machine may
	// take its time).
	closed := map[int]bool{}
	open := len(conns)
	// (Within 5 s: idle connections past the 10 s handshake timeout would
	// be closed even without the bound.)
	for deadline := time.Now().Add(5 * time.Second); open > 20 && time.Now().Before(deadline); {
		for i, c := range conns {
			if closed[i] {
				continue
			}
			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				closed[i] = true
			}
		}
		open = len(conns) - len(closed)
	}
	if open > 20 {
		t.Fatalf("%d of 100 idle connections held by a raft port bounded at 20", open)
	}
	if _, err := p.client().Put(bg(), "still", []byte("serving")); err != nil {
		t.Fatalf("the node after the flood: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
