package resp

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// command is one entry of the command table.
type command struct {
	name string // lower case
	// arity as Redis counts it: the name included; negative: at least.
	arity   int
	handler func(c *conn, args [][]byte)
	// open commands run before AUTH.
	open bool
}

var table map[string]command

func init() {
	commands := []command{
		{"ping", -1, (*conn).ping, false},
		{"echo", 2, func(c *conn, a [][]byte) { c.w.bulk(a[1]) }, false},
		{"hello", -1, (*conn).hello, true},
		{"auth", -2, (*conn).authCmd, true},
		{"select", 2, (*conn).selectDB, false},
		{"quit", -1, func(c *conn, _ [][]byte) { c.w.simple("OK"); c.quit = true }, true},
		{"client", -2, (*conn).client, false},
		{"command", -1, (*conn).commandCmd, false},
		{"info", -1, (*conn).info, false},
		{"dbsize", 1, func(c *conn, _ [][]byte) { c.w.int(c.s.node.Keys()) }, false},
		{"config", -2, (*conn).config, false},
		{"wait", 3, (*conn).wait, false},
		{"waitaof", 4, (*conn).waitAOF, false},
		{"get", 2, (*conn).get, false},
		{"mget", -2, (*conn).mget, false},
		{"set", -3, (*conn).set, false},
		{"mset", -3, (*conn).mset, false},
		{"del", -2, (*conn).del, false},
		{"exists", -2, (*conn).exists, false},
		{"incr", 2, (*conn).incr, false},
		{"decr", 2, (*conn).incr, false},
		{"incrby", 3, (*conn).incr, false},
		{"decrby", 3, (*conn).incr, false},
		{"incrbyfloat", 3, (*conn).one, false},
		{"scan", -2, (*conn).scan, false},
		{"keys", 2, (*conn).keys, false},
		{"unlink", -2, (*conn).del, false},
		{"setnx", 3, (*conn).setnx, false},
		{"getset", 3, (*conn).one, false},
		{"getdel", 2, (*conn).one, false},
		{"append", 3, (*conn).one, false},
		{"setrange", 4, (*conn).one, false},
		{"getrange", 4, (*conn).getrange, false},
		{"multi", 1, (*conn).multi, false},
		{"exec", 1, (*conn).exec, false},
		{"discard", 1, (*conn).discard, false},
		{"watch", -2, (*conn).watch, false},
		{"unwatch", 1, (*conn).unwatch, false},
		{"msetnx", -3, (*conn).one, false},
		{"setex", 4, (*conn).setex, false},
		{"psetex", 4, (*conn).setex, false},
		{"expire", -3, (*conn).one, false},
		{"pexpire", -3, (*conn).one, false},
		{"expireat", -3, (*conn).one, false},
		{"pexpireat", -3, (*conn).one, false},
		{"persist", 2, (*conn).one, false},
		{"ttl", 2, (*conn).one, false},
		{"pttl", 2, (*conn).one, false},
		{"expiretime", 2, (*conn).one, false},
		{"pexpiretime", 2, (*conn).one, false},
		{"getex", -2, (*conn).one, false},
		{"type", 2, (*conn).keyType, false},
		{"strlen", 2, (*conn).strlen, false},
		{"time", 1, (*conn).timeCmd, false},
	}
	const scripting = "no scripting (Lua) here; several writes at once are one atomic MSET, or an atomic batch (POST /v1/batch)"
	for _, name := range []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "script", "fcall", "fcall_ro", "function"} {
		commands = append(commands, command{name, -1, notServed(scripting), false})
	}
	table = map[string]command{}
	for _, cmd := range commands {
		table[cmd.name] = cmd
	}
}

// lookup finds a command by its name in any case, without allocating for
// a name that fits the buffer (clients send names in upper case).
func lookup(name []byte) (command, bool) {
	var buf [16]byte
	if len(name) > len(buf) {
		return command{}, false // no command has so long a name
	}
	n := copy(buf[:], name)
	for i := range n {
		if 'A' <= buf[i] && buf[i] <= 'Z' {
			buf[i] += 'a' - 'A'
		}
	}
	cmd, ok := table[string(buf[:n])]
	return cmd, ok
}

// dispatch runs one command.
func (c *conn) dispatch(args [][]byte) {
	cmd, ok := lookup(args[0])
	if c.tx != nil && !txnControl[cmd.name] {
		c.queue(cmd, ok, args)
		return
	}
	name := cmd.name
	if !ok {
		if c.authed {
			c.s.stats.unknownCommand(args[0])
		} else {
			// A client without the token does not name label values.
			c.s.stats.command("unknown")
		}
		c.settle()
		c.w.err(fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", clip(args[0]), argsPreview(args[1:])))
		return
	}
	c.s.stats.command(name)
	if (cmd.arity > 0 && len(args) != cmd.arity) || (cmd.arity < 0 && len(args) < -cmd.arity) {
		c.settle()
		c.w.err(wrongArgs(name))
		return
	}
	if !c.authed && !cmd.open {
		c.settle()
		c.s.stats.error("auth")
		c.w.err("NOAUTH Authentication required.")
		return
	}
	cmd.handler(c, args)
}

func clip(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return strings.ToValidUTF8(string(b), "?")
}

func argsPreview(args [][]byte) string {
	var sb strings.Builder
	for i, a := range args {
		if i == 3 {
			break
		}
		fmt.Fprintf(&sb, "'%s' ", clip(a))
	}
	return sb.String()
}

func (c *conn) ping(args [][]byte) {
	c.settle()
	switch len(args) {
	case 1:
		c.w.simple("PONG")
	case 2:
		c.w.bulk(args[1])
	default:
		c.w.err(wrongArgs("ping"))
	}
}

// hello negotiates the protocol (2 or 3), and may authenticate and name
// the connection: HELLO [protover [AUTH username password] [SETNAME name]].
func (c *conn) hello(args [][]byte) {
	c.settle()
	proto := c.w.proto
	if len(args) > 1 {
		v, err := strconv.Atoi(string(args[1]))
		if err != nil {
			c.w.err("ERR Protocol version is not an integer or out of range")
			return
		}
		if v != 2 && v != 3 {
			c.w.err("NOPROTO unsupported protocol version")
			return
		}
		proto = v
	}
	for i := 2; i < len(args); i++ {
		switch strings.ToLower(string(args[i])) {
		case "auth":
			if i+2 >= len(args) {
				c.w.err("ERR syntax error in HELLO option 'auth'")
				return
			}
			if !c.auth(string(args[i+2])) {
				c.s.stats.error("auth")
				c.w.err("WRONGPASS invalid username-password pair or user is disabled.")
				return
			}
			i += 2
		case "setname":
			if i+1 >= len(args) {
				c.w.err("ERR syntax error in HELLO option 'setname'")
				return
			}
			c.setName(string(args[i+1]))
			i++
		default:
			c.w.err(fmt.Sprintf("ERR syntax error in HELLO option '%s'", clip(args[i])))
			return
		}
	}
	if !c.authed {
		c.s.stats.error("auth")
		c.w.err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return
	}
	c.w.proto = proto
	c.state.proto.Store(int32(proto))
	c.w.any(map[string]any{
		"server": "replicator", "version": redisVersion, "proto": proto, "id": c.id,
		"mode": "standalone", "role": "master", "modules": []any{}, "replicator_version": c.s.opts.Version,
	})
}

// redisVersion is the Redis version whose commands the table follows (for
// clients that ask); replicator_version says which build answers.
const redisVersion = "7.2.0"

func (c *conn) authCmd(args [][]byte) {
	c.settle()
	if len(args) > 3 {
		c.w.err("ERR syntax error")
		return
	}
	if c.s.opts.Token == "" {
		c.w.err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
		return
	}
	if !c.auth(string(args[len(args)-1])) {
		c.s.stats.error("auth")
		c.w.err("WRONGPASS invalid username-password pair or user is disabled.")
		return
	}
	c.w.simple("OK")
}

func (c *conn) selectDB(args [][]byte) {
	c.settle()
	if string(args[1]) != "0" {
		c.w.err("ERR DB index is out of range")
		return
	}
	c.w.simple("OK")
}

// config answers CONFIG GET with what redis-benchmark and common clients
// ask at start; nothing is settable.
func (c *conn) config(args [][]byte) {
	c.settle()
	if strings.ToLower(string(args[1])) != "get" || len(args) < 3 {
		c.w.err("ERR CONFIG " + strings.ToUpper(clip(args[1])) + " is not supported: replicator is configured by its flags (docs/RESP.md)")
		return
	}
	known := map[string]string{
		"save": "", "appendonly": "yes", "appendfsync": "always", "databases": "1",
		"maxmemory": "0", "maxmemory-policy": "noeviction", "timeout": "0",
		"proto-max-bulk-len": strconv.Itoa(c.s.opts.Limits.MaxBulk), "cluster-enabled": "no",
	}
	out := map[string]any{}
	for _, pat := range args[2:] {
		for k, v := range known {
			if globMatch(strings.ToLower(string(pat)), k) {
				out[k] = v
			}
		}
	}
	c.w.any(out)
}

// globMatch matches the * and ? of CONFIG GET's patterns.
func globMatch(pat, s string) bool {
	for len(pat) > 0 {
		switch pat[0] {
		case '*':
			for i := len(s); i >= 0; i-- {
				if globMatch(pat[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if s == "" {
				return false
			}
		default:
			if s == "" || s[0] != pat[0] {
				return false
			}
		}
		pat, s = pat[1:], s[1:]
	}
	return s == ""
}

// get reads a key: a counter reads as its decimal value (node.Get reads a
// key's value and counter as one: docs/RESP.md "Counters").
func (c *conn) get(args [][]byte) {
	c.settle()
	c.value(string(args[1]))
}

func (c *conn) value(key string) {
	rec, err := c.s.node.Get(key)
	if err == nil {
		c.w.bulk(rec.Value)
		return
	}
	if !errors.Is(err, api.ErrNotFound) {
		c.writeErr(err)
		return
	}
	c.w.null()
}

func (c *conn) mget(args [][]byte) {
	c.settle()
	start := len(c.w.buf)
	c.w.array(len(args) - 1)
	for _, k := range args[1:] {
		c.value(string(k))
		if len(c.w.buf)-start > c.s.opts.MaxReply {
			// One reply past the bound on replies owed: dropped, not
			// held (65,536 values of 1 MiB would be 64 GiB).
			c.w.buf = c.w.buf[:start]
			c.w.err("ERR the reply exceeds the connection's bound on replies owed; the connection closes")
			c.quit = true
			return
		}
		if !c.holdReplies() {
			// The node's budget, shared by every connection.
			c.w.buf = c.w.buf[:start]
			c.overBudget()
			return
		}
	}
}

func (c *conn) exists(args [][]byte) {
	c.settle()
	n := int64(0)
	for _, k := range args[1:] {
		key := string(k)
		_, err := c.s.node.Get(key)
		if err == nil {
			n++
			continue
		}
		if !errors.Is(err, api.ErrNotFound) {
			c.writeErr(err)
			return
		}
	}
	c.w.int(n)
}

// set: SET key value [NX | XX] [GET] [EX | PX | EXAT | PXAT | KEEPTTL]. A
// SET that does not read is submitted and answered in order; NX is a
// condition the state machine decides (If-None-Match); XX, GET and KEEPTTL
// write on what they read: a transaction of one command (view.go).
func (c *conn) set(args [][]byte) {
	o, msg := parseSet(args[3:], c.s.opts.Now)
	if msg != "" {
		c.settle()
		c.w.err(msg)
		return
	}
	if o.xx || o.get || o.keep {
		c.one(args)
		return
	}
	w := api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: string(args[1]), Value: args[2], Expires: o.expires}}
	if o.nx {
		w.Cond = &api.Condition{IfNoneMatch: true}
	}
	c.submit(w, func(c *conn, _ api.WriteResult, err error) {
		switch {
		case err == nil:
			c.w.simple("OK")
		case o.nx && errors.Is(err, api.ErrPrecondition):
			c.w.null()
		default:
			c.writeErr(err)
		}
	})
}

// setex is SETEX key seconds value and PSETEX key milliseconds value.
func (c *conn) setex(args [][]byte) {
	unit := "ex"
	if strings.EqualFold(string(args[0]), "psetex") {
		unit = "px"
	}
	at, ok := expiryAt(unit, args[2], c.s.opts.Now())
	if !ok {
		c.settle()
		c.w.err("ERR invalid expire time in '" + strings.ToLower(string(args[0])) + "' command")
		return
	}
	c.submit(api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: string(args[1]), Value: args[3], Expires: at}},
		func(c *conn, _ api.WriteResult, err error) {
			if err != nil {
				c.writeErr(err)
				return
			}
			c.w.simple("OK")
		})
}

// maxRounds bounds how often a transaction (or a command that reads, then
// writes) runs again because another write changed a key it read between
// its read and its commit.
const maxRounds = 16

// mset writes every pair as one atomic batch.
func (c *conn) mset(args [][]byte) {
	if len(args)%2 != 1 {
		c.settle()
		c.w.err(wrongArgs("mset"))
		return
	}
	ops := make([]api.BatchOp, 0, len(args)/2)
	for i := 1; i < len(args); i += 2 {
		ops = append(ops, api.BatchOp{Key: string(args[i]), Value: args[i+1]})
	}
	c.submit(api.Write{Ops: ops}, func(c *conn, _ api.WriteResult, err error) {
		if err != nil {
			c.writeErr(err)
			return
		}
		c.w.simple("OK")
	})
}

// del deletes every key as one atomic batch; its count (the keys that held
// a value) is decided by the state machine in commit order.
func (c *conn) del(args [][]byte) {
	w := api.Write{Entry: entry.Entry{Op: entry.OpDelete, Key: string(args[1])}}
	if len(args) > 2 {
		// One atomic batch; a key named twice is deleted (and counted)
		// once: the node's batch keeps the last op of each key.
		w = api.Write{}
		for _, k := range args[1:] {
			w.Ops = append(w.Ops, api.BatchOp{Delete: true, Key: string(k)})
		}
	}
	c.submit(w, func(c *conn, res api.WriteResult, err error) {
		if err != nil {
			c.writeErr(err)
			return
		}
		c.w.int(int64(res.Existed))
	})
}

func (c *conn) incr(args [][]byte) {
	name := strings.ToLower(string(args[0]))
	delta := int64(1)
	if len(args) == 3 {
		d, err := strconv.ParseInt(string(args[2]), 10, 64)
		if err != nil {
			c.settle()
			c.w.err("ERR value is not an integer or out of range")
			return
		}
		delta = d
	}
	if strings.HasPrefix(name, "decr") {
		if delta == -delta && delta != 0 { // math.MinInt64
			c.settle()
			c.w.err("ERR decrement would overflow")
			return
		}
		delta = -delta
	}
	c.submit(api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: string(args[1])}, Delta: delta},
		func(c *conn, res api.WriteResult, err error) {
			if err != nil {
				c.writeErr(err)
				return
			}
			c.w.int(res.Counter)
		})
}

// wait answers how many peer clusters hold every write of this connection
// (their links' acknowledgements say so, and no link's filter kept part of
// one home), waiting up to timeout ms (0: no bound) for numreplicas of
// them. Before any write, every peer link counts, as Redis counts every
// replica then.
func (c *conn) wait(args [][]byte) {
	c.settle()
	want, err1 := strconv.Atoi(string(args[1]))
	ms, err2 := strconv.ParseInt(string(args[2]), 10, 64)
	if err1 != nil || err2 != nil || want < 0 || ms < 0 {
		c.w.err("ERR value is not an integer or out of range")
		return
	}
	// What the pipeline owes before the WAIT goes now: the client sees
	// its writes answered while it waits.
	if err := c.flush(); err != nil {
		c.quit = true
		return
	}
	// No more peers can hold the writes than there are links: a WAIT for
	// more would wait for ever (or its whole timeout) for nothing.
	want = min(want, c.s.node.Peers())
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	// The socket is watched meanwhile: a client that leaves ends the wait
	// (WAIT n 0 waits as long as the client stays), and what it pipelines
	// behind the WAIT is kept for the next command.
	gone, stop := c.src.watch()
	defer stop()
	// Woken by the links' acknowledgements; looked at again on a timer
	// besides, backing off to a second (a follower asks the leader, and
	// hears no acknowledgement itself).
	backoff := 5 * time.Millisecond
	timer := time.NewTimer(backoff)
	defer timer.Stop()
	m := c.written
	for {
		acks := c.s.node.Acks()
		n := 0
		if m.to == 0 {
			n = c.s.node.Peers()
		} else if m.sealed {
			n = 0
		} else if peers, err := c.s.node.Holding(m.stream, m.from, m.to); err == nil {
			// An error (the leader moved) counts none this time round.
			for _, p := range peers {
				if !m.kept[p] {
					n++
				}
			}
		}
		if n >= want || (ms > 0 && !time.Now().Before(deadline)) {
			c.w.int(int64(n))
			return
		}
		next := backoff
		if ms > 0 {
			next = min(next, time.Until(deadline))
		}
		backoff = min(2*backoff, time.Second)
		timer.Reset(max(next, time.Millisecond))
		select {
		case <-c.s.done: // the server closes: answer what holds now
			c.w.int(int64(n))
			return
		case <-gone: // the client left: nobody to answer
			c.quit = true
			return
		case <-acks:
		case <-timer.C:
		}
	}
}

// waitAOF answers for this cluster: every acknowledged write is synced
// here (1) and held by a quorum of the cluster's nodes (the others of that
// quorum count as replicas); it does not wait.
func (c *conn) waitAOF(args [][]byte) {
	c.settle()
	local, err := strconv.Atoi(string(args[1]))
	if err != nil || local < 0 {
		c.w.err("ERR value is not an integer or out of range")
		return
	}
	f := c.s.node.Figures()
	c.w.array(2)
	c.w.int(1)
	c.w.int(int64(max(f.Quorum-1, 0)))
}

// info answers INFO's sections from kept figures (no scan).
func (c *conn) info(args [][]byte) {
	c.settle()
	f := c.s.node.Figures()
	want := map[string]bool{}
	for _, a := range args[1:] {
		want[strings.ToLower(string(a))] = true
	}
	all := len(want) == 0 || want["all"] || want["everything"] || want["default"]
	var b bytes.Buffer
	section := func(name string, lines ...string) {
		if !all && !want[strings.ToLower(name)] {
			return
		}
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + name + "\r\n")
		for _, l := range lines {
			b.WriteString(l + "\r\n")
		}
	}
	section("Server", "redis_version:"+redisVersion, "redis_mode:standalone", "replicator_version:"+f.Version,
		"replicator_cluster:"+c.s.node.ClusterID(), fmt.Sprintf("cluster_nodes:%d", f.Nodes))
	section("Clients", fmt.Sprintf("connected_clients:%d", c.s.stats.conns.Load()), "blocked_clients:0",
		fmt.Sprintf("maxclients:%d", c.s.opts.MaxConns))
	mem := usedMemory()
	section("Memory", fmt.Sprintf("used_memory:%d", mem), "used_memory_human:"+humanBytes(mem))
	section("Stats", fmt.Sprintf("total_connections_received:%d", c.s.stats.accepted.Load()),
		fmt.Sprintf("total_commands_processed:%d", c.s.stats.total.Load()),
		fmt.Sprintf("rejected_connections:%d", c.s.stats.refusedConns.Load()),
		fmt.Sprintf("evicted_clients:%d", c.s.stats.evictedConns.Load()))
	// role and connected_slaves as clients parse them (every node is a
	// master of its keys to a Redis client); the peer clusters in fields of
	// their own.
	repl := []string{"role:master", "connected_slaves:0", "replicator_role:" + f.Role, fmt.Sprintf("connected_peers:%d", len(f.Links))}
	for i, l := range f.Links {
		repl = append(repl, fmt.Sprintf("peer%d:name=%s,state=%s,acked=%d,last=%d,lag=%.3f", i, l.Peer, l.State, l.Acked, l.Last, l.Lag.Seconds()))
	}
	section("Replication", repl...)
	section("Persistence", "aof_enabled:1", "appendfsync:always")
	section("Keyspace", fmt.Sprintf("db0:keys=%d,expires=0,avg_ttl=0", f.Keys))
	c.w.verbatim(b.String())
}
