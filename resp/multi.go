package resp

import (
	"fmt"
	"strings"

	"github.com/replicator/replicator/api"
)

// A transaction (MULTI ... EXEC) is one atomic batch: the queued writes
// commit as one entry of the log, one stamp, all or nothing, and cross to a
// peer as one entry (docs/RESP.md "Transactions"). This first step serves
// the transactions of plain writes (SET key value, MSET); any other command
// queued is refused as Redis refuses a command while queueing: its error
// now, and EXEC answers EXECABORT and writes nothing. Never some of a
// transaction's writes: a client that retries a refused transaction does
// not apply its first half twice.

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

func (c *conn) multi(_ [][]byte) {
	c.settle()
	if c.tx != nil {
		c.w.err("ERR MULTI calls can not be nested")
		return
	}
	c.tx = &txn{}
	c.w.simple("OK")
}

func (c *conn) discard(_ [][]byte) {
	c.settle()
	if c.tx == nil {
		c.w.err("ERR DISCARD without MULTI")
		return
	}
	c.tx = nil
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
	case cmd.name == "set" && len(args) == 3, cmd.name == "mset" && len(args)%2 == 1:
	default:
		c.s.stats.error("bad_request")
		refuse("ERR " + strings.ToUpper(cmd.name) + " inside MULTI is not served yet: a transaction here takes SET key value and MSET (docs/RESP.md \"Transactions\")")
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
	c.w.simple("QUEUED")
}

// exec commits the queued writes as one atomic batch and answers each
// command's reply; an aborted transaction writes nothing.
func (c *conn) exec(_ [][]byte) {
	tx := c.tx
	c.tx = nil
	switch {
	case tx == nil:
		c.settle()
		c.w.err("ERR EXEC without MULTI")
		return
	case tx.dirty:
		c.settle()
		c.w.err("EXECABORT Transaction discarded because of previous errors.")
		return
	case len(tx.queued) == 0:
		c.settle()
		c.w.array(0)
		return
	}
	var ops []api.BatchOp
	for _, args := range tx.queued {
		for i := 1; i+1 < len(args); i += 2 { // SET k v, MSET k v ...
			ops = append(ops, api.BatchOp{Key: string(args[i]), Value: args[i+1]})
		}
	}
	n := len(tx.queued)
	c.submit(api.Write{Ops: ops}, func(c *conn, _ api.WriteResult, err error) {
		if err != nil {
			// The batch as a whole: nothing of it, or (UNKNOWNOUTCOME)
			// all of it or nothing, never a part.
			c.writeErr(err)
			return
		}
		c.w.array(n)
		for range n {
			c.w.simple("OK")
		}
	})
}
