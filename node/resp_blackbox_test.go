package node_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/internal/testpki"
	"github.com/replicator/replicator/node"
)

// startRESPNode starts a node with the RESP front door on a loopback port
// and returns it and the door's address.
func startRESPNode(t *testing.T, tweak func(o *node.Options)) (*node.Node, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := opts(t.TempDir())
	o.RESPListener = ln
	if tweak != nil {
		tweak(o)
	}
	return nodetest.Start(t, o), ln.Addr().String()
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
			must(c.Set(ctx, p+"ttl", "v", time.Minute).Err())
			if d := c.TTL(ctx, p+"ttl").Val(); d <= 0 || d > time.Minute {
				t.Fatalf("TTL after SET EX 60: %v", d)
			}
			// MSET, MGET, DEL with its count, EXISTS.
			must(c.MSet(ctx, p+"m1", "x", p+"m2", "y").Err())
			eq(c.MGet(ctx, p+"m1", p+"absent", p+"m2").Val(), []any{"x", nil, "y"})
			eq(c.Exists(ctx, p+"m1", p+"m2", p+"absent").Val(), 2)
			eq(c.Del(ctx, p+"m1", p+"absent", p+"m2", p+"m1").Val(), 2)
			eq(c.Del(ctx, p+"m1").Val(), 0)
			eq(c.Exists(ctx, p+"m1").Val(), 0)
			// Counters: GET reads one; INCR adds to an integer string;
			// SET and DEL replace and remove one like any value.
			eq(c.Incr(ctx, p+"n").Val(), 1)
			eq(c.IncrBy(ctx, p+"n", 10).Val(), 11)
			eq(c.Decr(ctx, p+"n").Val(), 10)
			eq(c.DecrBy(ctx, p+"n", 4).Val(), 6)
			eq(c.Get(ctx, p+"n").Val(), "6")
			eq(c.Exists(ctx, p+"n").Val(), 1)
			eq(c.Incr(ctx, p+"a").Val(), 5) // a holds "4"
			eq(c.Decr(ctx, p+"a").Val(), 4)
			eq(c.IncrByFloat(ctx, p+"a", 0.5).Val(), 4.5)
			must(c.Set(ctx, p+"a", "4", 0).Err())
			if err := c.Incr(ctx, p+"fresh").Err(); err == nil || err.Error() != "ERR value is not an integer or out of range" {
				t.Fatalf("INCR of a value that is not an integer: %v", err)
			}
			eq(c.Incr(ctx, p+"c").Val(), 1)
			must(c.Set(ctx, p+"c", "7", 0).Err())
			eq(c.Incr(ctx, p+"c").Val(), 8)
			eq(c.Del(ctx, p+"c").Val(), 1)
			eq(c.Exists(ctx, p+"c").Val(), 0)
			eq(c.Incr(ctx, p+"c").Val(), 1)
			eq(c.Unlink(ctx, p+"c", p+"absent").Val(), 1)
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
			// What redis_exporter and redis-cli --stat read.
			for _, field := range []string{"used_memory:", "total_commands_processed:", "total_connections_received:", "role:master", "connected_slaves:0", "connected_clients:"} {
				if !strings.Contains(info, "\r\n"+field) && !strings.Contains(info, "\n"+field) {
					t.Fatalf("INFO lacks %s: %q", field, info)
				}
			}
			if aof, err := c.Do(ctx, "WAITAOF", 1, 0, 0).Slice(); err != nil || fmt.Sprint(aof) != "[1 0]" {
				t.Fatalf("WAITAOF: %v %v", aof, err)
			}
			if w, err := c.Wait(ctx, 0, 100*time.Millisecond).Result(); err != nil || w != 0 {
				t.Fatalf("WAIT with no peer: %d %v", w, err)
			}
			if err := c.Do(ctx, "NOSUCH").Err(); err == nil || !strings.Contains(err.Error(), "unknown command 'NOSUCH'") {
				t.Fatalf("an unknown command: %v", err)
			}
			// The string commands that read and write on what they read.
			eq(c.Do(ctx, "SETNX", p+"s", "hello").Val(), 1)
			eq(c.Do(ctx, "SETNX", p+"s", "again").Val(), 0)
			eq(c.Append(ctx, p+"s", " world").Val(), 11)
			eq(c.GetRange(ctx, p+"s", -5, -1).Val(), "world")
			eq(c.SetRange(ctx, p+"s", 6, "WORLD").Val(), 11)
			eq(c.GetSet(ctx, p+"s", "next").Val(), "hello WORLD")
			eq(c.GetDel(ctx, p+"s").Val(), "next")
			if err := c.GetDel(ctx, p+"s").Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("GETDEL of an absent key: %v", err)
			}
			eq(c.Append(ctx, p+"s", "new").Val(), 3)
			eq(c.Unlink(ctx, p+"s", p+"absent").Val(), 1)
			// A counter's value is a string like any: APPEND writes it
			// as one, and INCR counts on from it.
			eq(c.Append(ctx, p+"n", "0").Val(), 2)
			eq(c.Incr(ctx, p+"n").Val(), 61)
			eq(c.DecrBy(ctx, p+"n", 55).Val(), 6)
			// What tools and clients assume: TYPE, STRLEN, KEYS and SCAN
			// MATCH with Redis's globs, TIME; scripting named as not served.
			eq(c.Type(ctx, p+"a").Val(), "string")
			eq(c.Type(ctx, p+"n").Val(), "string") // a counter reads as an integer string
			eq(c.Type(ctx, p+"absent").Val(), "none")
			eq(c.StrLen(ctx, p+"a").Val(), 1)
			eq(c.StrLen(ctx, p+"n").Val(), 1) // "6"
			eq(c.StrLen(ctx, p+"absent").Val(), 0)
			must(c.MSet(ctx, p+"g/hello", "1", p+"g/hallo", "1", p+"g/hillo", "1", p+"g/h*llo", "1").Err())
			keys, err := c.Keys(ctx, p+"g/h[ae]llo").Result()
			slices.Sort(keys)
			eq(keys, []string{p + "g/hallo", p + "g/hello"})
			keys, _ = c.Keys(ctx, p+`g/h\*llo`).Result()
			eq(keys, []string{p + "g/h*llo"})
			var scanned []string
			for cur := uint64(0); ; {
				page, next, err := c.Scan(ctx, cur, p+"g/h?llo", 2).Result()
				must(err)
				scanned = append(scanned, page...)
				if cur = next; cur == 0 {
					break
				}
			}
			slices.Sort(scanned)
			eq(scanned, []string{p + "g/h*llo", p + "g/hallo", p + "g/hello", p + "g/hillo"})
			if tm, err := c.Time(ctx).Result(); err != nil || time.Since(tm).Abs() > time.Minute {
				t.Fatalf("TIME: %v %v", tm, err)
			}
			if err := c.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "not served") || !strings.Contains(err.Error(), "MSET") {
				t.Fatalf("EVAL: %v", err)
			}
		})
	}
	// DBSIZE from the kept count: what the two runs left.
	ctx := context.Background()
	c := redisClient(t, addr, 2, nil)
	want := int64(0)
	for _, p := range []string{"p2/", "p3/"} {
		for _, k := range []string{"a", "nx", "fresh", "ttl", "n", "g/hello", "g/hallo", "g/hillo", "g/h*llo"} {
			if _, err := n.Get(p + k); err == nil {
				want++
			} else if _, err := n.Counter(p + k); err == nil {
				want++
			}
		}
	}
	if got := c.DBSize(ctx).Val(); got != want || want != 18 {
		t.Fatalf("DBSIZE %d, want %d (18)", got, want)
	}
	// The dashboard's line: /admin/origin says what the door did.
	o := n.OriginReport()
	if o.RESP == nil || o.RESP.Addr != addr || o.RESP.Commands < 80 || o.RESP.Errors["bad_request"] != 4 || o.RESP.Connections < 1 {
		t.Fatalf("/admin/origin's RESP report: %+v", o.RESP)
	}
	_, metrics := nodetest.Do(t, "GET", n.URL()+"/metrics", nil)
	for _, series := range []string{`replicator_resp_unknown_commands_total{cluster="a",command="nosuch"} 2`,
		`replicator_resp_commands_total{cluster="a",command="incrby"} 2`, `replicator_resp_errors_total{cluster="a",kind="bad_request"} 4`, "replicator_resp_connections{"} {
		if !strings.Contains(string(metrics), series) {
			t.Fatalf("metrics lack %s:\n%s", series, nodetest.GrepLines(metrics, "resp"))
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
	// A glob beyond prefix*: the pages read from its literal prefix and
	// keep what matches.
	var odd []string
	for cur := uint64(0); ; {
		keys, next, err := c.Scan(ctx, cur, "in/k*00[0-2]", 10).Result()
		if err != nil {
			t.Fatal(err)
		}
		if odd = append(odd, keys...); next == 0 {
			break
		}
		cur = next
	}
	sort.Strings(odd)
	if fmt.Sprint(odd) != fmt.Sprint(want[:3]) {
		t.Fatalf("SCAN MATCH in/k*00[0-2]: %d keys, want the first three", len(odd))
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
	groups := n.WALReport().Groups
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// The pipeline's writes are queued before any is waited for: they
	// share group commits (one fsync each), not one fsync a write.
	t.Logf("501 pipelined writes: %d group commits", n.WALReport().Groups-groups)
	if g := n.WALReport().Groups - groups; g >= 100 {
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
	_, addr := startRESPNode(t, func(o *node.Options) {
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
	n, addr := startRESPNode(t, func(o *node.Options) { o.Testing.DiskFullFile = full })
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
	nodetest.WaitFor(t, 5*time.Second, func() (bool, string) {
		_, m := nodetest.Do(t, "GET", n.URL()+"/metrics", nil)
		return strings.Contains(string(m), `command="wait"} 1`), "WAIT not received yet"
	})
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	<-answered
}

// TestVersionCacheSeries: a key written three times through the door is
// read from the tree at its second write and answered by the version cache
// at its third; /metrics says so.
func TestVersionCacheSeries(t *testing.T) {
	n, addr := startRESPNode(t, nil)
	c := redisClient(t, addr, 1, nil)
	for i := range 3 {
		if err := c.Set(context.Background(), "vc/k", fmt.Sprint(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, metrics := nodetest.Do(t, "GET", n.URL()+"/metrics", nil)
	for _, series := range []string{`replicator_version_cache_lookups_total{cluster="a",result="hit"} 1`,
		`replicator_version_cache_lookups_total{cluster="a",result="miss"} 1`, `replicator_version_cache_keys{cluster="a"} 1`} {
		if !strings.Contains(string(metrics), series) {
			t.Fatalf("metrics lack %s:\n%s", series, nodetest.GrepLines(metrics, "version_cache"))
		}
	}
}
