package resp

import (
	"sort"
	"strconv"
)

// writer builds a connection's replies in the protocol it negotiated:
// RESP2 until HELLO 3, then RESP3 (maps, nulls, booleans, doubles, verbatim
// strings). tidwall/redcon's writer has no RESP3 types, so these are ours.
type writer struct {
	buf   []byte
	proto int // 2 or 3
}

func (w *writer) simple(s string) {
	w.buf = append(append(append(w.buf, '+'), s...), '\r', '\n')
}

// err writes an error reply: its first word is its class (ERR, WRONGTYPE,
// NOTWRITTEN, UNKNOWNOUTCOME, ...). Line breaks cannot cross.
func (w *writer) err(msg string) {
	w.buf = append(w.buf, '-')
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		w.buf = append(w.buf, c)
	}
	w.buf = append(w.buf, '\r', '\n')
}

func (w *writer) int(n int64) {
	w.buf = strconv.AppendInt(append(w.buf, ':'), n, 10)
	w.buf = append(w.buf, '\r', '\n')
}

func (w *writer) bulk(b []byte) {
	w.buf = strconv.AppendInt(append(w.buf, '$'), int64(len(b)), 10)
	w.buf = append(append(append(w.buf, '\r', '\n'), b...), '\r', '\n')
}

func (w *writer) bulkString(s string) {
	w.buf = strconv.AppendInt(append(w.buf, '$'), int64(len(s)), 10)
	w.buf = append(append(append(w.buf, '\r', '\n'), s...), '\r', '\n')
}

// null is a missing value: $-1 in RESP2, _ in RESP3.
func (w *writer) null() {
	if w.proto == 3 {
		w.buf = append(w.buf, '_', '\r', '\n')
		return
	}
	w.buf = append(w.buf, "$-1\r\n"...)
}

// nullArray is a missing array (EXEC of a transaction whose WATCHed key
// changed): *-1 in RESP2, _ in RESP3.
func (w *writer) nullArray() {
	if w.proto == 3 {
		w.buf = append(w.buf, '_', '\r', '\n')
		return
	}
	w.buf = append(w.buf, "*-1\r\n"...)
}

func (w *writer) array(n int) {
	w.buf = strconv.AppendInt(append(w.buf, '*'), int64(n), 10)
	w.buf = append(w.buf, '\r', '\n')
}

// mapHeader starts a map of n pairs: % in RESP3, an array of 2n in RESP2.
func (w *writer) mapHeader(n int) {
	if w.proto == 3 {
		w.buf = strconv.AppendInt(append(w.buf, '%'), int64(n), 10)
		w.buf = append(w.buf, '\r', '\n')
		return
	}
	w.array(2 * n)
}

// verbatim is a text for people (INFO): = with its format in RESP3, a bulk
// string in RESP2.
func (w *writer) verbatim(s string) {
	if w.proto != 3 {
		w.bulkString(s)
		return
	}
	w.buf = strconv.AppendInt(append(w.buf, '='), int64(len(s)+4), 10)
	w.buf = append(append(append(w.buf, "\r\ntxt:"...), s...), '\r', '\n')
}

// any writes a value of the few shapes replies take: strings as bulk
// strings, integers, string maps in key order, lists, nil.
func (w *writer) any(v any) {
	switch v := v.(type) {
	case nil:
		w.null()
	case string:
		w.bulkString(v)
	case []byte:
		w.bulk(v)
	case int:
		w.int(int64(v))
	case int64:
		w.int(v)
	case []any:
		w.array(len(v))
		for _, e := range v {
			w.any(e)
		}
	case []string:
		w.array(len(v))
		for _, e := range v {
			w.bulkString(e)
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		w.mapHeader(len(keys))
		for _, k := range keys {
			w.bulkString(k)
			w.any(v[k])
		}
	default:
		w.err("ERR internal: a reply of an unknown shape")
	}
}
