package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/resp"
)

// These stay inside the package on purpose: TestRESPFollowerForwards
// watches what the follower sends its leader on the raft port (each write
// a typed proposal), which no outside observer can read; and
// TestRESPClientThatDoesNotRead serves the door's node over a pipe, to
// hold a client's unread replies without a socket's buffers between.

func redisClient(t *testing.T, addr string, proto int, tweak func(o *redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, Protocol: proto, MaxRetries: -1, DisableIdentity: false}
	if tweak != nil {
		tweak(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRESPFollowerForwards: in a cluster of three, a follower's RESP door
// forwards writes to the leader one hop, in the connection's order (a
// pipeline's increments answer 1..n), with the answers that depend on prior
// state decided there (DEL's count, NX, INCR's value); the follower then
// reads its own writes. Each write crosses as a typed proposal.
func TestRESPFollowerForwards(t *testing.T) {
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	c := newRaftCluster(t, "r", 3, func(name string, o *Options) {
		addrs[name], free = free[0], free[1:]
		o.RESPListen = addrs[name]
		if name == "r3" {
			release()
		}
	})
	f := c.follower()
	sent := recordProposals(c.nodes[f])
	ctx := context.Background()
	rc := redisClient(t, addrs[f], 3, nil)
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET at follower %s: %v", f, err)
	}
	if got := rc.Get(ctx, "k").Val(); got != "v" {
		t.Fatalf("the follower does not read its own write: %q", got)
	}
	pipe := rc.Pipeline()
	incrs := make([]*redis.IntCmd, 50)
	for i := range incrs {
		incrs[i] = pipe.Incr(ctx, "n")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range incrs {
		if cmd.Val() != int64(i+1) {
			t.Fatalf("forwarded INCR %d answered %d", i, cmd.Val())
		}
	}
	if ok, err := rc.SetNX(ctx, "k", "other", 0).Result(); err != nil || ok {
		t.Fatalf("SETNX of a held key through the follower: %v %v", ok, err)
	}
	if err := rc.MSet(ctx, "m1", "1", "m2", "2").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Del(ctx, "m1", "m2", "absent").Result(); err != nil || n != 2 {
		t.Fatalf("DEL through the follower: %d %v", n, err)
	}
	if err := rc.Incr(ctx, "k").Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR value is not an integer") {
		t.Fatalf("an INCR of a value that is not an integer through the follower: %v", err)
	}
	l := c.nodes[c.leader()]
	if v, err := l.Counter("n"); err != nil || v.Value != 50 {
		t.Fatalf("the leader's counter: %d %v", v.Value, err)
	}
	if r, err := l.Get("k"); err != nil || string(r.Value) != "v" {
		t.Fatalf("the leader's k: %q %v", r.Value, err)
	}
	sent.check(t, 55) // typed proposals, never the HTTP API
}

// TestRESPClientThatDoesNotRead: a client that pipelines without reading
// its replies is cut off once the replies it owes pass the bound, or a
// reply waits past the write timeout; the server holds no more for it, and
// its connection ends. Past the connection bound a client is told so.
func TestRESPClientThatDoesNotRead(t *testing.T) {
	n := startNode(t, testOptions(t.TempDir()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := resp.New(newRESPNode(n), resp.Options{MaxReply: 4 << 20, WriteTimeout: 200 * time.Millisecond, MaxConns: 2})
	go srv.Serve(ln)
	defer func() { ln.Close(); srv.Close() }()
	if _, err := n.Put(context.Background(), "big", make([]byte, 256<<10)); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// 2,000 GETs of 256 KiB: 500 MiB of replies, never read.
	go func() {
		cmd := []byte("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n")
		for i := 0; i < 2000; i++ {
			if _, err := nc.Write(cmd); err != nil {
				return
			}
		}
	}()
	waitFor(t, 10*time.Second, func() (bool, string) {
		c := srv.Stats().Connections()
		return c == 1, fmt.Sprintf("%d connections served", c)
	})
	waitFor(t, 10*time.Second, func() (bool, string) {
		c := srv.Stats().Connections()
		return c == 0, fmt.Sprintf("%d connections still served", c)
	})
	// What it was sent before the cut, then the end.
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after %d bytes of replies: %v, want the connection closed", n, err)
	}
	// One MGET whose reply alone passes the bound (20 values of 256 KiB,
	// 5 MiB): refused whole, not held, and the connection ends.
	mg, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	fmt.Fprintf(mg, "MGET%s\r\n", strings.Repeat(" big", 20))
	mg.SetReadDeadline(time.Now().Add(10 * time.Second))
	mr := bufio.NewReader(mg)
	if line, err := mr.ReadString('\n'); err != nil || !strings.HasPrefix(line, "-ERR the reply exceeds") {
		t.Fatalf("an MGET past the bound on replies: %.80q %v", line, err)
	}
	if rest, err := mr.ReadString('\n'); err == nil {
		t.Fatalf("the connection stayed open after the refused MGET: %.80q", rest)
	}
	waitFor(t, 10*time.Second, func() (bool, string) {
		c := srv.Stats().Connections()
		return c == 0, fmt.Sprintf("%d connections still served", c)
	})
	// The bound on connections: two held, a third told and closed.
	held := make([]net.Conn, 2)
	for i := range held {
		if held[i], err = net.Dial("tcp", ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		defer held[i].Close()
		fmt.Fprintf(held[i], "PING\r\n")
		if line, err := bufio.NewReader(held[i]).ReadString('\n'); err != nil || line != "+PONG\r\n" {
			t.Fatalf("connection %d: %q %v", i, line, err)
		}
	}
	third, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if line, _ := bufio.NewReader(third).ReadString('\n'); !strings.Contains(line, "max number of clients") {
		t.Fatalf("a third connection past the bound of two: %q", line)
	}
}
