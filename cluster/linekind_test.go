package cluster

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Lines of different messages, levels or peers are different kinds (one
// kind is logged at most every repeatEvery); the same line with other
// values of its other fields is the same kind.
func TestLineKind(t *testing.T) {
	lines := []string{
		`[WARN]  raft: failed to appendEntries to: peer="{Voter a2 127.0.0.1:7001}" error="dial tcp: refused"`,
		`[WARN]  raft: failed to appendEntries to: peer="{Voter a3 127.0.0.1:7002}" error="dial tcp: refused"`,
		`[WARN]  raft: failed to heartbeat to: peer=127.0.0.1:7001 backoff time=10ms error="EOF"`,
		`[ERROR] raft: failed to commit logs: error="wal: append 7-9: no space left on device"`,
		`[ERROR] raft: failed to take snapshot: error="disk"`,
		`[WARN]  raft: failed to take snapshot: error="disk"`,
		`[WARN]  raft: clearing log suffix: from=10 to=12`,
	}
	seen := map[string]string{}
	for _, l := range lines {
		k := lineKind(l)
		if o, ok := seen[k]; ok {
			t.Errorf("%q and %q are one kind (%q)", o, l, k)
		}
		seen[k] = l
	}
	same := [][2]string{
		{`[WARN]  raft: failed to appendEntries to: peer="{Voter a2 127.0.0.1:7001}" error="dial tcp: refused"`,
			`[WARN]  raft: failed to appendEntries to: peer="{Voter a2 127.0.0.1:7001}" error="i/o timeout"`},
		{`[ERROR] raft: failed to commit logs: error="a"`, `[ERROR] raft: failed to commit logs: error="b"`},
	}
	for _, p := range same {
		if lineKind(p[0]) != lineKind(p[1]) {
			t.Errorf("%q and %q should be one kind: %q vs %q", p[0], p[1], lineKind(p[0]), lineKind(p[1]))
		}
	}
}

// The lines as hclog writes them for raft.
func TestLineKindOfHclogLines(t *testing.T) {
	var buf bytes.Buffer
	l := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: &buf, DisableTime: true})
	kind := func(f func()) string {
		buf.Reset()
		f()
		return lineKind(strings.TrimSpace(buf.String()))
	}
	a2 := raft.Server{Suffrage: raft.Voter, ID: "a2", Address: "127.0.0.1:7001"}
	a3 := raft.Server{Suffrage: raft.Voter, ID: "a3", Address: "127.0.0.1:7002"}
	k1 := kind(func() { l.Error("failed to appendEntries to", "peer", a2, "error", errors.New("refused")) })
	k1b := kind(func() { l.Error("failed to appendEntries to", "peer", a2, "error", errors.New("timeout")) })
	k2 := kind(func() { l.Error("failed to appendEntries to", "peer", a3, "error", errors.New("refused")) })
	k3 := kind(func() { l.Error("failed to commit logs", "error", errors.New("no space")) })
	k4 := kind(func() { l.Warn("failed to commit logs", "error", errors.New("no space")) })
	if k1 != k1b {
		t.Errorf("one peer, one message: %q vs %q", k1, k1b)
	}
	if k1 == k2 || k1 == k3 || k3 == k4 {
		t.Errorf("different lines share a kind: %q %q %q %q", k1, k2, k3, k4)
	}
}
