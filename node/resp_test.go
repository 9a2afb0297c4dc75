package node

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/testpki"
	"github.com/replicator/replicator/resp"
)

// startRESPNode starts a node with the RESP front door on a loopback port
// and returns it and the door's address.
func startRESPNode(t *testing.T, tweak func(o *Options)) (*Node, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := testOptions(t.TempDir())
	o.RESPListener = ln
	if tweak != nil {
		tweak(o)
	}
	return startNode(t, o), ln.Addr().String()
}

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

// TestRESPCommands: every command of the table through a real client
// (redis/go-redis v9), in RESP2 and in RESP3 (HELLO 3).
func TestRESPCommands(t *testing.T) {
	n, addr := startRESPNode(t, nil)
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprint("resp", proto), func(t *testing.T) {
			ctx := context.Background()
			c := redisClient(t, addr, proto, nil)
			p := fmt.Sprintf("p%d/", proto)
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			eq := func(got, want any) {
				t.Helper()
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("got %v, want %v", got, want)
				}
			}
			eq(c.Ping(ctx).Val(), "PONG")
			eq(c.Echo(ctx, "hi").Val(), "hi")
			must(c.Do(ctx, "SELECT", 0).Err())
			if err := c.Do(ctx, "SELECT", 1).Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR") {
				t.Fatalf("SELECT 1: %v", err)
			}
			// Plain values: SET, GET, NX, XX, GET option.
			must(c.Set(ctx, p+"a", "1", 0).Err())
			eq(c.Get(ctx, p+"a").Val(), "1")
			if err := c.Get(ctx, p+"absent").Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("GET absent: %v", err)
			}
			ok, err := c.SetNX(ctx, p+"a", "2", 0).Result()
			if err != nil || ok {
				t.Fatalf("SETNX on a held key: %v %v", ok, err)
			}
			ok, err = c.SetNX(ctx, p+"nx", "n", 0).Result()
			if err != nil || !ok {
				t.Fatalf("SETNX on an absent key: %v %v", ok, err)
			}
			ok, err = c.SetXX(ctx, p+"xx", "x", 0).Result()
			if err != nil || ok {
				t.Fatalf("SET XX on an absent key: %v %v", ok, err)
			}
			ok, err = c.SetXX(ctx, p+"a", "3", 0).Result()
			if err != nil || !ok {
				t.Fatalf("SET XX on a held key: %v %v", ok, err)
			}
			old, err := c.SetArgs(ctx, p+"a", "4", redis.SetArgs{Get: true}).Result()
			if err != nil || old != "3" {
				t.Fatalf("SET GET: %q %v", old, err)
			}
			if _, err := c.SetArgs(ctx, p+"fresh", "f", redis.SetArgs{Get: true}).Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("SET GET of an absent key: %v", err)
			}
			eq(c.Get(ctx, p+"fresh").Val(), "f")
			if err := c.Set(ctx, p+"ttl", "v", time.Minute).Err(); err == nil || !strings.Contains(err.Error(), "not supported") {
				t.Fatalf("SET EX: %v", err)
			}
			// MSET, MGET, DEL with its count, EXISTS.
			must(c.MSet(ctx, p+"m1", "x", p+"m2", "y").Err())
			eq(c.MGet(ctx, p+"m1", p+"absent", p+"m2").Val(), []any{"x", nil, "y"})
			eq(c.Exists(ctx, p+"m1", p+"m2", p+"absent").Val(), 2)
			eq(c.Del(ctx, p+"m1", p+"absent", p+"m2", p+"m1").Val(), 2)
			eq(c.Del(ctx, p+"m1").Val(), 0)
			eq(c.Exists(ctx, p+"m1").Val(), 0)
			// Counters: their own key space; GET reads one.
			eq(c.Incr(ctx, p+"n").Val(), 1)
			eq(c.IncrBy(ctx, p+"n", 10).Val(), 11)
			eq(c.Decr(ctx, p+"n").Val(), 10)
			eq(c.DecrBy(ctx, p+"n", 4).Val(), 6)
			eq(c.Get(ctx, p+"n").Val(), "6")
			eq(c.Exists(ctx, p+"n").Val(), 1)
			for _, err := range []error{c.Set(ctx, p+"n", "x", 0).Err(), c.Incr(ctx, p+"a").Err(), c.Del(ctx, p+"n").Err()} {
				if err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
					t.Fatalf("a write of the other kind: %v", err)
				}
			}
			// The connection's commands.
			id, err := c.ClientID(ctx).Result()
			if err != nil || id <= 0 {
				t.Fatalf("CLIENT ID: %d %v", id, err)
			}
			must(c.Do(ctx, "CLIENT", "SETNAME", "tester").Err())
			eq(c.ClientGetName(ctx).Val(), "tester")
			cfg, err := c.ConfigGet(ctx, "append*").Result()
			if err != nil || cfg["appendonly"] != "yes" || cfg["appendfsync"] != "always" {
				t.Fatalf("CONFIG GET: %v %v", cfg, err)
			}
			if err := c.Do(ctx, "COMMAND", "COUNT").Err(); err != nil {
				t.Fatal(err)
			}
			info, err := c.Info(ctx).Result()
			if err != nil || !strings.Contains(info, "# Keyspace") || !strings.Contains(info, "db0:keys=") || !strings.Contains(info, "redis_version:") {
				t.Fatalf("INFO: %q %v", info, err)
			}
			if aof, err := c.Do(ctx, "WAITAOF", 1, 0, 0).Slice(); err != nil || fmt.Sprint(aof) != "[1 0]" {
				t.Fatalf("WAITAOF: %v %v", aof, err)
			}
			if w, err := c.Wait(ctx, 0, 100*time.Millisecond).Result(); err != nil || w != 0 {
				t.Fatalf("WAIT with no peer: %d %v", w, err)
			}
			if err := c.Do(ctx, "NOSUCH").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
				t.Fatalf("an unknown command: %v", err)
			}
		})
	}
	// DBSIZE from the kept count: what the two runs left.
	ctx := context.Background()
	c := redisClient(t, addr, 2, nil)
	want := int64(0)
	for _, p := range []string{"p2/", "p3/"} {
		for _, k := range []string{"a", "nx", "fresh", "n"} {
			if _, err := n.Get(p + k); err == nil {
				want++
			} else if _, err := n.Counter(p + k); err == nil {
				want++
			}
		}
	}
	if got := c.DBSize(ctx).Val(); got != want || want != 8 {
		t.Fatalf("DBSIZE %d, want %d (8)", got, want)
	}
	// The dashboard's line: /admin/origin says what the door did.
	o := n.OriginReport()
	if o.RESP == nil || o.RESP.Addr != addr || o.RESP.Commands < 80 || o.RESP.Errors["wrongtype"] != 6 || o.RESP.Connections < 1 {
		t.Fatalf("/admin/origin's RESP report: %+v", o.RESP)
	}
	_, metrics := do(t, "GET", n.URL()+"/metrics", nil)
	for _, series := range []string{`replicator_resp_commands_total{cluster="a",command="incrby"} 2`, `replicator_resp_errors_total{cluster="a",kind="wrongtype"} 6`, "replicator_resp_connections{"} {
		if !strings.Contains(string(metrics), series) {
			t.Fatalf("metrics lack %s:\n%s", series, grepLines(metrics, "resp"))
		}
	}
}

// TestRESPScan: SCAN pages through keys of 3,000 bytes (a cursor the
// server keeps), under a MATCH prefix, each key exactly once.
func TestRESPScan(t *testing.T) {
	_, addr := startRESPNode(t, nil)
	ctx := context.Background()
	c := redisClient(t, addr, 3, nil)
	long := strings.Repeat("k", 3000)
	var want []string
	for i := 0; i < 57; i++ {
		k := fmt.Sprintf("in/%s%03d", long, i)
		want = append(want, k)
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, fmt.Sprintf("out/%d", i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	cursor, pages := uint64(0), 0
	for {
		keys, next, err := c.Scan(ctx, cursor, "in/*", 10).Result()
		if err != nil {
			t.Fatal(err)
		}
		got, cursor = append(got, keys...), next
		if pages++; cursor == 0 || pages > 100 {
			break
		}
	}
	sort.Strings(got)
	if fmt.Sprint(got) != fmt.Sprint(want) || pages < 6 {
		t.Fatalf("%d keys in %d pages, want %d", len(got), pages, len(want))
	}
	if err := c.Scan(ctx, 0, "a*b", 10).Err(); err == nil {
		t.Fatal("a MATCH pattern other than prefix* was taken")
	}
	if err := c.Scan(ctx, 987654321, "", 10).Err(); err == nil {
		t.Fatal("an unknown cursor was taken")
	}
}

// TestRESPPipelines: a pipeline's writes are answered in order and see each
// other (a read after a write in one pipeline sees it); many connections
// at once each keep their own order; every increment acknowledged is
// counted exactly once.
func TestRESPPipelines(t *testing.T) {
	n, addr := startRESPNode(t, nil)
	ctx := context.Background()
	c := redisClient(t, addr, 2, func(o *redis.Options) { o.PoolSize = 32 })
	pipe := c.Pipeline()
	incrs := make([]*redis.IntCmd, 500)
	for i := range incrs {
		incrs[i] = pipe.Incr(ctx, "ctr")
	}
	pipe.Set(ctx, "k", "last", 0)
	get := pipe.Get(ctx, "k")
	groups := n.rep.Groups()
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// The pipeline's writes are queued before any is waited for: they
	// share group commits (one fsync each), not one fsync a write.
	t.Logf("501 pipelined writes: %d group commits", n.rep.Groups()-groups)
	if g := n.rep.Groups() - groups; g >= 100 {
		t.Fatalf("501 pipelined writes took %d group commits", g)
	}
	for i, cmd := range incrs {
		if cmd.Val() != int64(i+1) {
			t.Fatalf("INCR %d of the pipeline answered %d", i, cmd.Val())
		}
	}
	if get.Val() != "last" {
		t.Fatalf("a GET after a SET in one pipeline: %q", get.Val())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipe := c.Pipeline()
			key := fmt.Sprintf("own-%d", w)
			cmds := make([]*redis.IntCmd, 100)
			for i := range cmds {
				cmds[i] = pipe.Incr(ctx, key)
				pipe.Incr(ctx, "shared")
			}
			if _, err := pipe.Exec(ctx); err != nil {
				errs <- err
				return
			}
			for i, cmd := range cmds {
				if cmd.Val() != int64(i+1) {
					errs <- fmt.Errorf("%s: INCR %d answered %d", key, i, cmd.Val())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v, err := n.Counter("shared"); err != nil || v.Value != 1600 {
		t.Fatalf("shared counter %d (%v), want 1600", v.Value, err)
	}
}

// TestRESPAuthAndTLS: with an API token the door answers nothing but AUTH
// and HELLO before the token is given (NOAUTH), refuses a wrong one
// (WRONGPASS), and serves over the API's TLS.
func TestRESPAuthAndTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.New(t, "resp test CA")
	certFile, keyFile := ca.IssueUnnamed(t)
	pool := ca.Pool()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600)
	_, addr := startRESPNode(t, func(o *Options) {
		o.APIToken = "s3cret"
		o.TLSCert, o.TLSKey = certFile, keyFile
	})
	ctx := context.Background()
	tlsConf := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	for _, proto := range []int{2, 3} {
		anon := redisClient(t, addr, proto, func(o *redis.Options) { o.TLSConfig = tlsConf })
		if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
			t.Fatalf("resp%d: PING without the token: %v", proto, err)
		}
		wrong := redisClient(t, addr, proto, func(o *redis.Options) { o.TLSConfig, o.Password = tlsConf, "nope" })
		if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("resp%d: a wrong token: %v", proto, err)
		}
		good := redisClient(t, addr, proto, func(o *redis.Options) { o.TLSConfig, o.Password = tlsConf, "s3cret" })
		if err := good.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("resp%d: with the token over TLS: %v", proto, err)
		}
	}
	plain := redisClient(t, addr, 2, func(o *redis.Options) { o.Password = "s3cret" })
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("the TLS door answered a plaintext client")
	}
}

// TestRESPNotWrittenClosesTheConnection: a write refused as not written
// (the disk is full) answers NOTWRITTEN; the rest of its pipeline is not
// executed (NOTWRITTEN too) and the connection closes; a new connection
// writes once the space is back.
func TestRESPNotWrittenClosesTheConnection(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "disk-full")
	n, addr := startRESPNode(t, func(o *Options) { o.Testing.DiskFullFile = full })
	ctx := context.Background()
	c := redisClient(t, addr, 2, func(o *redis.Options) { o.PoolSize = 1 })
	if err := c.Set(ctx, "before", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(full, []byte("full"), 0o644)
	pipe := c.Pipeline()
	first := pipe.Set(ctx, "during", "v", 0)
	second := pipe.Set(ctx, "after-the-failure", "v", 0)
	pipe.Exec(ctx)
	if err := first.Err(); err == nil || !strings.HasPrefix(err.Error(), "NOTWRITTEN") {
		t.Fatalf("a write on a full disk: %v", err)
	}
	if err := second.Err(); err == nil {
		t.Fatal("the pipeline went on after a write that was not written")
	}
	if _, err := n.Get("after-the-failure"); err == nil {
		t.Fatal("a command after a not-written one was executed")
	}
	os.WriteFile(full, nil, 0o644)
	if err := c.Set(ctx, "later", "v", 0).Err(); err != nil {
		t.Fatalf("a new connection once space is back: %v", err)
	}
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
	if err := rc.Set(ctx, "n", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Fatalf("a SET of a counter through the follower: %v", err)
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

// TestRESPCloseWithAWaitingClient: a client in WAIT for a peer that never
// acknowledges (timeout 0: no bound) does not hold the node's close: it is
// answered with what holds, and its connection ends.
func TestRESPCloseWithAWaitingClient(t *testing.T) {
	n, addr := startRESPNode(t, nil)
	c := redisClient(t, addr, 2, nil)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- c.Wait(ctx, 1, 0).Err() }()
	waitFor(t, 5*time.Second, func() (bool, string) {
		_, m := do(t, "GET", n.URL()+"/metrics", nil)
		return strings.Contains(string(m), `command="wait"} 1`), "WAIT not received yet"
	})
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	<-answered
}
