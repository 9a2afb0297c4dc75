package acceptor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// direct is the acceptor's log in tests: the state machine on st, applied
// in order without raft.
func direct(t testing.TB, st *store.Store, local string) *machine.Direct {
	t.Helper()
	d, err := machine.OpenDirect(st, machine.Options{Cluster: local, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var streamB = entry.StreamID{0xb}

type fixture struct {
	t     *testing.T
	st    *store.Store
	clock *hlc.Clock
	pc    *hlc.ManualClock
	acc   *Acceptor
	srv   *httptest.Server
}

func newFixture(t *testing.T) *fixture {
	st, err := store.Open(t.TempDir(), &store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	clock := hlc.NewClock(pc, 500*time.Millisecond)
	acc := New(st, direct(t, st, "a"), clock, Options{
		Local:        "a",
		Secrets:      map[string]string{"b": "secret-b", "c": "secret-c"},
		MaxBodyBytes: 64 << 10,
		Logger:       quiet,
		TakesMarkers: func() bool { return true },
	})
	srv := httptest.NewServer(acc)
	t.Cleanup(srv.Close)
	return &fixture{t: t, st: st, clock: clock, pc: pc, acc: acc, srv: srv}
}

// entry i of b's stream, stamped near the fixture's clock.
func (f *fixture) entry(i uint64, key, value string) entry.Entry {
	ts := hlc.Timestamp{Wall: f.pc.Now() - int64(time.Minute) + int64(i)}
	e := entry.Entry{Index: i, Origin: "b", Stream: streamB, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: key, Value: []byte(value)}
	if value == "" {
		e.Op, e.Value = entry.OpDelete, nil
	}
	return e
}

func (f *fixture) post(body []byte, hdr ...string) (int, map[string]any) {
	f.t.Helper()
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/replicate", bytes.NewReader(body))
	req.Header.Set("Content-Type", wire.ContentType)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil {
		f.t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

func (f *fixture) postBatch(entries ...entry.Entry) (int, map[string]any) {
	body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: entries})
	return f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b")
}

func (f *fixture) digest() store.Digest {
	d, err := f.st.Digest()
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// TestDedupStateMachine drives one stream through the cases the acceptor
// must tell apart, checking each ack and the stored state.
func TestDedupStateMachine(t *testing.T) {
	f := newFixture(t)
	type step struct {
		name        string
		idx         []uint64
		status      int
		applied     int
		duplicates  int
		hwm         uint64
		wantKeys    int
		wantApplied uint64 // cumulative Counts.Applied+Stale for b
	}
	steps := []step{
		{"first batch", []uint64{1, 2, 3}, 200, 3, 0, 3, 3, 3},
		{"exact resend", []uint64{1, 2, 3}, 200, 0, 3, 3, 3, 3},
		{"overlap", []uint64{2, 3, 4, 5}, 200, 2, 2, 5, 5, 5},
		{"gap", []uint64{7, 8}, 409, 0, 0, 5, 5, 5},
		{"continue", []uint64{6, 7}, 200, 2, 0, 7, 7, 7},
		{"old duplicate", []uint64{1}, 200, 0, 1, 7, 7, 7},
	}
	for _, s := range steps {
		var ents []entry.Entry
		for _, i := range s.idx {
			ents = append(ents, f.entry(i, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)))
		}
		status, ack := f.postBatch(ents...)
		if status != s.status {
			t.Fatalf("%s: status %d %v", s.name, status, ack)
		}
		if status == 200 {
			if int(ack["applied"].(float64)) != s.applied || int(ack["duplicates"].(float64)) != s.duplicates || uint64(ack["hwm"].(float64)) != s.hwm {
				t.Fatalf("%s: ack %v", s.name, ack)
			}
		} else {
			e := ack["error"].(map[string]any)
			if e["code"] != "gap" || uint64(e["hwm"].(float64)) != s.hwm {
				t.Fatalf("%s: refusal %v", s.name, ack)
			}
		}
		if d := f.digest(); d.Keys != s.wantKeys {
			t.Fatalf("%s: %d keys stored, want %d", s.name, d.Keys, s.wantKeys)
		}
		c := f.acc.Counts()["b"]
		if c.Applied+c.Stale != s.wantApplied {
			t.Fatalf("%s: applied count %d, want %d (every WAL identity exactly once)", s.name, c.Applied+c.Stale, s.wantApplied)
		}
	}
}

// TestContentDuplicateAndLWW: an entry of a new index whose stamp equals
// what the key holds is a duplicate; an older stamp is stale.
func TestContentDuplicateAndLWW(t *testing.T) {
	f := newFixture(t)
	e1 := f.entry(1, "k", "v")
	f.postBatch(e1)
	e2 := e1
	e2.Index = 2 // a retry of the same write under a pinned stamp
	_, ack := f.postBatch(e2)
	if ack["duplicates"].(float64) != 1 {
		t.Fatalf("content duplicate not counted: %v", ack)
	}
	e3 := f.entry(3, "k", "older")
	e3.Commit.Wall -= int64(time.Hour) // older stamp: loses LWW
	e3.Stamp = e3.Commit
	f.postBatch(e3)
	r, _ := f.st.Get("k")
	if string(r.Value) != "v" {
		t.Fatalf("older stamp overwrote: %q", r.Value)
	}
	if c := f.acc.Counts()["b"]; c.Applied != 1 || c.Stale != 1 || c.Duplicates != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// TestBadInput: every refusal answers its status with a JSON error, applies
// nothing, and the acceptor still takes a good batch afterwards.
func TestBadInput(t *testing.T) {
	f := newFixture(t)
	good := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{f.entry(1, "k", "v")}})
	future := f.entry(1, "k", "v")
	future.Commit.Wall = f.pc.Now() + int64(time.Second)
	future.Stamp = future.Commit
	spoofed := f.entry(1, "k", "v")
	spoofed.Origin = "c"
	ownOrigin := f.entry(1, "k", "v")
	ownOrigin.Origin = "a"
	batchC := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "c", Stream: streamB}, Entries: []entry.Entry{f.entry(1, "k", "v")}})
	v2 := bytes.Replace(good, []byte{0xa1, 'v', 0x01}, []byte{0xa1, 'v', 0x02}, 1)
	auth := []string{"X-Replicator-Origin", "b", "Authorization", "Bearer secret-b"}
	zstdAuth := append([]string{"Content-Encoding", "zstd"}, auth...)
	bomb, _ := wire.Compress(nil, make([]byte, 4<<20)) // 4 MiB decoded, a few hundred bytes sent, bound 64 KiB
	zgood, _ := wire.Compress(nil, good)
	tests := []struct {
		name   string
		body   []byte
		hdr    []string
		status int
		code   string
	}{
		{"no credential", good, []string{"X-Replicator-Origin", "b"}, 401, "unauthenticated"},
		{"wrong secret", good, []string{"X-Replicator-Origin", "b", "Authorization", "Bearer nope"}, 401, "unauthenticated"},
		{"no origin header", good, []string{"Authorization", "Bearer secret-b"}, 401, "unauthenticated"},
		{"unknown sender", good, []string{"X-Replicator-Origin", "z", "Authorization", "Bearer secret-b"}, 401, "unauthenticated"},
		{"b's secret claiming c", good, []string{"X-Replicator-Origin", "c", "Authorization", "Bearer secret-b"}, 401, "unauthenticated"},
		{"body claims another sender", batchC, auth, 403, "forbidden"},
		{"entry of another origin", wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{spoofed}}), auth, 403, "forbidden"},
		{"malformed msgpack", []byte{0xc1, 0x00, 0xff}, auth, 400, "bad_batch"},
		{"empty body", []byte{}, auth, 400, "bad_batch"},
		{"truncated batch", good[:len(good)-3], auth, 400, "bad_batch"},
		{"unknown version", v2, auth, 400, "unsupported_version"},
		{"oversize", bytes.Repeat([]byte{0}, 65<<10), auth, 413, "too_large"},
		{"compressed bomb", bomb, zstdAuth, 413, "too_large"},
		{"corrupt zstd", zgood[:len(zgood)/2], zstdAuth, 400, "bad_batch"},
		{"an encoding not decoded here", good, append([]string{"Content-Encoding", "br"}, auth...), 415, "unsupported_encoding"},
		{"far-future stamp", wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{future}}), auth, 400, "clock_offset"},
		{"far-future re-seed begin", wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: entry.StreamID{0x55}, Snapshot: true,
			Begin: &wire.SnapshotEnd{Stream: streamB, Index: 9, Commit: future.Commit}}}), auth, 400, "clock_offset"},
		{"far-future backfill horizon", wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: entry.StreamID{0x56}, Snapshot: true, Backfill: true,
			BackfillEnd: &wire.BackfillEnd{Horizon: future.Commit, Spans: []entry.Span{{Start: "k"}}}}}), auth, 400, "clock_offset"},
	}
	before := f.digest()
	for _, tc := range tests {
		status, out := f.post(tc.body, tc.hdr...)
		e, _ := out["error"].(map[string]any)
		if status != tc.status || e == nil || e["code"] != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.name, status, out, tc.status, tc.code)
		}
		if tc.code == "unsupported_version" && !strings.Contains(e["message"].(string), "version 1") {
			t.Errorf("version refusal does not name the supported version: %v", e["message"])
		}
		if d := f.digest(); d != before {
			t.Fatalf("%s: state changed: %+v -> %+v", tc.name, before, d)
		}
	}
	// chunked oversize: no Content-Length to refuse early
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/replicate", io.MultiReader(bytes.NewReader(make([]byte, 65<<10))))
	req.Header.Set("X-Replicator-Origin", "b")
	req.Header.Set("Authorization", "Bearer secret-b")
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 413 {
		t.Fatalf("chunked oversize: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	// own-origin entries are dropped, not applied
	status, ack := f.postBatch(ownOrigin)
	if status != 200 || ack["applied"].(float64) != 0 || f.digest() != before {
		t.Fatalf("own-origin entry: %d %v", status, ack)
	}
	// and the acceptor still works
	status, ack = f.post(good, auth...)
	if status != 200 || ack["applied"].(float64) != 1 {
		t.Fatalf("good batch after bad input: %d %v", status, ack)
	}
}

// TestCompressedBatch: a batch compressed with zstd applies exactly as the
// same batch plain; every answer, a refusal's too, says which encodings
// this node decodes.
func TestCompressedBatch(t *testing.T) {
	f := newFixture(t)
	body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB},
		Entries: []entry.Entry{f.entry(1, "k1", "v1"), f.entry(2, "k2", "v2")}})
	z, err := wire.Compress(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	status, ack := f.post(z, "Content-Encoding", "zstd", "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b")
	if status != 200 || ack["applied"].(float64) != 2 || ack["hwm"].(float64) != 2 {
		t.Fatalf("a compressed batch: %d %v", status, ack)
	}
	// Redelivered plain: a duplicate, as for any resend.
	status, ack = f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b")
	if status != 200 || ack["applied"].(float64) != 0 {
		t.Fatalf("the same batch again, plain: %d %v", status, ack)
	}
	for _, hdr := range [][]string{{"X-Replicator-Origin", "b", "Authorization", "Bearer secret-b"}, {"X-Replicator-Origin", "b"}} {
		req, _ := http.NewRequest("POST", f.srv.URL+"/v1/replicate", bytes.NewReader(body))
		for i := 0; i < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get(wire.HeaderAcceptEncoding); got != "zstd" {
			t.Fatalf("answer %d says it decodes %q", resp.StatusCode, got)
		}
	}
}

func TestClockObservedFromBatch(t *testing.T) {
	f := newFixture(t)
	e := f.entry(1, "k", "v")
	e.Commit.Wall = f.pc.Now() + int64(400*time.Millisecond) // ahead, within max offset
	e.Stamp = e.Commit
	if status, ack := f.postBatch(e); status != 200 {
		t.Fatalf("%d %v", status, ack)
	}
	if n := f.clock.Now(); !e.Commit.Less(n) {
		t.Fatalf("local clock %s not above an applied remote stamp %s", n, e.Commit)
	}
}

func FuzzApply(f *testing.F) {
	f.Add(wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{
		{Index: 1, Origin: "b", Stream: streamB, Commit: hlc.Timestamp{Wall: 5}, Op: entry.OpSet, Key: "k", Value: []byte("v")}}}))
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := wire.DecodeBatch(body)
		if err != nil {
			return
		}
		st, err := store.Open(t.TempDir(), &store.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		clock := hlc.NewClock(hlc.NewManualClock(10), time.Hour)
		acc := New(st, direct(t, st, "a"), clock, Options{Local: "a", Secrets: map[string]string{b.Sender: "s"}, Logger: quiet})
		// Whatever decodes either applies or is refused; it never panics,
		// and a second delivery applies nothing new.
		ack1, err := acc.Apply(b.Sender, b)
		if err != nil {
			return
		}
		ack2, err := acc.Apply(b.Sender, b)
		if err != nil {
			t.Fatalf("redelivery of an accepted batch refused: %v", err)
		}
		if ack2.Applied != 0 || ack2.HWM != ack1.HWM {
			t.Fatalf("redelivery applied again: %+v after %+v", ack2, ack1)
		}
	})
}

// TestSnapshotTrust: what a peer credential may do with a snapshot batch is
// relay writes of the clusters of the mesh, in a one-off stream, within a
// bounded number of streams. It may not bring back this node's own writes
// unasked, write under a cluster this node does not know, write into one of
// its real streams, or grow this node's state by inventing streams.
func TestSnapshotTrust(t *testing.T) {
	f := newFixture(t)
	f.acc.opts.MaxStreams = 3
	snap := entry.StreamID{0x5}
	ts := hlc.Timestamp{Wall: f.pc.Now() - int64(time.Minute)}
	ent := func(i uint64, key, author string) entry.Entry {
		e := entry.Entry{Index: i, Origin: "b", Stream: snap, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: key, Value: []byte(author)}
		if author != "b" {
			e.StampOrigin = author
		}
		return e
	}
	post := func(stream entry.StreamID, ents ...entry.Entry) (int, map[string]any) {
		for i := range ents {
			ents[i].Stream = stream
		}
		body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: stream, Snapshot: true}, Entries: ents})
		return f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b")
	}
	if st, out := post(snap, ent(1, "from-b", "b"), ent(2, "from-c", "c"), ent(3, "mine", "a"), ent(4, "from-z", "z")); st != 200 {
		t.Fatalf("snapshot batch: %d %v", st, out)
	}
	for key, want := range map[string]bool{"from-b": true, "from-c": true, "mine": false, "from-z": false} {
		_, err := f.st.Get(key)
		if (err == nil) != want {
			t.Errorf("%s applied: %v, want %v", key, err == nil, want)
		}
	}
	if c := f.acc.Counts()["b"]; c.DroppedOwn != 1 || c.DroppedUnknown != 1 {
		t.Errorf("counts %+v: want one own write and one of an unknown cluster dropped", c)
	}
	// b's real stream, as a snapshot: refused.
	if st, _ := f.postBatch(f.entry(1, "k", "v")); st != 200 {
		t.Fatal(st)
	}
	if st, out := post(streamB, ent(2, "inject", "b")); st != 403 {
		t.Fatalf("a snapshot into b's real stream: %d %v", st, out)
	}
	// A new snapshot stream forgets the one b abandoned (a sender sends
	// one re-seed at a time), and its mark.
	if st, _ := post(entry.StreamID{0x6}, ent(1, "s3", "b")); st != 200 {
		t.Fatal(st)
	}
	if h, err := f.st.HWM("b", snap); err != nil || h.Index != 0 {
		t.Fatalf("the abandoned snapshot stream's mark: %+v %v", h, err)
	}
	// Streams of b: streamB and 0x6; a third, then no more.
	live := func(stream entry.StreamID) (int, map[string]any) {
		e := f.entry(1, "live", "v")
		e.Stream = stream
		body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: stream}, Entries: []entry.Entry{e}})
		return f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b")
	}
	if st, out := live(entry.StreamID{0x7}); st != 200 {
		t.Fatal(st, out)
	}
	if st, out := live(entry.StreamID{0x8}); st != 403 {
		t.Fatalf("a fourth stream past the bound of 3: %d %v", st, out)
	}
}

// TestTrailerMarks: a re-seed's trailer raises the receiver's marks of other
// known clusters' streams to the sender's (the snapshot carried their
// effects), never of its own streams or of clusters it does not know.
func TestTrailerMarks(t *testing.T) {
	f := newFixture(t)
	snap := entry.StreamID{0x5}
	ts := hlc.Timestamp{Wall: f.pc.Now() - int64(time.Minute)}
	sc, sa, sz := entry.StreamID{0xc}, entry.StreamID{0xa}, entry.StreamID{0xf}
	body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: snap, Snapshot: true,
		End: &wire.SnapshotEnd{Stream: streamB, Index: 3, Commit: ts},
		Marks: []wire.Mark{
			{Origin: "c", Stream: sc, Index: 40, Commit: ts},
			{Origin: "a", Stream: sa, Index: 9, Commit: ts},
			{Origin: "zz", Stream: sz, Index: 9, Commit: ts},
		}}})
	if st, out := f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b"); st != 200 {
		t.Fatalf("trailer: %d %v", st, out)
	}
	hs, err := f.st.HWMs()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]entry.HWM{}
	for _, h := range hs {
		got[h.Origin] = h
	}
	if c := got["c"]; c.Stream != sc || c.Index != 40 || c.Seeded != 40 || c.Commit != ts {
		t.Errorf("c's mark: %+v", c)
	}
	if b := got["b"]; b.Stream != streamB || b.Index != 3 {
		t.Errorf("b's own stream at the trailer: %+v", b)
	}
	if _, ok := got["a"]; ok {
		t.Error("a mark of the receiver's own stream was taken")
	}
	if _, ok := got["zz"]; ok {
		t.Error("a mark of an unknown cluster was taken")
	}
}

// TestLagStages: an entry's lag is split at the sender's X-Replicator-Sent
// and at the body's arrival; a batch without it (an older sender) or with a
// garbled one still counts its total lag, with no stages.
func TestLagStages(t *testing.T) {
	f := newFixture(t)
	var got []Lag
	f.acc.opts.Now = f.pc.Now
	f.acc.opts.ObserveLag = func(origin string, lags []Lag) {
		if origin != "b" {
			t.Errorf("lag attributed to %q", origin)
		}
		got = append(got, lags...)
	}
	e := f.entry(1, "k1", "v")
	now := e.Commit.Wall + int64(10*time.Millisecond)
	f.pc.Set(now)
	body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{e}})
	sent := e.Commit.Wall + int64(3*time.Millisecond)
	if st, out := f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b",
		wire.HeaderSent, fmt.Sprint(sent)); st != 200 {
		t.Fatalf("%d %v", st, out)
	}
	want := Lag{Total: 10 * time.Millisecond, Ship: 3 * time.Millisecond, Wire: 7 * time.Millisecond, Apply: 0, Staged: true}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("lag %+v, want %+v", got, want)
	}
	for i, hdr := range []string{"", "yesterday"} {
		got = nil
		e := f.entry(uint64(2+i), "k", "v")
		f.pc.Set(e.Commit.Wall + int64(4*time.Millisecond))
		body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{e}})
		if st, out := f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b", wire.HeaderSent, hdr); st != 200 {
			t.Fatalf("%d %v", st, out)
		}
		if len(got) != 1 || got[0] != (Lag{Total: 4 * time.Millisecond}) {
			t.Fatalf("sent header %q: lag %+v, want the total only", hdr, got)
		}
	}
}

// slowBody holds its second half until release is closed.
type slowBody struct {
	first, rest []byte
	release     chan struct{}
	sentFirst   chan struct{}
}

func (b *slowBody) Read(p []byte) (int, error) {
	if len(b.first) > 0 {
		n := copy(p, b.first)
		b.first = b.first[n:]
		if len(b.first) == 0 {
			close(b.sentFirst)
		}
		return n, nil
	}
	<-b.release
	if len(b.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

// TestLaterBatchWaitsForEarlier: a sender keeps two batches of a stream on
// the wire. The second reaches the apply while the first is still being
// read: it waits for the first (which arrived before it) instead of being
// refused as a gap, and both apply in order. A gap with nothing before it
// is still refused at once.
func TestLaterBatchWaitsForEarlier(t *testing.T) {
	f := newFixture(t)
	var first, second []entry.Entry
	for i := uint64(1); i <= 10; i++ {
		first = append(first, f.entry(i, fmt.Sprint("k", i%4), fmt.Sprint("v", i)))
	}
	for i := uint64(11); i <= 20; i++ {
		second = append(second, f.entry(i, fmt.Sprint("k", i%4), fmt.Sprint("v", i)))
	}
	b1 := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: first})
	body := &slowBody{first: b1[:len(b1)/2], rest: b1[len(b1)/2:], release: make(chan struct{}), sentFirst: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(body.release) }) }
	defer release() // a failing test must not leave the first request hanging
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/replicate", body)
	req.ContentLength = int64(len(b1))
	req.Header.Set("Content-Type", wire.ContentType)
	req.Header.Set("X-Replicator-Origin", "b")
	req.Header.Set("Authorization", "Bearer secret-b")
	firstDone := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			firstDone <- 0
			return
		}
		resp.Body.Close()
		firstDone <- resp.StatusCode
	}()
	<-body.sentFirst // the first batch has arrived and is being read
	secondDone := make(chan int, 1)
	secondApply := make(chan float64, 1)
	go func() {
		code, out := f.postBatch(second...)
		us, _ := out["apply_us"].(float64)
		secondApply <- us
		secondDone <- code
	}()
	select {
	case code := <-secondDone:
		t.Fatalf("the second batch was answered (%d) before the first was even read", code)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	if c1, c2 := <-firstDone, <-secondDone; c1 != 200 || c2 != 200 {
		t.Fatalf("answers %d and %d, want 200 and 200", c1, c2)
	}
	// The second waited 200 ms for the first; its apply time (which opens
	// a sender's window) is its own apply's, not that wait.
	if us := <-secondApply; us <= 0 || us >= 150_000 {
		t.Fatalf("the waiting batch's ack says apply_us %.0f", us)
	}
	hb := f.st.NewBatch()
	h, err := hb.HWM("b", streamB)
	hb.Close()
	if err != nil || h.Index != 20 || h.Merged != 20 {
		t.Fatalf("hwm %+v %v, want 20 merged", h, err)
	}
	if g := f.acc.Refusals()["gap"]; g != 0 {
		t.Fatalf("%d gaps refused", g)
	}
	// The later batch arrives first, on its own (two connections): it
	// waits for the one before it to arrive and apply.
	var third, fourth []entry.Entry
	for i := uint64(21); i <= 30; i++ {
		third = append(third, f.entry(i, fmt.Sprint("k", i%4), fmt.Sprint("v", i)))
	}
	for i := uint64(31); i <= 40; i++ {
		fourth = append(fourth, f.entry(i, fmt.Sprint("k", i%4), fmt.Sprint("v", i)))
	}
	go func() {
		code, _ := f.postBatch(fourth...)
		secondDone <- code
	}()
	time.Sleep(5 * time.Millisecond) // within the grace a gap waits for
	if c3, c4 := func() int { c, _ := f.postBatch(third...); return c }(), <-secondDone; c3 != 200 || c4 != 200 {
		t.Fatalf("batches sent out of order: answers %d and %d, want 200 and 200", c3, c4)
	}
	hb = f.st.NewBatch()
	h, _ = hb.HWM("b", streamB)
	hb.Close()
	if h.Index != 40 || h.Merged != 40 {
		t.Fatalf("hwm %+v, want 40 merged", h)
	}
	// A real gap, with nothing of b's in progress, is refused.
	if code, out := f.postBatch(f.entry(50, "k", "v")); code != 409 {
		t.Fatalf("a gap: %d %v", code, out)
	}
}

// TestGapWaitersDoNotHoldEachOther: two batches of a sender that both find
// a gap (the receiver lost what came before them) are refused after the
// short grace, not after PermitWait: waiting batches do not count as
// requests that could fill the gap.
func TestGapWaitersDoNotHoldEachOther(t *testing.T) {
	f := newFixture(t)
	acc := New(f.st, direct(t, f.st, "a"), f.clock, Options{Local: "a", Secrets: map[string]string{"b": "secret-b"}, PermitWait: time.Hour, Logger: quiet})
	srv := httptest.NewServer(acc)
	defer srv.Close()
	client := &http.Client{Timeout: 30 * time.Second} // far below PermitWait
	codes := make(chan int, 2)
	for _, first := range []uint64{100, 110} {
		var ents []entry.Entry
		for i := first; i < first+10; i++ {
			ents = append(ents, f.entry(i, fmt.Sprint("k", i), "v"))
		}
		body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: ents})
		go func() {
			req, _ := http.NewRequest("POST", srv.URL+"/v1/replicate", bytes.NewReader(body))
			req.Header.Set("Content-Type", wire.ContentType)
			req.Header.Set("X-Replicator-Origin", "b")
			req.Header.Set("Authorization", "Bearer secret-b")
			resp, err := client.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for i := 0; i < 2; i++ {
		if c := <-codes; c != http.StatusConflict {
			t.Fatalf("a batch beyond the receiver's mark: %d, want 409 (0: still waiting after 30 s)", c)
		}
	}
}

// TestBeginRefusedBeforeFormat3: a cluster whose log does not take
// markers yet (a node of it runs an older build) refuses a re-seed's
// begin and a backfill, and moves no mark.
func TestBeginRefusedBeforeFormat3(t *testing.T) {
	f := newFixture(t)
	f.acc.opts.TakesMarkers = func() bool { return false }
	ts := hlc.Timestamp{Wall: f.pc.Now() - int64(time.Minute)}
	snap := entry.StreamID{0x5}
	e := entry.Entry{Index: 1, Origin: "b", Stream: snap, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "k", Value: []byte("v")}
	for name, h := range map[string]wire.Header{
		"begin":    {Sender: "b", Stream: snap, Snapshot: true, Begin: &wire.SnapshotEnd{Stream: streamB, Index: 9, Commit: ts}},
		"backfill": {Sender: "b", Stream: snap, Snapshot: true, Backfill: true},
	} {
		body := wire.EncodeBatch(&wire.Batch{Header: h, Entries: []entry.Entry{e}})
		if st, out := f.post(body, "X-Replicator-Origin", "b", "Authorization", "Bearer secret-b"); st != 400 {
			t.Errorf("a %s to a cluster before format 3: %d %v", name, st, out)
		}
	}
	if h, err := f.st.HWM("b", streamB); err != nil || h.Index != 0 {
		t.Fatalf("b's mark moved: %+v %v", h, err)
	}
	if _, err := f.st.Get("k"); err == nil {
		t.Fatal("a refused batch applied its key")
	}
}

// TestTreeAnswersBounded: a sender has at most MaxTreeAnswersOf tree
// requests answered at once, and all senders MaxTreeAnswers; one past its
// share is refused with 429 tree_busy (JSON, retryable), another sender is
// still answered, and a slot freed is taken again.
func TestTreeAnswersBounded(t *testing.T) {
	f := newFixture(t)
	f.acc.SetPeer("d", "secret-d")
	f.acc.SetPeer("e", "secret-e")
	hold := make(chan struct{})
	in := make(chan string, 16)
	mux := http.NewServeMux()
	mux.HandleFunc(wire.PathTree, func(w http.ResponseWriter, r *http.Request) {
		f.acc.ServeTree(w, r, func(_ context.Context, sender string, _ *wire.TreeRequest) (*wire.TreeAnswer, error) {
			in <- sender
			<-hold
			return &wire.TreeAnswer{Protocol: 1}, nil
		})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	body, _ := wire.EncodeTree(&wire.TreeRequest{Protocol: 1, Op: wire.TreeSums, Nodes: []int{0}})
	ask := func(sender string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+wire.PathTree, bytes.NewReader(body))
		req.Header.Set("Content-Type", wire.ContentType)
		req.Header.Set(wire.HeaderOrigin, sender)
		req.Header.Set("Authorization", "Bearer secret-"+sender)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	results := make(chan int, 16)
	held := func(sender string) {
		go func() { code, _ := ask(sender); results <- code }()
		if got := <-in; got != sender {
			t.Fatalf("answering %s, want %s", got, sender)
		}
	}
	held("b")
	held("b")
	if code, b := ask("b"); code != http.StatusTooManyRequests || !strings.Contains(b, `"tree_busy"`) || !strings.Contains(b, `"retryable":true`) {
		t.Fatalf("b's third request at once: %d %s", code, b)
	}
	held("c")
	held("d")
	if code, b := ask("e"); code != http.StatusTooManyRequests {
		t.Fatalf("a fifth request at once: %d %s", code, b)
	}
	close(hold)
	for i := 0; i < 4; i++ {
		if code := <-results; code != http.StatusOK {
			t.Fatalf("a held request answered %d", code)
		}
	}
	if code, b := ask("b"); code != http.StatusOK {
		t.Fatalf("after the others ended: %d %s", code, b)
	}
}

// TestRefusalLogsBounded (issue 46, 10): a sender refused again and again
// logs one line per 10 s, which says how many went unlogged.
func TestRefusalLogsBounded(t *testing.T) {
	var l refusalLogs
	logged := 0
	for i := 0; i < 1000; i++ {
		if _, ok := l.allow("b", int64(i)*int64(time.Millisecond)); ok {
			logged++
		}
	}
	if logged != 1 {
		t.Fatalf("%d lines for 1000 refusals in a second, want 1", logged)
	}
	if n, ok := l.allow("b", int64(11*time.Second)); !ok || n != 999 {
		t.Fatalf("after 11 s: logged %v, unlogged %d; want a line saying 999", ok, n)
	}
	if _, ok := l.allow("c", int64(11*time.Second)); !ok {
		t.Fatal("another sender's first refusal was not logged")
	}
}

// TestOnlyTheLeaderAnswersTrees (issue 46, 7): a follower refuses a peer's
// tree request as it refuses a batch (503 not_leader, naming the leader):
// a peer's requests meet one pace for the whole cluster.
func TestOnlyTheLeaderAnswersTrees(t *testing.T) {
	st, err := store.Open(t.TempDir(), &store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clock := hlc.NewClock(hlc.NewManualClock(int64(1000*time.Hour)), 500*time.Millisecond)
	answered := 0
	acc := New(st, direct(t, st, "a"), clock, Options{
		Local: "a", Secrets: map[string]string{"b": "secret-b"}, MaxBodyBytes: 64 << 10, Logger: quiet,
		TakesMarkers: func() bool { return true },
		Leadership:   func() (bool, string, []string) { return false, "http://a1:7400", nil },
		Tree: func(context.Context, string, *wire.TreeRequest) (*wire.TreeAnswer, error) {
			answered++
			return &wire.TreeAnswer{Protocol: 1}, nil
		},
	})
	srv := httptest.NewServer(acc)
	t.Cleanup(srv.Close)
	body, _ := wire.EncodeTree(&wire.TreeRequest{Protocol: 1, Op: wire.TreeSums, Nodes: []int{0}})
	req, _ := http.NewRequest("POST", srv.URL+wire.PathTree, bytes.NewReader(body))
	req.Header.Set("Content-Type", wire.ContentType)
	req.Header.Set(wire.HeaderOrigin, "b")
	req.Header.Set("Authorization", "Bearer secret-b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "not_leader") || answered != 0 {
		t.Fatalf("a follower's answer to a tree request: %d %s (answered %d)", resp.StatusCode, b, answered)
	}
}

// TestExpiryRefusedBeforeFormat11: an entry that expires, to a cluster
// whose log does not keep expiry yet, is refused with its batch (nothing
// applied, the mark unmoved), not applied without it; the acks say whether
// the cluster keeps expiry.
func TestExpiryRefusedBeforeFormat11(t *testing.T) {
	f := newFixture(t)
	e := f.entry(1, "k", "v")
	e.Expires = f.pc.Now() + int64(time.Hour)
	if st, out := f.postBatch(f.entry(1, "plain", "v")); st != 200 || f.acc.Limits().Expiry {
		t.Fatalf("a plain entry: %d %v; limits say expiry %v", st, out, f.acc.Limits().Expiry)
	}
	e.Index = 2
	if st, out := f.postBatch(e); st != 400 {
		t.Fatalf("an entry that expires, before format 11: %d %v", st, out)
	}
	if h, err := f.st.HWM("b", streamB); err != nil || h.Index != 1 {
		t.Fatalf("b's mark: %+v %v, want 1", h, err)
	}
	f.acc.opts.TakesExpiry = func() bool { return true }
	if st, out := f.postBatch(e); st != 200 || !f.acc.Limits().Expiry {
		t.Fatalf("from format 11: %d %v", st, out)
	}
	if r, err := f.st.Get("k"); err != nil || r.Expires != e.Expires {
		t.Fatalf("k: %+v %v", r, err)
	}
}
