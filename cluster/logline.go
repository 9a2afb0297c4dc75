package cluster

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// raftLogger passes raft's warnings and errors to the node's log (its
// info lines are every heartbeat's business).
func raftLogger(l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: &lineWriter{l: l, last: map[string]time.Time{}},
		DisableTime: true})
}

// routine are raft's warnings that a healthy cluster logs as a matter of
// course: the first election of a new cluster (or after a leader stops), a
// node waiting to be added to the configuration (readiness says so if it
// lasts), and a follower caught up from older entries. They are logged at INFO: an
// operator's WARN is for something to look at (a healthy start logged
// three; issue 49).
var routine = []string{
	"heartbeat timeout reached, starting election",
	"Election timeout reached, restarting election", // a candidate's retry (ReplicatorNoLeader says when it lasts)
	"no known peers, aborting election",
	"failed to get previous log",
	"appendEntries rejected, sending older logs",
}

// lineWriter logs each line hclog writes. A peer that is down makes raft
// log a failed heartbeat or append every few milliseconds: a line of one
// kind about one peer is logged at most every repeatEvery, with how many
// were left out.
type lineWriter struct {
	l    *slog.Logger
	mu   sync.Mutex
	last map[string]time.Time
	left map[string]int
}

const repeatEvery = 10 * time.Second

func (w *lineWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.Contains(msg, "[ERROR]") {
		level = slog.LevelError
	}
	for _, normal := range routine {
		if strings.Contains(msg, normal) {
			level = slog.LevelInfo
		}
	}
	kind := lineKind(msg)
	w.mu.Lock()
	now := time.Now()
	if t, ok := w.last[kind]; ok && now.Sub(t) < repeatEvery {
		if w.left == nil {
			w.left = map[string]int{}
		}
		w.left[kind]++
		w.mu.Unlock()
		return len(p), nil
	}
	w.last[kind] = now
	left := w.left[kind]
	delete(w.left, kind)
	if len(w.last) > 1000 {
		w.last = map[string]time.Time{}
	}
	w.mu.Unlock()
	// hclog's "[ERROR] raft: what: key=value ..." as one of our lines:
	// the level is the line's level, what it says the message, the rest
	// one attribute.
	_, rest, ok := strings.Cut(msg, "raft: ")
	if !ok {
		rest = msg
	}
	what, detail, _ := strings.Cut(rest, ": ")
	attrs := []any{"component", "raft"}
	if detail != "" {
		attrs = append(attrs, "detail", detail)
	}
	if left > 0 {
		attrs = append(attrs, "repeats_left_out", left)
	}
	w.l.Log(context.Background(), level, "raft: "+what, attrs...)
	return len(p), nil
}

// lineKind is what makes two of raft's lines the same kind: the message
// (hclog writes "[LEVEL]  raft: message: key=value ..."), its level, and
// the peer or target it is about (a quoted value may hold spaces).
func lineKind(line string) string {
	level, rest, _ := strings.Cut(line, "raft: ")
	msg, fields, _ := strings.Cut(rest, ": ")
	kind := strings.TrimSpace(level) + " " + msg
	for _, key := range []string{"peer=", "target=", "server-id=", "id="} {
		i := strings.Index(fields, key)
		if i < 0 || (i > 0 && fields[i-1] != ' ') {
			continue
		}
		v := fields[i+len(key):]
		if strings.HasPrefix(v, `"`) {
			if end := strings.Index(v[1:], `"`); end >= 0 {
				v = v[:end+2]
			}
		} else {
			v, _, _ = strings.Cut(v, " ")
		}
		kind += " " + key + v
		break
	}
	return kind
}
