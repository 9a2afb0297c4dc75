package resp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

// recordingNode records every write submitted to it.
type recordingNode struct {
	Node // the rest is not called
	mu   sync.Mutex
	got  []api.Write
}

func (f *recordingNode) Submit(_ context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	f.mu.Lock()
	f.got = append(f.got, w)
	f.mu.Unlock()
	return func() (api.WriteResult, error) {
		return api.WriteResult{Key: w.Entry.Key, Stream: entry.StreamID{1}, Index: 1}, nil
	}, false
}
func (f *recordingNode) KeptFrom(api.Write, api.WriteResult) []string { return nil }

func (f *recordingNode) writes() []api.Write {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.Write(nil), f.got...)
}

// TestTransactions: MULTI ... EXEC of SET and MSET submits one atomic batch
// of every queued write, in order, and answers each command; a command
// refused while queueing (unknown, wrong arity, not served in a
// transaction) aborts EXEC with EXECABORT and nothing is submitted, as is
// a DISCARDed transaction; EXEC and DISCARD without MULTI and a nested
// MULTI are errors.
func TestTransactions(t *testing.T) {
	f := &recordingNode{}
	_, addr := serve(t, f, Options{})
	nc, br := dial(t, addr)
	send := func(cmds ...string) {
		t.Helper()
		for _, c := range cmds {
			fields := strings.Fields(c)
			fmt.Fprintf(nc, "*%d\r\n", len(fields))
			for _, a := range fields {
				fmt.Fprintf(nc, "$%d\r\n%s\r\n", len(a), a)
			}
		}
	}

	send("MULTI", "SET a 1", "MSET b 2 c 3", "SET a 4", "MULTI", "EXEC")
	for _, want := range []string{"+OK", "+QUEUED", "+QUEUED", "+QUEUED", "-ERR MULTI calls can not be nested", "*3", "+OK", "+OK", "+OK"} {
		expect(t, br, want)
	}
	w := f.writes()
	if len(w) != 1 || len(w[0].Ops) != 4 {
		t.Fatalf("submitted %+v, want one batch of four ops", w)
	}
	var got []string
	for _, op := range w[0].Ops {
		got = append(got, op.Key+"="+string(op.Value))
	}
	if strings.Join(got, " ") != "a=1 b=2 c=3 a=4" {
		t.Fatalf("the batch holds %v, want the queued writes in order", got)
	}

	// Refused while queueing: EXECABORT, nothing submitted.
	for _, refused := range []string{"NOSUCH x", "SET onlykey", "INCR n", "DEL a", "SET a 1 NX", "GET a"} {
		send("MULTI", "SET x 1", refused, "SET y 2", "EXEC")
		expect(t, br, "+OK")
		expect(t, br, "+QUEUED")
		expect(t, br, "-")
		expect(t, br, "+QUEUED")
		expect(t, br, "-EXECABORT")
		if n := len(f.writes()); n != 1 {
			t.Fatalf("after a transaction with %q refused, %d writes submitted, want still 1", refused, n)
		}
	}

	// DISCARD drops it; the control commands without MULTI are errors.
	send("MULTI", "SET z 1", "DISCARD", "EXEC", "DISCARD", "PING")
	for _, want := range []string{"+OK", "+QUEUED", "+OK", "-ERR EXEC without MULTI", "-ERR DISCARD without MULTI", "+PONG"} {
		expect(t, br, want)
	}
	if n := len(f.writes()); n != 1 {
		t.Fatalf("a discarded transaction submitted: %d writes", n)
	}
	// An empty transaction answers an empty array.
	send("MULTI", "EXEC")
	expect(t, br, "+OK")
	expect(t, br, "*0")
}

// FuzzTransactionQueue: whatever is queued, the server never panics, and
// a transaction with any refused command submits nothing.
func FuzzTransactionQueue(f *testing.F) {
	f.Add("SET a 1\nINCR b\n")
	f.Add("MSET a 1 b\nSET\n")
	f.Fuzz(func(t *testing.T, script string) {
		if len(script) > 4096 {
			return
		}
		var cmds [][][]byte
		refused := false
		for _, line := range strings.Split(script, "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			args := make([][]byte, len(fields))
			for i, a := range fields {
				args[i] = []byte(a)
			}
			name := strings.ToLower(fields[0])
			if txnControl[name] {
				continue
			}
			ok := (name == "set" && len(fields) == 3) || (name == "mset" && len(fields) >= 3 && len(fields)%2 == 1)
			refused = refused || !ok
			cmds = append(cmds, args)
		}
		rn := &recordingNode{}
		s := New(rn, Options{})
		c := &conn{s: s, authed: true}
		c.run(append(append([][][]byte{{[]byte("MULTI")}}, cmds...), [][]byte{[]byte("EXEC")}))
		n := len(rn.writes())
		if refused && n != 0 || !refused && len(cmds) > 0 && n != 1 {
			t.Fatalf("%q: %d writes submitted (a command refused: %v)", script, n, refused)
		}
	})
}

// TestUnknownNamesOnlyFromAuthenticatedClients: a client without the token
// cannot name label values of replicator_resp_unknown_commands_total; one
// with it can (up to the bound).
func TestUnknownNamesOnlyFromAuthenticatedClients(t *testing.T) {
	s, addr := serve(t, &recordingNode{}, Options{Token: "s3cret"})
	nc, br := dial(t, addr)
	fmt.Fprint(nc, "NOSUCHA\r\nAUTH s3cret\r\nNOSUCHB\r\n")
	expect(t, br, "-ERR unknown command 'NOSUCHA'")
	expect(t, br, "+OK")
	expect(t, br, "-ERR unknown command 'NOSUCHB'")
	s.stats.unknownMu.Lock()
	defer s.stats.unknownMu.Unlock()
	if _, ok := s.stats.unknownOf["nosucha"]; ok {
		t.Fatal("a client without the token named a label value")
	}
	if _, ok := s.stats.unknownOf["nosuchb"]; !ok {
		t.Fatalf("an authenticated client's unknown command is not counted by name: %v", s.stats.unknownOf)
	}
}
