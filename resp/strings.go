package resp

import (
	"errors"
	"strconv"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// The string commands that read a key's value and write on what they read
// (GETDEL, APPEND, SETRANGE, GETSET, MSETNX) run as transactions of one
// command (view.go); GETRANGE reads.

// getrange answers the bytes of a key's value from start to end
// inclusive, negative offsets counting from its end, as Redis does.
func (c *conn) getrange(args [][]byte) {
	c.settle()
	start, err1 := strconv.ParseInt(string(args[2]), 10, 64)
	end, err2 := strconv.ParseInt(string(args[3]), 10, 64)
	if err1 != nil || err2 != nil {
		c.w.err("ERR value is not an integer or out of range")
		return
	}
	rec, err := c.s.node.Get(string(args[1]))
	var v []byte
	switch {
	case err == nil:
		v = rec.Value
	case errors.Is(err, api.ErrNotFound):
	default:
		c.writeErr(err)
		return
	}
	c.w.bulk(substr(v, start, end))
}

// substr is Redis's GETRANGE on v.
func substr(v []byte, start, end int64) []byte {
	n := int64(len(v))
	if start < 0 && end < 0 && start > end {
		return []byte{}
	}
	if start < 0 {
		start = max(n+start, 0)
	}
	if end < 0 {
		end = max(n+end, 0)
	}
	end = min(end, n-1)
	if n == 0 || start > end {
		return []byte{}
	}
	return v[start : end+1]
}

// setnx is SET NX answered as an integer: 1 written, 0 not.
func (c *conn) setnx(args [][]byte) {
	w := api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: string(args[1]), Value: args[2]}, Cond: &api.Condition{IfNoneMatch: true}}
	c.submit(w, func(c *conn, _ api.WriteResult, err error) {
		switch {
		case err == nil:
			c.w.int(1)
		case errors.Is(err, api.ErrPrecondition):
			c.w.int(0)
		default:
			c.writeErr(err)
		}
	})
}
