package cluster

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type records struct {
	mu sync.Mutex
	r  []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.r = append(h.r, r)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// TestRaftLinesOncePerPeer: raft's line about a peer that is down, written
// at every heartbeat, is logged once per kind and peer (the next one, after
// repeatEvery, says how many were left out), as a line of ours: the level
// as the level, not in the message; the key=values as an attribute.
func TestRaftLinesOncePerPeer(t *testing.T) {
	h := &records{}
	w := &lineWriter{l: slog.New(h), last: map[string]time.Time{}}
	line := func(peer string) string {
		return `[ERROR] raft: failed to appendEntries to: peer="{Voter ` + peer + ` 127.0.0.1:7513}" error="dial tcp: connection refused"` + "\n"
	}
	for range 100 {
		w.Write([]byte(line("a3.x")))
	}
	w.Write([]byte(line("a2.y")))
	w.Write([]byte("[WARN]  raft: heartbeat timeout reached, starting election: last-leader-addr= last-leader-id=\n"))
	if len(h.r) != 3 {
		t.Fatalf("%d lines logged for 100 of one kind about one peer, one about another and one warning", len(h.r))
	}
	r := h.r[0]
	if r.Level != slog.LevelError || r.Message != "raft: failed to appendEntries to" {
		t.Fatalf("logged as %s %q", r.Level, r.Message)
	}
	var detail string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "detail" {
			detail = a.Value.String()
		}
		return true
	})
	if !strings.Contains(detail, "a3.x") || !strings.Contains(detail, "connection refused") {
		t.Fatalf("detail %q", detail)
	}
	// A new cluster's first election is routine: INFO, not WARN (issue 49:
	// a healthy start logged nothing an operator should look at, at WARN).
	if h.r[2].Level != slog.LevelInfo || h.r[2].Message != "raft: heartbeat timeout reached, starting election" {
		t.Fatalf("the election logged as %s %q", h.r[2].Level, h.r[2].Message)
	}
	// Past repeatEvery, the next says how many were left out.
	w.mu.Lock()
	for k := range w.last {
		w.last[k] = w.last[k].Add(-repeatEvery)
	}
	w.mu.Unlock()
	w.Write([]byte(line("a3.x")))
	left := int64(-1)
	h.r[3].Attrs(func(a slog.Attr) bool {
		if a.Key == "repeats_left_out" {
			left = a.Value.Int64()
		}
		return true
	})
	if left != 99 {
		t.Fatalf("repeats_left_out %d, want 99", left)
	}
}
