package resp

import (
	"errors"
	"fmt"
	"strings"

	"github.com/replicator/replicator/api"
)

// A transaction (MULTI ... EXEC) is one atomic write: the queued commands
// run over a view of their keys (view.go), and what they write commits as
// one entry of the log, one stamp, all or nothing, and crosses to a peer as
// one entry (docs/RESP.md "Transactions"). A command refused while queueing
// (unknown, wrong arity, not served in a transaction) makes EXEC answer
// EXECABORT and write nothing; one that fails as it runs (WRONGTYPE, a bad
// option) answers its error in its place and the others apply, as Redis
// does. Never some of a transaction's writes: a client that retries a
// refused transaction does not apply its first half twice.

// txn is a connection's transaction between MULTI and EXEC.
type txn struct {
	queued [][][]byte // the commands, copied out of the reader's buffers
	bytes  int
	// dirty: a command was refused while queueing; EXEC aborts.
	dirty bool
}

// A transaction's bounds: one log entry holds it whole.
const (
	maxTxnCommands = 10000
	maxTxnBytes    = 16 << 20
)

// txnControl are the commands a transaction runs at once rather than
// queues.
var txnControl = map[string]bool{"multi": true, "exec": true, "discard": true, "quit": true, "watch": true}

// txnServed are the commands a transaction queues (view.run runs them).
// An increment inside one reads and writes the value (resp/incr.go).
var txnServed = map[string]bool{
	"ping": true, "echo": true, "get": true, "mget": true, "exists": true, "type": true, "strlen": true,
	"getrange": true, "set": true, "getset": true, "setnx": true, "mset": true, "msetnx": true,
	"getdel": true, "del": true, "unlink": true, "append": true, "setrange": true,
	"setex": true, "psetex": true, "expire": true, "pexpire": true, "expireat": true, "pexpireat": true,
	"persist": true, "ttl": true, "pttl": true, "expiretime": true, "pexpiretime": true, "getex": true,
	"incr": true, "decr": true, "incrby": true, "decrby": true, "incrbyfloat": true,
}

func (c *conn) multi(_ [][]byte) {
	c.settle()
	if c.tx != nil {
		c.w.err("ERR MULTI calls can not be nested")
		return
	}
	c.tx = &txn{}
	c.state.multi.Store(0)
	c.w.simple("OK")
}

func (c *conn) discard(_ [][]byte) {
	c.settle()
	if c.tx == nil {
		c.w.err("ERR DISCARD without MULTI")
		return
	}
	c.tx, c.watched = nil, nil
	c.state.multi.Store(-1)
	c.w.simple("OK")
}

// watch makes the next EXEC conditional on the keys' versions as read now
// at this node: EXEC answers nil, and writes nothing, if one changed.
func (c *conn) watch(args [][]byte) {
	c.settle()
	if c.tx != nil {
		c.w.err("ERR WATCH inside MULTI is not allowed")
		return
	}
	if len(c.watched)+len(args)-1 > maxTxnCommands {
		c.w.err(fmt.Sprintf("ERR a transaction watches at most %d keys", maxTxnCommands))
		return
	}
	v := newView(c)
	for _, a := range args[1:] {
		k := string(a)
		if _, ok := c.watched[k]; ok {
			continue // the first WATCH's version: a change since then counts
		}
		x := v.key(k)
		if v.err != nil {
			c.writeErr(v.err)
			return
		}
		if c.watched == nil {
			c.watched = map[string]string{}
		}
		c.watched[k] = x.version
	}
	c.w.simple("OK")
}

func (c *conn) unwatch(_ [][]byte) {
	c.settle()
	c.watched = nil
	c.w.simple("OK")
}

// queue answers a command sent inside MULTI: QUEUED, or its refusal (the
// transaction then aborts at EXEC).
func (c *conn) queue(cmd command, known bool, args [][]byte) {
	c.settle()
	tx := c.tx
	refuse := func(msg string) {
		tx.dirty = true
		c.w.err(msg)
	}
	switch {
	case !known:
		c.s.stats.unknownCommand(args[0])
		refuse(fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", clip(args[0]), argsPreview(args[1:])))
		return
	case (cmd.arity > 0 && len(args) != cmd.arity) || (cmd.arity < 0 && len(args) < -cmd.arity):
		refuse(wrongArgs(cmd.name))
		return
	case !c.authed && !cmd.open:
		c.s.stats.error("auth")
		refuse("NOAUTH Authentication required.")
		return
	}
	c.s.stats.command(cmd.name)
	switch {
	case txnServed[cmd.name]:
	default:
		c.s.stats.error("bad_request")
		refuse("ERR " + strings.ToUpper(cmd.name) + " inside MULTI is not served (docs/RESP.md \"Transactions\")")
		return
	}
	size := 0
	for _, a := range args {
		size += len(a)
	}
	if len(tx.queued) >= maxTxnCommands || tx.bytes+size > maxTxnBytes {
		c.s.stats.error("bad_request")
		refuse(fmt.Sprintf("ERR the transaction exceeds %d commands or %d bytes: one log entry holds it whole", maxTxnCommands, maxTxnBytes))
		return
	}
	kept := make([][]byte, len(args))
	for i, a := range args {
		kept[i] = append([]byte(nil), a...)
	}
	tx.queued = append(tx.queued, kept)
	tx.bytes += size
	c.state.multi.Store(int32(len(tx.queued)))
	c.w.simple("QUEUED")
}

// exec runs the queued commands as one transaction and answers their
// replies; an aborted transaction writes nothing, and one whose WATCHed
// key changed answers nil.
func (c *conn) exec(_ [][]byte) {
	tx, watched := c.tx, c.watched
	c.tx, c.watched = nil, nil
	c.state.multi.Store(-1)
	c.settle()
	switch {
	case tx == nil:
		c.w.err("ERR EXEC without MULTI")
	case tx.dirty:
		c.w.err("EXECABORT Transaction discarded because of previous errors.")
	default:
		c.execute(tx.queued, watched, true)
	}
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// one runs a command that reads a key and writes on what it read as a
// transaction of its own, and answers its reply.
func (c *conn) one(args [][]byte) {
	c.settle()
	c.execute([][][]byte{args}, nil, false)
}

// execute runs cmds as one transaction (view.go): their replies as EXEC's
// array (tx), or the one command's reply.
func (c *conn) execute(cmds [][][]byte, watched map[string]string, tx bool) {
	for range maxRounds {
		v := newView(c)
		changed := false
		for k, ver := range watched {
			changed = changed || v.key(k).version != ver
		}
		if v.err == nil && changed {
			c.w.nullArray()
			return
		}
		out := &writer{proto: c.w.proto}
		for _, args := range cmds {
			if v.err != nil {
				break
			}
			v.run(args, out)
			if len(out.buf) > c.s.opts.MaxReply {
				c.w.err("ERR the reply exceeds the connection's bound on replies owed; the connection closes")
				c.quit = true
				return
			}
		}
		if v.err != nil {
			c.writeErr(v.err)
			return
		}
		var err error
		if w, ok := v.write(watched); ok {
			_, err = c.now(w)
		} else if same, rerr := v.unchanged(watched); rerr != nil || !same {
			err = rerr
			if err == nil {
				continue // read again: a key changed between the reads
			}
		}
		var pe *api.PreconditionError
		switch {
		case err == nil:
			if tx {
				c.w.array(len(cmds))
			}
			c.w.buf = append(c.w.buf, out.buf...)
			return
		case errors.As(err, &pe) && hasKey(watched, pe.Key):
			// The state machine found a WATCHed key changed: that is the
			// answer, whatever this node has read of it yet (a follower
			// may be behind its leader).
			c.w.nullArray()
			return
		case errors.As(err, &pe):
			// Another write came between the reads and the commit: read
			// again once this node holds it (a follower behind its
			// leader would read the same again).
			v.awaitChange(pe.Key)
			continue
		case errors.Is(err, api.ErrKindConflict):
			continue
		default:
			c.writeErr(err)
			return
		}
	}
	c.writeErr(errContention)
}
