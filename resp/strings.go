package resp

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// The string commands that read a key's value and write on what they read
// (GETDEL, APPEND, SETRANGE), and the read-only GETRANGE. A write is made
// on the condition that the key still holds the version read (If-Match, or
// If-None-Match for an absent key), decided in commit order, and read
// again if another write came between: as SET XX and SET GET
// (docs/RESP.md "Answers that depend on the state before the write").

// readModify reads key and asks next what to write: a write (nil: none)
// and the reply once it is written (or at once, when nothing is). A key
// holding a counter is WRONGTYPE.
func (c *conn) readModify(key string, next func(old []byte, live bool) (*api.Write, func())) {
	c.settle()
	for range maxRounds {
		rec, err := c.s.node.Get(key)
		live := err == nil
		if err != nil && !errors.Is(err, api.ErrNotFound) {
			c.writeErr(err)
			return
		}
		if !live {
			if _, err := c.s.node.Counter(key); err == nil {
				c.writeErr(fmt.Errorf("%w: %q is a counter", api.ErrKindConflict, key))
				return
			}
		}
		w, reply := next(rec.Value, live)
		if w == nil {
			reply()
			return
		}
		if live {
			w.Cond = &api.Condition{IfMatch: rec.Stamp.String()}
		} else {
			w.Cond = &api.Condition{IfNoneMatch: true}
		}
		_, err = c.now(*w)
		switch {
		case err == nil:
			reply()
			return
		case errors.Is(err, api.ErrPrecondition):
			continue // another write came first: read again
		default:
			c.writeErr(err)
			return
		}
	}
	c.writeErr(fmt.Errorf("%w: the key changed under %d conditional attempts (contention)", api.ErrNotWritten, maxRounds))
}

// getdel answers a key's value and deletes it (nil, nothing written, for
// a key that holds none).
func (c *conn) getdel(args [][]byte) {
	key := string(args[1])
	c.readModify(key, func(old []byte, live bool) (*api.Write, func()) {
		if !live {
			return nil, c.w.null
		}
		return &api.Write{Entry: entry.Entry{Op: entry.OpDelete, Key: key}}, func() { c.w.bulk(old) }
	})
}

// appendCmd appends to a key's value (an absent key is ""), and answers
// the new length.
func (c *conn) appendCmd(args [][]byte) {
	key, more := string(args[1]), args[2]
	c.readModify(key, func(old []byte, _ bool) (*api.Write, func()) {
		v := append(append(make([]byte, 0, len(old)+len(more)), old...), more...)
		return &api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: v}}, func() { c.w.int(int64(len(v))) }
	})
}

// setrange overwrites a key's value from offset on, padding with zero
// bytes, and answers the new length (an empty value writes nothing).
func (c *conn) setrange(args [][]byte) {
	key, part := string(args[1]), args[3]
	off, err := strconv.ParseInt(string(args[2]), 10, 64)
	if err != nil || off < 0 {
		c.settle()
		c.w.err("ERR offset is out of range")
		return
	}
	if off+int64(len(part)) > int64(c.s.opts.Limits.MaxBulk) {
		c.settle()
		c.w.err(fmt.Sprintf("ERR string exceeds the value limit (%d bytes)", c.s.opts.Limits.MaxBulk))
		return
	}
	c.readModify(key, func(old []byte, _ bool) (*api.Write, func()) {
		if len(part) == 0 {
			return nil, func() { c.w.int(int64(len(old))) }
		}
		v := make([]byte, max(int64(len(old)), off+int64(len(part))))
		copy(v, old)
		copy(v[off:], part)
		return &api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: v}}, func() { c.w.int(int64(len(v))) }
	})
}

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
