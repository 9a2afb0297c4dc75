package resp

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestExpiryCommands: the expiry family over a node whose versions expire
// at a clock the test moves: SET's options, SETEX, EXPIRE with NX, XX, GT
// and LT, PERSIST, TTL and PTTL, EXPIRETIME, GETEX, APPEND and SETRANGE
// keeping the expiry, SET without KEEPTTL dropping it, a time already past
// deleting the key, and an expired key reading as absent.
func TestExpiryCommands(t *testing.T) {
	var clock atomic.Int64
	clock.Store(1_700_000_000 * int64(time.Second))
	now := clock.Load
	f := &recordingNode{now: now}
	_, addr := serve(t, f, Options{Now: now})
	send, expectAll := sender(t, addr)
	advance := func(d time.Duration) { clock.Add(int64(d)) }

	send("SET k v EX 10", "TTL k", "PTTL k", "EXPIRETIME k", "PEXPIRETIME k")
	expectAll("+OK", ":10", ":10000", ":1700000010", ":1700000010000")
	if w := f.writes(); len(w) != 1 || w[0].Entry.Expires != now()+10e9 {
		t.Fatalf("SET EX submitted %+v, want an expiry 10 s from now", w)
	}
	advance(4 * time.Second)
	send("TTL k", "APPEND k w", "TTL k", "SETRANGE k 0 V", "TTL k", "GET k")
	expectAll(":6", ":2", ":6", ":2", ":6", "$2", "Vw")
	advance(6 * time.Second)
	send("GET k", "EXISTS k", "TTL k", "PTTL k", "APPEND k x", "TTL k")
	expectAll("$-1", ":0", ":-2", ":-2", ":1", ":-1")

	send("SET p v", "TTL p", "EXPIRE p 5", "TTL p", "EXPIRE p 10 NX", "EXPIRE p 10 XX", "TTL p",
		"EXPIRE p 3 GT", "EXPIRE p 3 LT", "TTL p", "PERSIST p", "TTL p", "PERSIST p", "EXPIRE p 5 GT", "EXPIRE p 5 LT", "TTL p")
	expectAll("+OK", ":-1", ":1", ":5", ":0", ":1", ":10", ":0", ":1", ":3", ":1", ":-1", ":0", ":0", ":1", ":5")
	send("SET p w KEEPTTL", "TTL p", "SET p x", "TTL p", "PEXPIRE p 1500", "PTTL p", "PEXPIREAT p 1700000020000", "TTL p")
	expectAll("+OK", ":5", "+OK", ":-1", ":1", ":1500", ":1", ":10")
	send("EXPIRE p -1", "EXISTS p", "EXPIRE nope 5", "PERSIST nope", "EXPIRE p 5 NX XX", "EXPIRE p x")
	expectAll(":1", ":0", ":0", ":0", "-ERR NX and XX", "-ERR value is not an integer")

	send("SETEX s 100 v", "TTL s", "PSETEX s 2500 v", "PTTL s", "SETEX s 0 v", "SETEX s x v", "SET s v EX 0", "SET s v EX 5 PX 5", "SET s v KEEPTTL EX 5")
	expectAll("+OK", ":100", "+OK", ":2500", "-ERR invalid expire time in 'setex'", "-ERR invalid expire time", "-ERR invalid expire time in 'set'",
		"-ERR syntax error", "-ERR syntax error")
	send("GETEX s EX 50", "TTL s", "GETEX s PERSIST", "TTL s", "GETEX s PXAT 1700000099000", "PTTL s", "GETEX nope EX 5", "GETEX s PERSIST EX 5")
	expectAll("$1", "v", ":50", "$1", "v", ":-1", "$1", "v", ":89000", "$-1", "-ERR syntax error")
	send("SET a 1 EXAT 1700000500", "EXPIRETIME a", "SET a 2 GET PX 1000", "PTTL a")
	expectAll("+OK", ":1700000500", "$1", "1", ":1000")

	// In a transaction: the reads see the expiry the transaction wrote.
	send("MULTI", "SET t v EX 100", "TTL t", "PERSIST t", "TTL t", "EXEC")
	expectAll("+OK", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "*4", "+OK", ":100", ":1", ":-1")
	if r, _ := f.Get("t"); r.Expires != 0 {
		t.Fatalf("t expires at %d after PERSIST in its transaction", r.Expires)
	}
	// A counter takes an expiry: its value written with it, and INCR
	// keeps it (the increment counts on the value that expires).
	f.incr("n", 1)
	send("EXPIRE n 5", "TTL n", "GET n")
	expectAll(":1", ":5", "$1", "1")
	if r, _ := f.Get("n"); r.Expires != now()+5e9 {
		t.Fatalf("n expires at %d, want %d", r.Expires, now()+int64(5e9))
	}
}

// FuzzSetOptions: SET's options never panic, and what parses holds
// together: not NX with XX, not KEEPTTL with a time, a time after the
// epoch and, relative, not before now.
func FuzzSetOptions(f *testing.F) {
	for _, s := range []string{"EX 10", "PX 1500 NX GET", "EXAT 1700000000 XX", "PXAT 9223372036854775807", "KEEPTTL GET",
		"EX 9223372036854775807", "EX -1", "EX 5 PX 5", "NX XX", "ex 1 keepttl"} {
		f.Add(s)
	}
	const now = int64(1_700_000_000_000_000_000)
	f.Fuzz(func(t *testing.T, s string) {
		var args [][]byte
		for _, w := range strings.Fields(s) {
			args = append(args, []byte(w))
		}
		o, msg := parseSet(args, func() int64 { return now })
		if msg != "" {
			return
		}
		timed := strings.Contains(strings.ToLower(s), "ex") || strings.Contains(strings.ToLower(s), "px")
		switch {
		case o.nx && o.xx:
			t.Fatalf("%q: NX and XX", s)
		case o.keep && o.expires != 0:
			t.Fatalf("%q: KEEPTTL and a time", s)
		case o.expires < 0:
			t.Fatalf("%q: an expiry of %d", s, o.expires)
		case o.expires != 0 && !timed:
			t.Fatalf("%q: an expiry without a time option", s)
		}
		for _, u := range []string{"ex", "px"} {
			if x, ok := expiryAt(u, []byte(strings.TrimSpace(s)), now); ok && x <= now {
				t.Fatalf("%s %q: %d, not after now", u, s, x)
			}
		}
	})
}
