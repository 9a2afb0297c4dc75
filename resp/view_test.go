package resp

import (
	"fmt"
	"strings"
	"testing"

	"github.com/replicator/replicator/api"
)

// sender sends commands (space-separated words) on a connection.
func sender(t *testing.T, addr string) (send func(cmds ...string), expectAll func(want ...string)) {
	nc, br := dial(t, addr)
	send = func(cmds ...string) {
		t.Helper()
		for _, c := range cmds {
			fields := strings.Fields(c)
			fmt.Fprintf(nc, "*%d\r\n", len(fields))
			for _, a := range fields {
				fmt.Fprintf(nc, "$%d\r\n%s\r\n", len(a), a)
			}
		}
	}
	expectAll = func(want ...string) {
		t.Helper()
		for _, w := range want {
			expect(t, br, w)
		}
	}
	return send, expectAll
}

// TestTransactionReadsItsOwnWrites: inside a transaction a read answers
// from what the commands before it wrote; a key set and deleted again in
// one transaction, absent before, writes nothing; a command that fails as
// it runs answers its error in place and the others apply.
func TestTransactionReadsItsOwnWrites(t *testing.T) {
	f := &recordingNode{}
	f.incr("n", 5)
	_, addr := serve(t, f, Options{})
	send, expectAll := sender(t, addr)

	send("MULTI", "SET a 1", "GET a", "APPEND a x", "GET a", "STRLEN a", "DEL a", "EXISTS a", "GET a", "EXEC")
	expectAll("+OK", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED",
		"*8", "+OK", "$1", "1", ":2", "$2", "1x", ":2", ":1", ":0", "$-1")
	if w := f.writes(); len(w) != 0 {
		t.Fatalf("a key absent before, set and deleted in one transaction: %d writes, want none", len(w))
	}

	// INCR inside a transaction reads and writes the value; INCR of a key
	// that holds no integer fails in its place and the others apply.
	f.put("s", "abc")
	sVersion := f.versionLocked("s")
	send("MULTI", "SET x 1", "INCR n", "GET n", "INCR s", "GETSET x 2", "EXEC")
	expectAll("+OK", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED",
		"*5", "+OK", ":6", "$1", "6", "-ERR value is not an integer", "$1", "1")
	// x = 2 and n = 6 (the failed command writes nothing), conditional on
	// the versions of what was read before written: n, and s.
	w := f.writes()
	if len(w) != 1 || len(w[0].Ops) != 2 || w[0].Ops[0].Key != "x" || string(w[0].Ops[0].Value) != "2" ||
		w[0].Ops[1].Key != "n" || string(w[0].Ops[1].Value) != "6" || w[0].Cond == nil {
		t.Fatalf("submitted %+v, want x = 2 and n = 6", w)
	}
	conds := fmt.Sprint(w[0].Cond.Keys)
	if !strings.Contains(conds, "{s "+sVersion+"}") || !strings.Contains(conds, "{n ") || len(w[0].Cond.Keys) != 2 {
		t.Fatalf("conditional on %v, want n's and s's versions as read", conds)
	}
}

func TestWatch(t *testing.T) {
	f := &recordingNode{}
	f.put("w", "0")
	_, addr := serve(t, f, Options{})
	send, expectAll := sender(t, addr)

	send("WATCH w")
	expectAll("+OK")
	f.put("w", "changed")
	send("MULTI", "SET x 1", "EXEC")
	expectAll("+OK", "+QUEUED", "*-1")
	if n := len(f.writes()); n != 0 {
		t.Fatalf("a transaction whose WATCHed key changed submitted %d writes", n)
	}
	// The watch ended with that EXEC: this one commits, conditional on
	// w's version now.
	send("WATCH w", "MULTI", "SET x 2", "EXEC")
	expectAll("+OK", "+OK", "+QUEUED", "*1", "+OK")
	w := f.writes()
	r, _ := f.Get("w")
	if len(w) != 1 || w[0].Cond == nil || len(w[0].Cond.Keys) != 1 || w[0].Cond.Keys[0] != (api.KeyVersion{Key: "w", Version: r.Stamp.String()}) {
		t.Fatalf("submitted %+v, want x conditional on w's version %s", w, r.Stamp)
	}
	// A change between the watch check and the commit: the state machine
	// refuses the write, the next round sees the change: nil.
	send("WATCH w")
	expectAll("+OK")
	f.before = func(f *recordingNode) { f.before = nil; f.put("w", "raced") }
	send("MULTI", "SET x 3", "EXEC")
	expectAll("+OK", "+QUEUED", "*-1")
	if r, _ := f.Get("x"); string(r.Value) != "2" {
		t.Fatalf("x = %q after a transaction whose WATCHed key changed before its commit", r.Value)
	}
	// UNWATCH and DISCARD end a watch; WATCH inside MULTI is refused and
	// does not abort the transaction; an empty transaction whose watched
	// key changed answers nil.
	send("WATCH w", "UNWATCH")
	expectAll("+OK", "+OK")
	f.put("w", "again")
	send("MULTI", "SET x 4", "WATCH w", "EXEC")
	expectAll("+OK", "+QUEUED", "-ERR WATCH inside MULTI is not allowed", "*1", "+OK")
	send("WATCH w", "MULTI", "DISCARD")
	expectAll("+OK", "+OK", "+OK")
	f.put("w", "once more")
	send("MULTI", "EXEC")
	expectAll("+OK", "*0")
	send("WATCH w")
	expectAll("+OK")
	f.put("w", "and again")
	send("MULTI", "EXEC")
	expectAll("+OK", "*-1")
}

// TestTransactionRunsAgainOnContention: a key a transaction read changed
// before its commit (not a WATCHed one): it runs again on what is there
// now, and answers from that.
func TestTransactionRunsAgainOnContention(t *testing.T) {
	f := &recordingNode{}
	f.put("k", "old")
	_, addr := serve(t, f, Options{})
	send, expectAll := sender(t, addr)
	f.before = func(f *recordingNode) { f.before = nil; f.put("k", "new") }
	send("MULTI", "GET k", "APPEND k !", "EXEC")
	expectAll("+OK", "+QUEUED", "+QUEUED", "*2", "$3", "new", ":4")
	if r, _ := f.Get("k"); string(r.Value) != "new!" {
		t.Fatalf("k = %q, want new!", r.Value)
	}
	if n := len(f.writes()); n != 2 {
		t.Fatalf("%d writes submitted, want the refused first round and the second", n)
	}
	// A read-only transaction is not submitted.
	f.put("j", "1")
	send("MULTI", "MGET k j", "EXISTS k j nope", "EXEC")
	expectAll("+OK", "+QUEUED", "+QUEUED", "*2", "*2", "$4", "new!", "$1", "1", ":2")
	if n := len(f.writes()); n != 2 {
		t.Fatalf("a read-only transaction submitted a write (%d)", n)
	}
}

// TestMSETNX: every pair is written when no key holds a value (1), else
// nothing (0); a counter key holds one.
func TestMSETNX(t *testing.T) {
	f := &recordingNode{}
	f.incr("n", 1)
	_, addr := serve(t, f, Options{})
	send, expectAll := sender(t, addr)
	send("MSETNX p 1 q 2", "MSETNX q 3 r 4", "MSETNX s 1 n 2", "MGET p q r s")
	expectAll(":1", ":0", ":0", "*4", "$1", "1", "$1", "2", "$-1", "$-1")
	w := f.writes()
	if len(w) != 1 || len(w[0].Ops) != 2 || w[0].Cond == nil || len(w[0].Cond.Keys) != 2 {
		t.Fatalf("submitted %+v, want one batch of p and q conditional on both being absent", w)
	}
}
