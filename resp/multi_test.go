package resp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// recordingNode records every write submitted to it and keeps what they
// wrote: plain values and counters with versions, conditions decided as
// the state machine decides them (If-Match, If-None-Match, keys' versions,
// a plain write on a counter refused), each write whole or not at all.
type recordingNode struct {
	Node // the rest is not called
	mu   sync.Mutex
	got  []api.Write
	// kv holds each key as the node reads it: a counter as its decimal
	// value (Kind counter).
	kv   map[string]entry.Record
	tick int64
	// before, when set, runs before a write is decided (another client's
	// write coming between a transaction's reads and its commit).
	before func(f *recordingNode)
	// now, when set, is the clock a version's expiry is read against (as
	// the node's); unset, nothing expires.
	now func() int64
}

func (f *recordingNode) liveLocked(r entry.Record) bool {
	return f.now == nil || !r.Expired(f.now())
}

func (f *recordingNode) Get(key string) (entry.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.kv[key]; ok && f.liveLocked(r) {
		return r, nil
	}
	return entry.Record{}, api.ErrNotFound
}

func (f *recordingNode) Counter(key string) (api.CounterResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.kv[key]
	if !ok || !f.liveLocked(r) {
		return api.CounterResult{}, api.ErrNotFound
	}
	n, isInt := entry.ParseInt(r.Value)
	if !isInt {
		return api.CounterResult{}, api.ErrNotInteger
	}
	return api.CounterResult{Key: key, Value: n, Version: r.Stamp.String()}, nil
}

func (f *recordingNode) stampLocked() entry.Stamp {
	f.tick++
	return entry.Stamp{HLC: hlc.Timestamp{Wall: f.tick}, Origin: "a"}
}

// put writes key outside any transaction (another client).
func (f *recordingNode) put(key, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kv == nil {
		f.kv = map[string]entry.Record{}
	}
	f.kv[key] = entry.Record{Stamp: f.stampLocked(), Value: []byte(value)}
}

// incr increments key's counter (as INCR outside a transaction).
func (f *recordingNode) incr(key string, d int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kv == nil {
		f.kv = map[string]entry.Record{}
	}
	r := f.kv[key]
	n, _ := entry.ParseInt(r.Value)
	f.kv[key] = entry.Record{Stamp: f.stampLocked(), Value: []byte(fmt.Sprint(n + d)), Kind: entry.KindCounter, Expires: r.Expires}
}

func (f *recordingNode) versionLocked(key string) string {
	if r, ok := f.kv[key]; ok && f.liveLocked(r) {
		return r.Stamp.String()
	}
	return ""
}

func (f *recordingNode) Submit(_ context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	if f.before != nil {
		f.before(f)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, w)
	err := f.applyLocked(w)
	return func() (api.WriteResult, error) {
		if err != nil {
			return api.WriteResult{}, err
		}
		return api.WriteResult{Key: w.Entry.Key, Stream: entry.StreamID{1}, Index: 1}, nil
	}, false
}

func (f *recordingNode) applyLocked(w api.Write) error {
	ops := w.Ops
	if ops == nil {
		ops = []api.BatchOp{{Key: w.Entry.Key, Value: w.Entry.Value, Delete: w.Entry.Op == entry.OpDelete, Expires: w.Entry.Expires}}
	}
	if c := w.Cond; c != nil {
		cur := f.versionLocked(w.Entry.Key)
		switch {
		case c.IfMatch != "" && c.IfMatch != cur, c.IfNoneMatch && cur != "":
			return &api.PreconditionError{Key: w.Entry.Key, Current: cur}
		}
		for _, kv := range c.Keys {
			if cur := f.versionLocked(kv.Key); cur != kv.Version {
				return &api.PreconditionError{Key: kv.Key, Current: cur}
			}
		}
	}
	if f.kv == nil {
		f.kv = map[string]entry.Record{}
	}
	st := f.stampLocked()
	for _, op := range ops {
		if op.Delete {
			delete(f.kv, op.Key)
		} else {
			f.kv[op.Key] = entry.Record{Stamp: st, Value: op.Value, Expires: op.Expires}
		}
	}
	return nil
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
	send, expectAll := sender(t, addr)

	send("MULTI", "SET a 1", "MSET b 2 c 3", "SET a 4", "MULTI", "EXEC")
	for _, want := range []string{"+OK", "+QUEUED", "+QUEUED", "+QUEUED", "-ERR MULTI calls can not be nested", "*3", "+OK", "+OK", "+OK"} {
		expectAll(want)
	}
	w := f.writes()
	if len(w) != 1 || len(w[0].Ops) != 3 {
		t.Fatalf("submitted %+v, want one batch of three ops (a written twice: its last value)", w)
	}
	var got []string
	for _, op := range w[0].Ops {
		got = append(got, op.Key+"="+string(op.Value))
	}
	if strings.Join(got, " ") != "a=4 b=2 c=3" {
		t.Fatalf("the batch holds %v, want each key's last write, in the order first written", got)
	}

	// Refused while queueing: EXECABORT, nothing submitted.
	for _, refused := range []string{"NOSUCH x", "SET onlykey", "INCRBY n", "LPUSH l a", "SUBSCRIBE ch"} {
		send("MULTI", "SET x 1", refused, "SET y 2", "EXEC")
		expectAll("+OK")
		expectAll("+QUEUED")
		expectAll("-")
		expectAll("+QUEUED")
		expectAll("-EXECABORT")
		if n := len(f.writes()); n != 1 {
			t.Fatalf("after a transaction with %q refused, %d writes submitted, want still 1", refused, n)
		}
	}

	// DISCARD drops it; the control commands without MULTI are errors.
	send("MULTI", "SET z 1", "DISCARD", "EXEC", "DISCARD", "PING")
	for _, want := range []string{"+OK", "+QUEUED", "+OK", "-ERR EXEC without MULTI", "-ERR DISCARD without MULTI", "+PONG"} {
		expectAll(want)
	}
	if n := len(f.writes()); n != 1 {
		t.Fatalf("a discarded transaction submitted: %d writes", n)
	}
	// An empty transaction answers an empty array.
	send("MULTI", "EXEC")
	expectAll("+OK")
	expectAll("*0")
}

// FuzzTransactionQueue: whatever is queued, the server never panics, and
// a transaction with any refused command submits nothing.
func FuzzTransactionQueue(f *testing.F) {
	f.Add("SET a 1\nINCR b\n")
	f.Add("MSET a 1 b\nSET\n")
	f.Add("SET n 5\nINCRBY n -9223372036854775808\nINCRBYFLOAT n 1e308\nINCRBYFLOAT n inf\nDECRBY n 3\n")
	f.Add("SET t v\nEXPIRE t 10 NX GT\nPEXPIREAT t -1\nGETEX t PX 5 PERSIST\nTTL t\n")
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
			cmd, known := lookup([]byte(name))
			ok := known && txnServed[name] && ((cmd.arity > 0 && len(fields) == cmd.arity) || (cmd.arity < 0 && len(fields) >= -cmd.arity))
			refused = refused || !ok
			cmds = append(cmds, args)
		}
		rn := &recordingNode{}
		s := New(rn, Options{})
		c := &conn{s: s, authed: true, state: &connState{}}
		c.run(append(append([][][]byte{{[]byte("MULTI")}}, cmds...), [][]byte{[]byte("EXEC")}))
		n := len(rn.writes())
		if refused && n != 0 || n > 1 {
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
