package resp

import (
	"math"
	"strconv"
	"strings"

	"github.com/replicator/replicator/entry"
)

// Increments inside a transaction (and INCRBYFLOAT anywhere) read the
// key's value and write the result as a plain value, conditional on the
// version read, like every command of a transaction: exact at this
// cluster, and last-writer-wins against a concurrent write at another
// (docs/RESP.md "Counters"). Outside a transaction INCR and its family are
// the key's counter, whose increments at every cluster add up.

// incrCmd is INCR, DECR, INCRBY and DECRBY over the view: the key keeps
// its expiry, as in Redis.
func (v *view) incrCmd(name string, args [][]byte, w *writer) {
	delta := int64(1)
	if name == "incrby" || name == "decrby" {
		d, ok := entry.ParseInt(args[2])
		if !ok {
			w.err("ERR value is not an integer or out of range")
			return
		}
		delta = d
	}
	if name == "decr" || name == "decrby" {
		if delta == math.MinInt64 {
			w.err("ERR decrement would overflow")
			return
		}
		delta = -delta
	}
	k := string(args[1])
	x := v.read(k)
	var cur int64
	if x.live {
		n, ok := entry.ParseInt(x.value)
		if !ok {
			w.err("ERR value is not an integer or out of range")
			return
		}
		cur = n
	}
	if (delta > 0 && cur > math.MaxInt64-delta) || (delta < 0 && cur < math.MinInt64-delta) {
		w.err("ERR increment or decrement would overflow")
		return
	}
	v.setTTL(k, strconv.AppendInt(nil, cur+delta, 10), x.expires)
	w.int(cur + delta)
}

// incrFloat is INCRBYFLOAT: the key's value read as a float, the sum
// written back as Redis formats it (17 significant digits, no exponent,
// no trailing zeros); the key keeps its expiry.
func (v *view) incrFloat(args [][]byte, w *writer) {
	incr, ok := parseFloat(args[2])
	if !ok {
		w.err("ERR value is not a valid float")
		return
	}
	k := string(args[1])
	x := v.read(k)
	var cur float64
	if x.live {
		if cur, ok = parseFloat(x.value); !ok {
			w.err("ERR value is not a valid float")
			return
		}
	}
	sum := cur + incr
	if math.IsNaN(sum) || math.IsInf(sum, 0) {
		w.err("ERR increment would produce NaN or Infinity")
		return
	}
	out := formatFloat(sum)
	v.setTTL(k, out, x.expires)
	w.bulk(out)
}

// parseFloat reads a float as Redis does: no spaces, no NaN, no empty.
func parseFloat(b []byte) (float64, bool) {
	s := string(b)
	if s == "" || strings.TrimSpace(s) != s || len(s) > 5000 {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil && !math.IsNaN(f)
}

// formatFloat writes f in fixed notation with the fewest digits that read
// back as f (Redis prints 17 significant digits of a long double, which
// reads 10.5 + 0.1 as 10.6 too).
func formatFloat(f float64) []byte { return strconv.AppendFloat(nil, f, 'f', -1, 64) }
