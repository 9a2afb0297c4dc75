package resp

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The introspection commands clients and tools send: CLIENT (the
// connection's own settings, the list of connections, killing one) and
// COMMAND (the table, as clients probe it at start).

// connState is what the accept loop and the other connections know of a
// connection (CLIENT LIST, CLIENT KILL): written by its own goroutine.
type connState struct {
	since  time.Time
	authed atomic.Bool
	id     atomic.Int64
	name   atomic.Pointer[string]
	proto  atomic.Int32
	// active is when its last command was read (unix ns); cmd that
	// command's name; multi the commands queued in its transaction (-1:
	// none open).
	active atomic.Int64
	cmd    atomic.Pointer[string]
	multi  atomic.Int32
}

func (st *connState) setName(name string) { st.name.Store(&name) }

func (c *conn) setName(name string) {
	c.name = name
	c.state.setName(name)
}

// noted records the pipeline just read for CLIENT LIST: its last command
// and the time.
func (st *connState) noted(batch [][][]byte) {
	if len(batch) == 0 {
		return
	}
	// The table's own name: no allocation on the hot path, a store only
	// when the command changes.
	name := "unknown"
	if cmd, ok := lookup(batch[len(batch)-1][0]); ok {
		name = cmd.name
	}
	if cur := st.cmd.Load(); cur == nil || *cur != name {
		st.cmd.Store(&name)
	}
	st.active.Store(time.Now().UnixNano())
}

func (c *conn) client(args [][]byte) {
	c.settle()
	switch strings.ToLower(string(args[1])) {
	case "id":
		c.w.int(c.id)
	case "setname":
		if len(args) != 3 {
			c.w.err(wrongArgs("client|setname"))
			return
		}
		c.setName(string(args[2]))
		c.w.simple("OK")
	case "getname":
		if c.name == "" {
			c.w.null()
			return
		}
		c.w.bulkString(c.name)
	case "setinfo", "no-evict", "no-touch":
		c.w.simple("OK")
	case "info":
		c.w.bulkString(c.s.describe(c.nc, c.state, time.Now()))
	case "list":
		c.clientList(args[2:])
	case "kill":
		c.clientKill(args[2:])
	default:
		c.w.err(fmt.Sprintf("ERR unknown subcommand '%s'. Try CLIENT HELP.", clip(args[1])))
	}
}

// describe is a connection's line of CLIENT LIST, in Redis's fields (those
// that mean something here).
func (s *Server) describe(nc net.Conn, st *connState, now time.Time) string {
	name, cmd := "", "NULL"
	if p := st.name.Load(); p != nil {
		name = *p
	}
	if p := st.cmd.Load(); p != nil {
		cmd = *p
	}
	idle := time.Duration(0)
	if a := st.active.Load(); a > 0 {
		idle = now.Sub(time.Unix(0, a))
	}
	return fmt.Sprintf("id=%d addr=%s laddr=%s fd=-1 name=%s age=%d idle=%d flags=N db=0 sub=0 psub=0 ssub=0 multi=%d cmd=%s user=default resp=%d\n",
		st.id.Load(), nc.RemoteAddr(), nc.LocalAddr(), name, int64(now.Sub(st.since).Seconds()), int64(idle.Seconds()),
		st.multi.Load(), cmd, st.proto.Load())
}

// connections returns the server's connections in the order of their IDs.
func (s *Server) connections() (ncs []net.Conn, sts []*connState) {
	s.mu.Lock()
	for nc, st := range s.mu.conns {
		if st.id.Load() > 0 { // its goroutine began
			ncs, sts = append(ncs, nc), append(sts, st)
		}
	}
	s.mu.Unlock()
	idx := make([]int, len(ncs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return int(sts[a].id.Load() - sts[b].id.Load()) })
	outN, outS := make([]net.Conn, len(idx)), make([]*connState, len(idx))
	for i, j := range idx {
		outN[i], outS[i] = ncs[j], sts[j]
	}
	return outN, outS
}

// clientList is CLIENT LIST [TYPE normal] [ID id ...].
func (c *conn) clientList(args [][]byte) {
	var ids []int64
	for i := 0; i < len(args); i++ {
		switch opt := strings.ToLower(string(args[i])); {
		case opt == "type" && i+1 < len(args):
			if t := strings.ToLower(string(args[i+1])); t != "normal" && t != "master" && t != "replica" && t != "pubsub" {
				c.w.err(fmt.Sprintf("ERR Unknown client type '%s'", clip(args[i+1])))
				return
			} else if t != "normal" {
				c.w.bulkString("") // every client here is a normal one
				return
			}
			i++
		case opt == "id" && i+1 < len(args):
			for i++; i < len(args); i++ {
				id, err := strconv.ParseInt(string(args[i]), 10, 64)
				if err != nil || id <= 0 {
					c.w.err("ERR Invalid client ID")
					return
				}
				ids = append(ids, id)
			}
		default:
			c.w.err("ERR syntax error")
			return
		}
	}
	ncs, sts := c.s.connections()
	var sb strings.Builder
	now := time.Now()
	for i, st := range sts {
		if ids == nil || slices.Contains(ids, st.id.Load()) {
			sb.WriteString(c.s.describe(ncs[i], st, now))
		}
	}
	c.w.bulkString(sb.String())
}

// clientKill closes the connections named: CLIENT KILL addr (answers OK,
// or an error when none is), or CLIENT KILL with filters ID, ADDR, LADDR,
// USER, TYPE and SKIPME (answers how many; SKIPME yes by default).
func (c *conn) clientKill(args [][]byte) {
	if len(args) == 0 {
		c.w.err(wrongArgs("client|kill"))
		return
	}
	var id int64
	var addr, laddr string
	skipMe, old := true, len(args) == 1
	if old {
		addr, skipMe = string(args[0]), false
	} else {
		if len(args)%2 != 0 {
			c.w.err("ERR syntax error")
			return
		}
		for i := 0; i < len(args); i += 2 {
			v := string(args[i+1])
			switch strings.ToLower(string(args[i])) {
			case "id":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n <= 0 {
					c.w.err("ERR client-id should be greater than 0")
					return
				}
				id = n
			case "addr":
				addr = v
			case "laddr":
				laddr = v
			case "user":
				if v != "default" {
					c.w.int(0) // one user here
					return
				}
			case "type":
				if strings.ToLower(v) != "normal" {
					c.w.int(0)
					return
				}
			case "skipme":
				switch strings.ToLower(v) {
				case "yes":
					skipMe = true
				case "no":
					skipMe = false
				default:
					c.w.err("ERR syntax error")
					return
				}
			default:
				c.w.err("ERR syntax error")
				return
			}
		}
	}
	ncs, sts := c.s.connections()
	killed, self := 0, false
	for i, st := range sts {
		nc := ncs[i]
		switch {
		case id != 0 && st.id.Load() != id,
			addr != "" && nc.RemoteAddr().String() != addr,
			laddr != "" && nc.LocalAddr().String() != laddr:
			continue
		case st == c.state:
			if skipMe {
				continue
			}
			self = true // closed once this reply is written
		default:
			// Its goroutine sees the socket closed, as if the client
			// left: a write it was waiting for keeps its fate.
			nc.Close()
		}
		killed++
	}
	switch {
	case old && killed == 0:
		c.w.err("ERR No such client")
	case old:
		c.w.simple("OK")
	default:
		c.w.int(int64(killed))
	}
	c.quit = c.quit || self
}

// commandCmd answers COMMAND as clients probe it at start: the count, an
// entry per command (name, arity, no flags, key positions), INFO for the
// commands named (nil for one not served), DOCS with a summary.
func (c *conn) commandCmd(args [][]byte) {
	c.settle()
	sub := ""
	if len(args) > 1 {
		sub = strings.ToLower(string(args[1]))
	}
	switch sub {
	case "count":
		c.w.int(int64(len(table)))
	case "docs":
		names := args[2:]
		if len(names) == 0 {
			for name := range table {
				names = append(names, []byte(name))
			}
		}
		var known []string
		for _, n := range names {
			if cmd, ok := lookup(n); ok {
				known = append(known, cmd.name)
			}
		}
		c.w.mapHeader(len(known))
		for _, name := range known {
			c.w.bulkString(name)
			c.w.mapHeader(2)
			c.w.bulkString("summary")
			c.w.bulkString(strings.ToUpper(name) + " as Redis serves it, with the differences docs/RESP.md lists")
			c.w.bulkString("group")
			c.w.bulkString("replicator")
		}
	case "info":
		c.w.array(len(args) - 2)
		for _, n := range args[2:] {
			if cmd, ok := lookup(n); ok {
				commandEntry(&c.w, cmd)
			} else {
				c.w.null()
			}
		}
	case "":
		c.w.array(len(table))
		for _, cmd := range table {
			commandEntry(&c.w, cmd)
		}
	default:
		c.w.err(fmt.Sprintf("ERR unknown subcommand '%s'. Try COMMAND HELP.", clip(args[1])))
	}
}

// commandEntry is a command's entry in COMMAND's reply: name, arity, flags
// (none), its first and last key and the step between keys.
func commandEntry(w *writer, cmd command) {
	first, last, step := 0, 0, 0
	switch cmd.name {
	case "get", "set", "incr", "decr", "incrby", "decrby", "incrbyfloat", "setnx", "getset", "getdel", "append", "setrange",
		"getrange", "type", "strlen":
		first, last, step = 1, 1, 1
	case "mget", "del", "exists", "unlink", "watch":
		first, last, step = 1, -1, 1
	case "mset", "msetnx":
		first, last, step = 1, -1, 2
	}
	w.any([]any{cmd.name, cmd.arity, []any{}, first, last, step})
}
