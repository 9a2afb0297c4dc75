package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/replicator/replicator/node"
)

// respPair starts a pair of clusters a and b, each serving RESP on a
// port of its own (ports by cluster); before, when set, changes their
// processes first.
func respPair(t *testing.T, before func(m *mesh)) (*mesh, map[string]int) {
	m := newMesh(t, seed(t), false, "a", "b")
	ports := map[string]int{}
	for _, n := range m.names {
		ports[n] = freePort(t)
		m.nodes[n].args = append(m.nodes[n].args, "--resp-listen", fmt.Sprintf("127.0.0.1:%d", ports[n]))
	}
	if before != nil {
		before(m)
	}
	m.start()
	return m, ports
}

// redisCLI runs redis-cli against a RESP port. A machine without it fails
// the test: .ci/run installs redis-tools.
func redisCLI(t *testing.T, port int, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is not installed (Debian: redis-tools; .ci/run installs it): %v", err)
	}
	out, err := exec.Command(bin, append([]string{"-h", "127.0.0.1", "-p", fmt.Sprint(port)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestRESPAcrossPairedClusters: two paired clusters, each with its RESP
// door; redis-cli SETs at one and GETs at the other, and counters
// incremented at both sum at both.
func TestRESPAcrossPairedClusters(t *testing.T) {
	m, ports := respPair(t, nil)
	if got := redisCLI(t, ports["a"], "SET", "greeting", "hello from a"); got != "OK" {
		t.Fatalf("SET at a: %q", got)
	}
	for i := 0; i < 5; i++ {
		redisCLI(t, ports["a"], "INCR", "visits")
		redisCLI(t, ports["b"], "INCRBY", "visits", "10")
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		got := redisCLI(t, ports["b"], "GET", "greeting")
		return got == "hello from a", fmt.Sprintf("GET at b: %q", got)
	})
	for _, n := range m.names {
		eventually(t, 30*time.Second, func() (bool, string) {
			got := redisCLI(t, ports[n], "GET", "visits")
			return got == "55", fmt.Sprintf("the counter at %s: %q", n, got)
		})
	}
	if got := redisCLI(t, ports["b"], "DBSIZE"); got != "2" {
		t.Fatalf("DBSIZE at b: %q", got)
	}
	if info := redisCLI(t, ports["a"], "INFO", "replication"); !strings.Contains(info, "name=b,state=") {
		t.Fatalf("INFO replication at a does not show the link to b:\n%s", info)
	}
}

// TestRESPCrashBetweenCommitAndAnswer: the process dies once a RESP write
// committed and before its answer: the client sees a connection error,
// not OK, and the write is there after the restart.
func TestRESPCrashBetweenCommitAndAnswer(t *testing.T) {
	port := freePort(t)
	p := newProc(t, "a", "a", "--resp-listen", fmt.Sprintf("127.0.0.1:%d", port))
	p.env = append(p.env, "REPLICATOR_TESTING_RESP_CRASH_KEY=crash-me")
	p.startReady()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "before", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	err := c.Set(ctx, "crash-me", "committed", 0).Err()
	if err == nil || strings.HasPrefix(err.Error(), "NOTWRITTEN") || strings.HasPrefix(err.Error(), "ERR") {
		t.Fatalf("the answer of a write whose process died before answering: %v", err)
	}
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process did not die between the commit and the answer")
	}
	p.kill() // reaps it
	p.env = nil
	p.startReady()
	for _, k := range []string{"before", "crash-me"} {
		if got := redisCLI(t, port, "GET", k); got == "" {
			t.Fatalf("%s is not there after the restart", k)
		}
	}
}

// TestRESPWaitCountsPeerClusters: WAIT answers how many peer clusters hold
// the connection's writes, at the leader and at a follower of a cluster
// of three (whose forwarded writes carry the leader's index and stream; it
// asks the leader, which holds the links): 1 while the peer takes them, 0
// for a write made while the peer is down, 1 again once it is back.
func TestRESPWaitCountsPeerClusters(t *testing.T) {
	m := &rmesh{t: t, clusters: []string{"a", "b"}, nodes: map[string]*rnode{}, removed: map[string]bool{}, down: map[string]bool{}}
	ports := map[string]int{}
	for i := 1; i <= 3; i++ {
		n := m.prepare("a", fmt.Sprintf("a%d", i), 3)
		ports[n.id] = freePort(t)
		n.args = append(n.args, "--resp-listen", fmt.Sprintf("127.0.0.1:%d", ports[n.id]))
	}
	b := m.prepare("b", "b1", 1)
	m.start()
	l := m.waitLeader("a", 30*time.Second)
	var f *rnode
	for _, n := range m.members("a") {
		if n.id != l.id {
			f = n
		}
	}
	ctx := context.Background()
	conns := map[string]*redis.Conn{}
	for _, n := range []*rnode{l, f} {
		c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports[n.id]), MaxRetries: -1})
		defer c.Close()
		conns[n.id] = c.Conn() // WAIT speaks of its own connection's writes
		defer conns[n.id].Close()
	}
	waitFor := func(who *rnode, key string, want int64, timeout time.Duration) {
		t.Helper()
		c := conns[who.id]
		if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s at %s: %v", key, who.id, err)
		}
		got, err := c.Wait(ctx, int(want), timeout).Result()
		if err != nil || got != want {
			t.Fatalf("WAIT %d after SET %s at %s (%s): %d %v", want, key, who.id, map[bool]string{true: "leader", false: "follower"}[who == l], got, err)
		}
	}
	waitFor(l, "at-leader", 1, 30*time.Second)
	waitFor(f, "at-follower", 1, 30*time.Second)
	b.kill()
	for _, n := range []*rnode{l, f} {
		// The peer is down: no peer holds it, and WAIT says so once its
		// timeout passes.
		c := conns[n.id]
		if err := c.Set(ctx, "peer-down-"+n.id, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Wait(ctx, 1, 500*time.Millisecond).Result(); err != nil || got != 0 {
			t.Fatalf("WAIT at %s for a write the down peer cannot hold: %d %v", n.id, got, err)
		}
	}
	b.startReady()
	for _, n := range []*rnode{l, f} {
		if got, err := conns[n.id].Wait(ctx, 1, 30*time.Second).Result(); err != nil || got != 1 {
			t.Fatalf("WAIT at %s once the peer is back: %d %v", n.id, got, err)
		}
	}
	if got := httpGet(t, b, "peer-down-"+f.id); got != "v" {
		t.Fatalf("b holds %q of the follower's write WAIT counted", got)
	}
}

// TestRESPWaitOverAFilter (issue 45, case 3): a write the link's filter
// keeps home is acknowledged by the peer as a filtered marker, which moves
// its mark past the write; WAIT counted the peer (1) while the peer
// answered 404 for the key. WAIT counts a peer only if it holds every
// write of the connection: a connection that wrote a key the filter keeps
// home (alone, or in a transaction's batch) counts the peer no more; one
// whose writes all cross counts it.
func TestRESPWaitOverAFilter(t *testing.T) {
	m := newMesh(t, seed(t), false, "a", "b")
	port := freePort(t)
	a, b := m.nodes["a"], m.nodes["b"]
	a.args = append(a.args, "--resp-listen", fmt.Sprintf("127.0.0.1:%d", port), "--peer-exclude", "b=home/")
	m.start()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer c.Close()
	conn := func() *redis.Conn { cn := c.Conn(); t.Cleanup(func() { cn.Close() }); return cn }
	wait := func(cn *redis.Conn, what string, want int64, timeout time.Duration) {
		t.Helper()
		got, err := cn.Wait(ctx, 1, timeout).Result()
		if err != nil || got != want {
			t.Fatalf("WAIT 1 after %s: %d %v, want %d", what, got, err, want)
		}
	}
	shared := conn()
	if err := shared.Set(ctx, "shared/1", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(shared, "a write that crosses", 1, 30*time.Second)

	home := conn()
	if err := home.Set(ctx, "home/1", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(home, "a write the filter keeps home", 0, 700*time.Millisecond)
	if err := home.Set(ctx, "shared/2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// b takes shared/2, and its mark passes both writes, yet it lacks one.
	eventually(t, 30*time.Second, func() (bool, string) {
		got := getOr(t, b, "shared/2")
		return got == "v", fmt.Sprintf("b's shared/2: %q", got)
	})
	wait(home, "a home write, then one that crosses", 0, 300*time.Millisecond)
	if got := getOr(t, b, "home/1"); got != "" {
		t.Fatalf("b holds home/1 (%q): the filter let it cross", got)
	}

	batch := conn()
	if err := batch.MSet(ctx, "shared/3", "v", "home/2", "v").Err(); err != nil {
		t.Fatal(err)
	}
	wait(batch, "a batch the filter cut", 0, 700*time.Millisecond)

	again := conn()
	if err := again.Set(ctx, "shared/4", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(again, "a new connection's write that crosses", 1, 30*time.Second)
	_ = a
}

// getOr reads a key at a node over HTTP ("" when it holds none).
func getOr(t *testing.T, p *proc, key string) string {
	t.Helper()
	r, err := p.client().Get(bg(), key)
	if err != nil {
		return ""
	}
	return string(r.Value)
}

// httpGet reads a key at a node over HTTP (empty when it holds none).
func httpGet(t *testing.T, n *rnode, key string) string {
	t.Helper()
	r, err := n.client().Get(bg(), key)
	if err != nil {
		return ""
	}
	return string(r.Value)
}

// redisPy runs a Python script with redis-py (Debian's python3-redis, the
// client most applications use) against a RESP port: r is its client. A
// machine without it fails the test: .ci/run installs python3-redis.
func redisPy(t *testing.T, port int, script string) (string, error) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import redis").Run(); err != nil {
		t.Fatalf("redis-py is not installed for /usr/bin/python3 (Debian: python3-redis; .ci/run installs it): %v", err)
	}
	prog := fmt.Sprintf("import redis\nr = redis.Redis(host='127.0.0.1', port=%d, decode_responses=True)\n%s\n", port, script)
	out, err := exec.Command("/usr/bin/python3", "-c", prog).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestRESPTransactionsAtAPair: at a pair of clusters, a transaction of
// plain writes (go-redis TxPipelined, redis-py's default pipeline) commits
// whole at a and reaches b whole; one that queues a command a transaction
// here does not serve is refused at EXEC and writes nothing, at either
// cluster (it used to apply its writes one by one while answering an
// error, and a retry applied them twice).
func TestRESPTransactionsAtAPair(t *testing.T) {
	_, ports := respPair(t, nil)
	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports["a"])})
	defer a.Close()
	b := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports["b"])})
	defer b.Close()

	cmds, err := a.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "tx/1", "one", 0)
		p.MSet(ctx, "tx/2", "two", "tx/3", "three")
		return nil
	})
	if err != nil || len(cmds) != 2 {
		t.Fatalf("go-redis TxPipelined: %v (%d replies)", err, len(cmds))
	}
	out, err := redisPy(t, ports["a"], `p = r.pipeline()
p.set('py/1', 'one')
p.set('py/2', 'two')
print(p.execute())`)
	if err != nil || out != "[True, True]" {
		t.Fatalf("redis-py pipeline: %v: %s", err, out)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		got, _ := b.MGet(ctx, "tx/1", "tx/2", "tx/3", "py/1", "py/2").Result()
		return fmt.Sprint(got) == "[one two three one two]", fmt.Sprintf("at b: %v", got)
	})

	// Refused whole: nothing written at a, nothing reaches b.
	_, err = a.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "half/1", "x", 0)
		p.LPush(ctx, "half/l", "x")
		p.Set(ctx, "half/2", "y", 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("a transaction with LPUSH: %v, want EXECABORT", err)
	}
	out, err = redisPy(t, ports["a"], `p = r.pipeline()
p.set('half/3', 'x')
p.lpush('half/l', 'x')
try:
    p.execute()
    print('executed')
except redis.exceptions.ResponseError as e:
    # redis-py raises the first command refused while queueing; EXEC
    # answered EXECABORT (ExecAbortError is a ResponseError too).
    print('aborted' if 'unknown command' in str(e) or 'EXECABORT' in str(e) else 'other: ' + str(e))`)
	if err != nil || out != "aborted" {
		t.Fatalf("redis-py pipeline with LPUSH: %v: %s", err, out)
	}
	// A marker written after them reaches b: what was refused before it
	// would have too.
	if err := a.Set(ctx, "marker", "m", 0).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		got, err := b.Get(ctx, "marker").Result()
		return got == "m", fmt.Sprintf("marker at b: %q %v", got, err)
	})
	for _, c := range []*redis.Client{a, b} {
		if n, err := c.Exists(ctx, "half/1", "half/2", "half/3", "half/l").Result(); err != nil || n != 0 {
			t.Fatalf("a refused transaction left %d keys (%v)", n, err)
		}
	}

	// The connections as redis-py lists them, and one killed by its ID.
	out, err = redisPy(t, ports["a"], `r.client_setname('lister')
other = redis.Redis(host='127.0.0.1', port=r.connection_pool.connection_kwargs['port'])
other.client_setname('victim')
victim = [c for c in r.client_list() if c['name'] == 'victim'][0]
print(sorted(c['name'] for c in r.client_list() if c['name']), r.client_kill_filter(_id=victim['id']), victim['cmd'])`)
	if err != nil || out != "['lister', 'victim'] 1 client" {
		t.Fatalf("redis-py CLIENT LIST and KILL: %v: %s", err, out)
	}
}

// TestRESPWatchRetryLoops: the optimistic read-modify-write applications
// use (go-redis Watch, redis-py's pipeline with watch and WatchError
// retries) at a pair of clusters. Eight go-redis clients and two redis-py
// processes each add 1 to a plain integer key 25 times through WATCH, GET,
// MULTI, SET, EXEC at cluster a, retrying when EXEC answers nil: every
// EXEC that answered its writes committed exactly once and none saw a
// stale value, so the key ends at 250 at a, and b reads the same. A read
// inside a transaction answers what the transaction wrote before it.
func TestRESPWatchRetryLoops(t *testing.T) {
	_, ports := respPair(t, nil)
	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports["a"]), PoolSize: 16})
	defer a.Close()
	b := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports["b"])})
	defer b.Close()

	const key, rounds, goClients = "w/n", 25, 8
	if out, err := redisPy(t, ports["a"], "print(r.ping())"); err != nil || out != "True" {
		t.Fatalf("redis-py: %v: %s", err, out) // (redisPy fails here, not in a goroutine, without redis-py)
	}
	var wg sync.WaitGroup
	var retries atomic.Int64
	for range goClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; {
				err := a.Watch(ctx, func(tx *redis.Tx) error {
					n, err := tx.Get(ctx, key).Int()
					if err != nil && err != redis.Nil {
						return err
					}
					_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
						p.Set(ctx, key, n+1, 0)
						return nil
					})
					return err
				}, key)
				switch {
				case err == redis.TxFailedErr:
					retries.Add(1)
				case err != nil:
					t.Errorf("go-redis Watch: %v", err)
					return
				default:
					i++
				}
			}
		}()
	}
	py := make([]string, 2)
	for i := range py {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := redisPy(t, ports["a"], fmt.Sprintf(`ok, retried = 0, 0
while ok < %d:
    with r.pipeline() as p:
        try:
            p.watch('%s')
            v = int(p.get('%s') or 0)
            p.multi()
            p.set('%s', v + 1)
            p.execute()
            ok += 1
        except redis.WatchError:
            retried += 1
print(ok, retried)`, rounds, key, key, key))
			if err != nil {
				t.Errorf("redis-py watch loop: %v: %s", err, out)
			}
			py[i] = out
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	want := fmt.Sprint(goClients*rounds + len(py)*rounds)
	if got, err := a.Get(ctx, key).Result(); err != nil || got != want {
		t.Fatalf("after %s read-modify-write transactions the key holds %q (%v) at a; go-redis retried %d times, redis-py %v",
			want, got, err, retries.Load(), py)
	}
	t.Logf("%s transactions; go-redis retried %d times, redis-py (done retried) %v", want, retries.Load(), py)
	eventually(t, 30*time.Second, func() (bool, string) {
		got, err := b.Get(ctx, key).Result()
		return got == want, fmt.Sprintf("at b: %q %v", got, err)
	})

	// redis-py's WatchError when another client wrote the key between
	// WATCH and EXEC; nothing of the transaction is written.
	out, err := redisPy(t, ports["a"], `other = redis.Redis(host='127.0.0.1', port=r.connection_pool.connection_kwargs['port'])
with r.pipeline() as p:
    p.watch('w/k')
    other.set('w/k', 'theirs')
    p.multi()
    p.set('w/k', 'mine')
    p.set('w/side', 'x')
    try:
        p.execute()
        print('executed')
    except redis.WatchError:
        print('watch error', r.get('w/k'), r.exists('w/side'))`)
	if err != nil || out != "watch error theirs 0" {
		t.Fatalf("redis-py, a watched key written by another client: %v: %s", err, out)
	}

	// Reads inside a transaction answer from its own earlier writes.
	var get *redis.StringCmd
	var appended *redis.IntCmd
	if _, err := a.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "tx/r", "v", 0)
		appended = p.Append(ctx, "tx/r", "w")
		get = p.Get(ctx, "tx/r")
		return nil
	}); err != nil || get.Val() != "vw" || appended.Val() != 2 {
		t.Fatalf("a read after writes in one transaction: %q, append %d, %v", get.Val(), appended.Val(), err)
	}
	// A write conditional on other keys' versions (command format 10):
	// MSETNX, and a transaction that reads one key and writes another.
	if ok, err := a.MSetNX(ctx, "nx/1", "a", "nx/2", "b").Result(); err != nil || !ok {
		t.Fatalf("MSETNX: %v %v", ok, err)
	}
	if ok, err := a.MSetNX(ctx, "nx/2", "c", "nx/3", "d").Result(); err != nil || ok {
		t.Fatalf("MSETNX over a held key: %v %v", ok, err)
	}
	if _, err := a.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "nx/1")
		p.Set(ctx, "nx/copy", "of a", 0)
		return nil
	}); err != nil {
		t.Fatalf("a transaction that reads one key and writes another: %v", err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		got, _ := b.MGet(ctx, "nx/1", "nx/2", "nx/3", "nx/copy").Result()
		return fmt.Sprint(got) == "[a b <nil> of a]", fmt.Sprintf("at b: %v", got)
	})
}

// TestRESPExpiryAtAPair: expiry replicated between a pair whose clocks are
// 300 ms apart (b ahead, within the offset the skew guard allows). A key
// set with PX at a carries the same absolute expiry at b (PEXPIRETIME
// equal: one version, one expiry), and reads absent at both once it
// passed; EXPIRE at a and PERSIST at b reach the other cluster. A SET NX
// PX lock excludes within one cluster only: with the links paused, each
// cluster grants it (docs/RESP.md), and once they resume both hold the same
// holder, last-writer-wins; the lock then expires at both.
func TestRESPExpiryAtAPair(t *testing.T) {
	m, ports := respPair(t, func(m *mesh) {
		m.nodes["b"].env = append(m.nodes["b"].env, node.TestingEnvPrefix+"CLOCK_OFFSET=300ms")
	})
	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports["a"])})
	defer a.Close()
	b := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports["b"])})
	defer b.Close()
	sameExpiry := func(key string) int64 {
		t.Helper()
		at, err := a.PExpireTime(ctx, key).Result()
		if err != nil || at <= 0 {
			t.Fatalf("PEXPIRETIME %s at a: %v %v", key, at, err)
		}
		eventually(t, 30*time.Second, func() (bool, string) {
			bt, err := b.PExpireTime(ctx, key).Result()
			return bt == at, fmt.Sprintf("PEXPIRETIME %s at b %v (%v), at a %v", key, bt, err, at)
		})
		return int64(at / time.Millisecond)
	}

	if err := a.Set(ctx, "e/1", "v", 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	sameExpiry("e/1")
	for name, c := range map[string]*redis.Client{"a": a, "b": b} {
		eventually(t, 30*time.Second, func() (bool, string) {
			n, err := c.Exists(ctx, "e/1").Result()
			return err == nil && n == 0, fmt.Sprintf("e/1 at %s: exists %d %v", name, n, err)
		})
		if v, err := c.Get(ctx, "e/1").Result(); err != redis.Nil {
			t.Fatalf("an expired key reads %q %v at %s", v, err, name)
		}
	}

	// EXPIRE at a, PERSIST at b.
	if err := a.Set(ctx, "e/2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Expire(ctx, "e/2", 100*time.Second).Result(); err != nil || !ok {
		t.Fatalf("EXPIRE: %v %v", ok, err)
	}
	sameExpiry("e/2")
	if ok, err := b.Persist(ctx, "e/2").Result(); err != nil || !ok {
		t.Fatalf("PERSIST at b: %v %v", ok, err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		d, err := a.TTL(ctx, "e/2").Result()
		return err == nil && d == -1, fmt.Sprintf("TTL e/2 at a after PERSIST at b: %v %v", d, err)
	})

	// The lock, with the links paused both ways.
	for from, to := range map[string]string{"a": "b", "b": "a"} {
		if _, err := m.nodes[from].client().Do(ctx, http.MethodPost, "/admin/peers/"+to+"/pause", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := a.SetNX(ctx, "lock", "held-at-a", 4*time.Second).Result(); err != nil || !ok {
		t.Fatalf("the lock at a: %v %v", ok, err)
	}
	if ok, err := a.SetNX(ctx, "lock", "again-at-a", 4*time.Second).Result(); err != nil || ok {
		t.Fatalf("the lock taken twice at a: %v %v", ok, err)
	}
	if ok, err := b.SetNX(ctx, "lock", "held-at-b", 4*time.Second).Result(); err != nil || !ok {
		t.Fatalf("the lock at b, while a holds it with the links paused: %v %v (NX excludes within a cluster only)", ok, err)
	}
	for from, to := range map[string]string{"a": "b", "b": "a"} {
		if _, err := m.nodes[from].client().Do(ctx, http.MethodPost, "/admin/peers/"+to+"/resume", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	var holder string
	eventually(t, 30*time.Second, func() (bool, string) {
		va, ea := a.Get(ctx, "lock").Result()
		vb, eb := b.Get(ctx, "lock").Result()
		holder = va
		return ea == nil && eb == nil && va == vb, fmt.Sprintf("lock at a %q (%v), at b %q (%v)", va, ea, vb, eb)
	})
	sameExpiry("lock")
	t.Logf("both clusters granted the lock; %q holds it at both", holder)
	for name, c := range map[string]*redis.Client{"a": a, "b": b} {
		eventually(t, 30*time.Second, func() (bool, string) {
			n, err := c.Exists(ctx, "lock").Result()
			return err == nil && n == 0, fmt.Sprintf("lock at %s after its expiry: exists %d %v", name, n, err)
		})
	}
	if ok, err := b.SetNX(ctx, "lock", "next", 4*time.Second).Result(); err != nil || !ok {
		t.Fatalf("the lock after it expired: %v %v", ok, err)
	}
	countersAtAPair(t, m, a, b, ports)
}

// countersAtAPair: counters as Redis applications use them, at a pair of
// clusters (b's clock 300 ms ahead): INCR after SET, a counter deleted at
// the other cluster while an increment races the delete (the increment the
// delete did not see survives, at both), and a rate limiter (redis-py's
// transactional pipeline of INCR and EXPIRE) whose count and TTL read the
// same at the peer, and which restarts from 1 once it expired.
func countersAtAPair(t *testing.T, m *mesh, a, b *redis.Client, ports map[string]int) {
	ctx := context.Background()
	same := func(key, want string) {
		t.Helper()
		for name, c := range map[string]*redis.Client{"a": a, "b": b} {
			eventually(t, 30*time.Second, func() (bool, string) {
				got, err := c.Get(ctx, key).Result()
				if want == "" {
					return err == redis.Nil, fmt.Sprintf("%s at %s: %q %v, want none", key, name, got, err)
				}
				return got == want, fmt.Sprintf("%s at %s: %q %v, want %q", key, name, got, err, want)
			})
		}
	}
	links := func(action string) {
		t.Helper()
		for from, to := range map[string]string{"a": "b", "b": "a"} {
			if _, err := m.nodes[from].client().Do(ctx, http.MethodPost, "/admin/peers/"+to+"/"+action, nil, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := a.Set(ctx, "c/n", "5", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Incr(ctx, "c/n").Result(); err != nil || n != 6 {
		t.Fatalf("INCR after SET n 5: %d %v", n, err)
	}
	same("c/n", "6")
	if n, err := b.Incr(ctx, "c/n").Result(); err != nil || n != 7 {
		t.Fatalf("INCR at b: %d %v", n, err)
	}
	same("c/n", "7")

	for range 10 {
		if err := a.Incr(ctx, "c/del").Err(); err != nil {
			t.Fatal(err)
		}
	}
	same("c/del", "10")
	links("pause")
	if n, err := b.Del(ctx, "c/del").Result(); err != nil || n != 1 {
		t.Fatalf("DEL of the counter at b: %d %v", n, err)
	}
	if n, err := a.IncrBy(ctx, "c/del", 3).Result(); err != nil || n != 13 {
		t.Fatalf("INCRBY at a while b deletes: %d %v", n, err)
	}
	links("resume")
	same("c/del", "3")
	if n, err := a.Del(ctx, "c/del").Result(); err != nil || n != 1 {
		t.Fatalf("DEL of the counter at a: %d %v", n, err)
	}
	same("c/del", "")

	limiter := `p = r.pipeline()
p.incr('c/rate')
p.expire('c/rate', 3)
print(p.execute())`
	for i := 1; i <= 2; i++ {
		out, err := redisPy(t, ports["a"], limiter)
		if want := fmt.Sprintf("[%d, True]", i); err != nil || out != want {
			t.Fatalf("redis-py rate limiter, call %d: %v: %s, want %s", i, err, out, want)
		}
	}
	same("c/rate", "2")
	if d, err := b.TTL(ctx, "c/rate").Result(); err != nil || d <= 0 || d > 3*time.Second {
		t.Fatalf("TTL of the limiter at b: %v %v", d, err)
	}
	same("c/rate", "")
	if out, err := redisPy(t, ports["b"], limiter); err != nil || out != "[1, True]" {
		t.Fatalf("the limiter after it expired, at b: %v: %s", err, out)
	}
	same("c/rate", "1")
}
