package resp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/replicator/replicator/api"
)

// The key space's commands (SCAN, KEYS, TYPE, STRLEN), the server's clock
// (TIME), and the answer to a family this door does not serve.

// scan: SCAN cursor [MATCH prefix*] [COUNT n]. Keys of up to 4 KiB do not
// fit a 64-bit cursor: the server keeps each scan's place in a bounded,
// expiring table, and the cursor names it.
func (c *conn) scan(args [][]byte) {
	c.settle()
	cur, err := strconv.ParseUint(string(args[1]), 10, 64)
	if err != nil {
		c.w.err("ERR invalid cursor")
		return
	}
	pattern, count := "*", 10
	for i := 2; i < len(args); i++ {
		if i+1 >= len(args) {
			c.w.err("ERR syntax error")
			return
		}
		switch strings.ToLower(string(args[i])) {
		case "match":
			pattern = string(args[i+1])
		case "count":
			n, err := strconv.Atoi(string(args[i+1]))
			if err != nil || n < 1 {
				c.w.err("ERR value is not an integer or out of range")
				return
			}
			count = min(n, 10000)
		case "type":
			if t := strings.ToLower(string(args[i+1])); t != "string" {
				c.w.array(2)
				c.w.bulkString("0")
				c.w.array(0)
				return
			}
		default:
			c.w.err("ERR syntax error")
			return
		}
		i++
	}
	after := ""
	if cur != 0 {
		place, ok := c.s.cursors.take(cur, pattern)
		if !ok {
			c.w.err("ERR invalid cursor (unknown, expired, or from another MATCH)")
			return
		}
		after = place
	}
	// A page reads COUNT keys from the pattern's literal prefix on and
	// answers those that match: fewer than COUNT, or none, as Redis may.
	items, next, err := c.s.node.Scan(scanOptions(literalPrefix(pattern), after, count))
	if err != nil {
		c.writeErr(err)
		return
	}
	nextCur := uint64(0)
	if next != "" {
		nextCur = c.s.cursors.put(next, pattern, cur, c.id)
	}
	keys := items[:0]
	for _, it := range items {
		if match(pattern, it.Key) {
			keys = append(keys, it)
		}
	}
	c.w.array(2)
	c.w.bulkString(strconv.FormatUint(nextCur, 10))
	c.w.array(len(keys))
	for _, it := range keys {
		c.w.bulkString(it.Key)
	}
}

// keys answers every key matching the pattern, read page by page from the
// pattern's literal prefix on, within the connection's bound on replies
// (as Redis, it reads the whole range the pattern may match: SCAN pages).
func (c *conn) keys(args [][]byte) {
	c.settle()
	pattern := string(args[1])
	prefix, after := literalPrefix(pattern), ""
	var out []string
	size := 0
	for {
		items, next, err := c.s.node.Scan(scanOptions(prefix, after, 1000))
		if err != nil {
			c.writeErr(err)
			return
		}
		for _, it := range items {
			if !match(pattern, it.Key) {
				continue
			}
			out = append(out, it.Key)
			if size += len(it.Key) + 16; size > c.s.opts.MaxReply {
				c.w.err("ERR the keys matching the pattern exceed the connection's bound on replies; use SCAN")
				return
			}
		}
		if next == "" {
			break
		}
		after = next
	}
	c.w.array(len(out))
	for _, k := range out {
		c.w.bulkString(k)
	}
}

// keyType answers TYPE: "string" for a plain value and for a counter (its
// value reads as an integer string, as Redis's INCR keys do), "none" for a
// key that holds neither.
func (c *conn) keyType(args [][]byte) {
	c.settle()
	key := string(args[1])
	_, err := c.s.node.Get(key)
	switch {
	case err == nil:
		c.w.simple("string")
	case errors.Is(err, api.ErrNotFound):
		c.w.simple("none")
	default:
		c.writeErr(err)
	}
}

// strlen answers the length of a key's value (a counter's as its decimal
// string), 0 for a key that holds nothing.
func (c *conn) strlen(args [][]byte) {
	c.settle()
	key := string(args[1])
	rec, err := c.s.node.Get(key)
	if err == nil {
		c.w.int(int64(len(rec.Value)))
		return
	}
	if errors.Is(err, api.ErrNotFound) {
		c.w.int(0)
		return
	}
	c.writeErr(err)
}

// timeCmd answers the node's clock: seconds and microseconds.
func (c *conn) timeCmd(_ [][]byte) {
	c.settle()
	now := c.s.opts.Now()
	c.w.array(2)
	c.w.bulkString(strconv.FormatInt(now/1e9, 10))
	c.w.bulkString(strconv.FormatInt(now%1e9/1e3, 10))
}

// notServed answers a command of a family this door does not serve, naming
// what to use instead (docs/RESP.md "Not served").
func notServed(why string) func(c *conn, args [][]byte) {
	return func(c *conn, args [][]byte) {
		c.settle()
		c.s.stats.error("bad_request")
		c.w.err(fmt.Sprintf("ERR %s is not served by this server: %s (docs/RESP.md)", strings.ToUpper(string(args[0])), why))
	}
}
