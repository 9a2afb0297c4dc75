package resp

import (
	"math"
	"strconv"
	"strings"
)

// Expiry (docs/DATAMODEL.md "Expiry", docs/RESP.md): an expiry belongs to a
// version. SET with EX, PX, EXAT or PXAT (SETEX, PSETEX) writes a version
// that expires; a SET without KEEPTTL writes one that does not; APPEND and
// SETRANGE keep the key's expiry. EXPIRE and its family, PERSIST and GETEX
// with an option write a new version of the key with the value read and the
// new expiry, on the condition that the key still holds the version read
// (a transaction of one command). A relative time becomes an absolute one
// here, at this node's clock.

// setOpts are SET's options.
type setOpts struct {
	nx, xx, get, keep bool
	expires           int64 // wall ns; 0: none
}

// parseSet reads SET's options (args after the value), a relative time
// counting from now() (read only for one); errMsg is the error to answer.
func parseSet(args [][]byte, now func() int64) (o setOpts, errMsg string) {
	timed := false
	for i := 0; i < len(args); i++ {
		switch opt := strings.ToLower(string(args[i])); opt {
		case "nx":
			o.nx = true
		case "xx":
			o.xx = true
		case "get":
			o.get = true
		case "keepttl":
			o.keep = true
		case "ex", "px", "exat", "pxat":
			if timed || i+1 == len(args) {
				return o, "ERR syntax error"
			}
			timed = true
			i++
			x, ok := expiryAt(opt, args[i], now())
			if !ok {
				return o, "ERR invalid expire time in 'set' command"
			}
			o.expires = x
		default:
			return o, "ERR syntax error"
		}
	}
	if (o.nx && o.xx) || (o.keep && timed) {
		return o, "ERR syntax error"
	}
	return o, ""
}

// expiryAt is the absolute expiry (wall ns) an option's argument names: EX
// seconds and PX milliseconds from now, EXAT and PXAT a Unix time in
// seconds and milliseconds. A time that is not a positive integer, or past
// the clock's range, is refused.
func expiryAt(unit string, arg []byte, now int64) (int64, bool) {
	n, err := strconv.ParseInt(string(arg), 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	var scale int64 = 1e9
	if unit == "px" || unit == "pxat" {
		scale = 1e6
	}
	if n > math.MaxInt64/scale {
		return 0, false
	}
	d := n * scale
	if unit == "exat" || unit == "pxat" {
		return d, true
	}
	if d > math.MaxInt64-now {
		return 0, false
	}
	return now + d, true
}

// expireCmd is EXPIRE, PEXPIRE, EXPIREAT and PEXPIREAT key time [NX | XX |
// GT | LT]: 1 when the expiry was set (or the key deleted, for a time
// already past), 0 when the key holds nothing or the option refused.
func (v *view) expireCmd(name string, args [][]byte, w *writer) {
	k := string(args[1])
	n, err := strconv.ParseInt(string(args[2]), 10, 64)
	if err != nil {
		w.err("ERR value is not an integer or out of range")
		return
	}
	var nx, xx, gt, lt bool
	for _, o := range args[3:] {
		switch strings.ToLower(string(o)) {
		case "nx":
			nx = true
		case "xx":
			xx = true
		case "gt":
			gt = true
		case "lt":
			lt = true
		default:
			w.err("ERR Unsupported option " + clip(o))
			return
		}
	}
	if (nx && (xx || gt || lt)) || (gt && lt) {
		w.err("ERR NX and XX, GT or LT options at the same time are not compatible")
		return
	}
	now := v.c.s.opts.Now()
	var scale int64 = 1e9
	if name == "pexpire" || name == "pexpireat" {
		scale = 1e6
	}
	if n > math.MaxInt64/scale || n < math.MinInt64/scale {
		w.err("ERR invalid expire time in '" + name + "' command")
		return
	}
	at := n * scale
	if name == "expire" || name == "pexpire" {
		if at > 0 && at > math.MaxInt64-now { // (a negative one cannot overflow: now is positive)
			w.err("ERR invalid expire time in '" + name + "' command")
			return
		}
		at += now
	}
	x := v.read(k)
	switch {
	case !x.live:
		w.int(0)
		return
	case nx && x.expires != 0, xx && x.expires == 0,
		// No expiry counts as infinite: GT never beats it, LT always does.
		gt && (x.expires == 0 || at <= x.expires), lt && x.expires != 0 && at >= x.expires:
		w.int(0)
		return
	}
	if at <= now {
		v.del(k) // a time already past deletes the key, as Redis does
	} else {
		v.setTTL(k, x.value, at)
	}
	w.int(1)
}

// persist drops a key's expiry: 1 when it had one, else 0.
func (v *view) persist(k string, w *writer) {
	x := v.read(k)
	if !x.live || x.expires == 0 {
		w.int(0)
		return
	}
	v.setTTL(k, x.value, 0)
	w.int(1)
}

// ttlCmd answers TTL, PTTL, EXPIRETIME and PEXPIRETIME: -2 for a key that
// holds nothing, -1 for one that does not expire.
func (v *view) ttlCmd(name, k string, w *writer) {
	x := v.read(k)
	switch {
	case !x.live:
		w.int(-2)
		return
	case x.expires == 0:
		w.int(-1)
		return
	}
	now := v.c.s.opts.Now()
	switch name {
	case "ttl":
		w.int(max(0, (x.expires-now+5e8)/1e9)) // rounded, as Redis does
	case "pttl":
		w.int(max(0, (x.expires-now+5e5)/1e6))
	case "expiretime":
		w.int(x.expires / 1e9)
	default: // pexpiretime
		w.int(x.expires / 1e6)
	}
}

// getex answers a key's value and, with an option, sets its expiry (EX,
// PX, EXAT, PXAT) or drops it (PERSIST).
func (v *view) getex(args [][]byte, w *writer) {
	k := string(args[1])
	var at int64
	persist, timed := false, false
	for i := 2; i < len(args); i++ {
		switch opt := strings.ToLower(string(args[i])); opt {
		case "persist":
			persist = true
		case "ex", "px", "exat", "pxat":
			if timed || i+1 == len(args) {
				w.err("ERR syntax error")
				return
			}
			timed = true
			i++
			x, ok := expiryAt(opt, args[i], v.c.s.opts.Now())
			if !ok {
				w.err("ERR invalid expire time in 'getex' command")
				return
			}
			at = x
		default:
			w.err("ERR syntax error")
			return
		}
	}
	if persist && timed {
		w.err("ERR syntax error")
		return
	}
	x := v.read(k)
	switch {
	case !x.live:
		v.value(k, w)
		return
	}
	w.bulk(x.value)
	switch {
	case persist && x.expires != 0:
		v.setTTL(k, x.value, 0)
	case timed:
		v.setTTL(k, x.value, at)
	}
}
