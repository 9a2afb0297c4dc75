package resp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// A transaction runs optimistically (docs/RESP.md "Transactions"): its
// commands run over a view of the keys as this node reads them, in order,
// each reading what the earlier ones wrote; what they write becomes one
// atomic write, conditional on every key the transaction read (and every
// WATCHed key) still holding the version read, decided by the state
// machine in commit order. When another write came between, the
// transaction runs again on what is there now; a WATCHed key that changed
// ends it with a nil reply instead. The commands that read a key and write
// on what they read (GETDEL, APPEND, SETRANGE, SET XX or GET, GETSET,
// MSETNX) are transactions of one command.

// view is what a transaction sees: the keys as read, then as its commands
// left them.
type view struct {
	c    *conn
	keys map[string]*vkey
	// order are the keys written, in the order first written.
	order []string
	// err is a failed read: the transaction answers it whole.
	err error
}

type vkey struct {
	// As read: the version of the key's value ("" for none). A counter
	// reads as its decimal value (its plain value and increments as one).
	version string
	// As the transaction left it.
	live    bool
	value   []byte
	expires int64 // wall ns; 0: never
	written bool
	// depends: a command read the key before the transaction wrote it;
	// the write is conditional on its version.
	depends bool
}

func newView(c *conn) *view { return &view{c: c, keys: map[string]*vkey{}} }

// key returns the key's state, reading it on first use.
func (v *view) key(k string) *vkey {
	if x := v.keys[k]; x != nil {
		return x
	}
	x := &vkey{}
	v.keys[k] = x
	rec, err := v.c.s.node.Get(k)
	switch {
	case err == nil:
		x.version, x.live, x.value, x.expires = rec.Stamp.String(), true, rec.Value, rec.Expires
	case errors.Is(err, api.ErrNotFound):
	default:
		v.fail(err)
	}
	return x
}

func (v *view) fail(err error) {
	if v.err == nil {
		v.err = err
	}
}

// read is key for a command whose answer or write depends on what the key
// holds.
func (v *view) read(k string) *vkey {
	x := v.key(k)
	if !x.written {
		x.depends = true
	}
	return x
}

// set writes a version of k that does not expire.
func (v *view) set(k string, value []byte) { v.setTTL(k, value, 0) }

// setTTL writes a version of k that expires at expires (0: never).
func (v *view) setTTL(k string, value []byte, expires int64) {
	x := v.key(k)
	if !x.written {
		x.written = true
		v.order = append(v.order, k)
	}
	x.live, x.value, x.expires = true, value, expires
}

func (v *view) del(k string) {
	v.set(k, nil)
	v.keys[k].live = false
}

// write is what the transaction writes, conditional on the versions it
// read and the WATCHed ones; ok false when it writes nothing. A write of
// one key conditional on that key alone is a single-key write with If-Match
// (or If-None-Match), which every build decides; any other condition needs
// command format 10 (api.Condition.Keys).
func (v *view) write(watched map[string]string) (w api.Write, ok bool) {
	var ops []api.BatchOp
	for _, k := range v.order {
		x := v.keys[k]
		if !x.live && x.version == "" {
			continue // a delete of what never was: nothing to write
		}
		op := api.BatchOp{Key: k, Value: x.value, Delete: !x.live}
		if x.live {
			op.Expires = x.expires
		}
		ops = append(ops, op)
	}
	if len(ops) == 0 {
		return w, false
	}
	conds := v.conditions(watched)
	if len(ops) == 1 && (len(conds) == 0 || (len(conds) == 1 && conds[0].Key == ops[0].Key)) {
		op := ops[0]
		w.Entry = entry.Entry{Op: entry.OpSet, Key: op.Key, Value: op.Value, Expires: op.Expires}
		if op.Delete {
			w.Entry.Op = entry.OpDelete
		}
		switch {
		case len(conds) == 0:
		case conds[0].Version == "":
			w.Cond = &api.Condition{IfNoneMatch: true}
		default:
			w.Cond = &api.Condition{IfMatch: conds[0].Version}
		}
		return w, true
	}
	w.Ops = ops
	if len(conds) > 0 {
		w.Cond = &api.Condition{Keys: conds}
	}
	return w, true
}

// conditions are the keys read before written, and the WATCHed ones, with
// their versions as read.
func (v *view) conditions(watched map[string]string) []api.KeyVersion {
	var out []api.KeyVersion
	for k, x := range v.keys {
		if _, w := watched[k]; x.depends && !w {
			out = append(out, api.KeyVersion{Key: k, Version: x.version})
		}
	}
	for k, ver := range watched {
		out = append(out, api.KeyVersion{Key: k, Version: ver})
	}
	return out
}

// unchanged reports whether every key the transaction depends on (and
// every WATCHed one) still holds the version read: a transaction that
// writes nothing is answered only then, so its reads were all true at one
// moment (each key held its version from its first read to its second).
func (v *view) unchanged(watched map[string]string) (bool, error) {
	again := newView(v.c)
	for _, kv := range v.conditions(watched) {
		x := again.key(kv.Key)
		if again.err != nil {
			return false, again.err
		}
		if x.version != kv.Version {
			return false, nil
		}
	}
	return true, nil
}

// awaitChange waits, briefly, until this node reads key at another version
// than the view read: a condition on it failed at the leader, and a
// follower behind its leader would otherwise read the same version again.
func (v *view) awaitChange(key string) {
	x, ok := v.keys[key]
	if !ok {
		return
	}
	for range 50 {
		again := newView(v.c)
		if y := again.key(key); again.err != nil || y.version != x.version {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// errContention ends a transaction whose keys kept changing under it.
var errContention = fmt.Errorf("%w: the keys changed under %d attempts (contention)", api.ErrNotWritten, maxRounds)

// run runs one command over the view and writes its reply to w: the
// commands a transaction serves (txnServed), as they answer outside one.
func (v *view) run(args [][]byte, w *writer) {
	name := strings.ToLower(string(args[0]))
	switch name {
	case "ping":
		if len(args) == 2 {
			w.bulk(args[1])
		} else {
			w.simple("PONG")
		}
	case "echo":
		w.bulk(args[1])
	case "get":
		v.value(string(args[1]), w)
	case "mget":
		w.array(len(args) - 1)
		for _, k := range args[1:] {
			v.value(string(k), w)
		}
	case "exists":
		n := int64(0)
		for _, k := range args[1:] {
			if x := v.read(string(k)); x.live {
				n++
			}
		}
		w.int(n)
	case "type":
		if x := v.read(string(args[1])); x.live {
			w.simple("string")
		} else {
			w.simple("none")
		}
	case "strlen":
		w.int(int64(len(v.read(string(args[1])).value)))
	case "getrange", "substr":
		start, err1 := strconv.ParseInt(string(args[2]), 10, 64)
		end, err2 := strconv.ParseInt(string(args[3]), 10, 64)
		if err1 != nil || err2 != nil {
			w.err("ERR value is not an integer or out of range")
			return
		}
		w.bulk(substr(v.read(string(args[1])).value, start, end))
	case "set", "getset":
		v.setCmd(name, args, w)
	case "setnx":
		k := string(args[1])
		switch x := v.read(k); {
		case x.live:
			w.int(0)
		default:
			v.set(k, args[2])
			w.int(1)
		}
	case "mset", "msetnx":
		v.msetCmd(name, args, w)
	case "getdel":
		k := string(args[1])
		switch x := v.read(k); {
		case x.live:
			w.bulk(x.value)
			v.del(k)
		default:
			w.null()
		}
	case "del", "unlink":
		n := int64(0)
		for _, a := range args[1:] {
			if k := string(a); v.read(k).live {
				n++
				v.del(k)
			}
		}
		w.int(n)
	case "append":
		k, more := string(args[1]), args[2]
		x := v.read(k)
		val := append(append(make([]byte, 0, len(x.value)+len(more)), x.value...), more...)
		v.setTTL(k, val, x.expires) // APPEND keeps the key's expiry
		w.int(int64(len(val)))
	case "setrange":
		v.setrangeCmd(args, w)
	case "setex", "psetex":
		at, ok := expiryAt(map[string]string{"setex": "ex", "psetex": "px"}[name], args[2], v.c.s.opts.Now())
		switch {
		case !ok:
			w.err("ERR invalid expire time in '" + name + "' command")
		default:
			v.setTTL(string(args[1]), args[3], at)
			w.simple("OK")
		}
	case "expire", "pexpire", "expireat", "pexpireat":
		v.expireCmd(name, args, w)
	case "persist":
		v.persist(string(args[1]), w)
	case "ttl", "pttl", "expiretime", "pexpiretime":
		v.ttlCmd(name, string(args[1]), w)
	case "getex":
		v.getex(args, w)
	case "incr", "decr", "incrby", "decrby":
		v.incrCmd(name, args, w)
	case "incrbyfloat":
		v.incrFloat(args, w)
	default:
		// txnServed and this switch disagree: a bug, said as one.
		w.err("ERR " + strings.ToUpper(name) + " is not served inside a transaction")
	}
}

// value answers a key's value (as GET).
func (v *view) value(k string, w *writer) {
	if x := v.read(k); x.live {
		w.bulk(x.value)
	} else {
		w.null()
	}
}

// setCmd is SET key value [NX | XX] [GET] [EX s | PX ms | EXAT t | PXAT
// t | KEEPTTL], and GETSET.
func (v *view) setCmd(name string, args [][]byte, w *writer) {
	k, value := string(args[1]), args[2]
	o := setOpts{get: name == "getset"}
	if name == "set" {
		var msg string
		if o, msg = parseSet(args[3:], v.c.s.opts.Now); msg != "" {
			w.err(msg)
			return
		}
	}
	nx, xx, get := o.nx, o.xx, o.get
	x := v.key(k)
	if nx || xx || get || o.keep {
		x = v.read(k)
	}
	old, live := x.value, x.live
	if (xx && !live) || (nx && live) {
		if get && live {
			w.bulk(old)
		} else {
			w.null()
		}
		return
	}
	expires := o.expires
	if o.keep {
		expires = x.expires
	}
	v.setTTL(k, value, expires)
	switch {
	case !get:
		w.simple("OK")
	case live:
		w.bulk(old)
	default:
		w.null()
	}
}

// msetCmd is MSET (every pair) and MSETNX (every pair, only when no key
// holds a value: 1, else 0 and nothing).
func (v *view) msetCmd(name string, args [][]byte, w *writer) {
	if len(args)%2 != 1 {
		w.err(wrongArgs(name))
		return
	}
	for i := 1; i < len(args); i += 2 {
		k := string(args[i])
		x := v.key(k)
		if name == "msetnx" {
			x = v.read(k)
			if x.live {
				w.int(0)
				return
			}
		}
	}
	for i := 1; i < len(args); i += 2 {
		v.set(string(args[i]), args[i+1])
	}
	if name == "msetnx" {
		w.int(1)
	} else {
		w.simple("OK")
	}
}

// setrangeCmd overwrites a key's value from an offset on, padding with
// zero bytes, and answers the new length (an empty part writes nothing).
func (v *view) setrangeCmd(args [][]byte, w *writer) {
	k, part := string(args[1]), args[3]
	off, err := strconv.ParseInt(string(args[2]), 10, 64)
	if err != nil || off < 0 {
		w.err("ERR offset is out of range")
		return
	}
	if off+int64(len(part)) > int64(v.c.s.opts.Limits.MaxBulk) {
		w.err(fmt.Sprintf("ERR string exceeds the value limit (%d bytes)", v.c.s.opts.Limits.MaxBulk))
		return
	}
	x := v.read(k)
	if len(part) == 0 {
		w.int(int64(len(x.value)))
		return
	}
	val := make([]byte, max(int64(len(x.value)), off+int64(len(part))))
	copy(val, x.value)
	copy(val[off:], part)
	v.setTTL(k, val, x.expires) // SETRANGE keeps the key's expiry
	w.int(int64(len(val)))
}
