package discovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/replicator/replicator/internal/loopback"
)

func quietDiscovery(t *testing.T, name, bind string, join []string, max int, reap time.Duration) *Discovery {
	t.Helper()
	d, err := Start(Options{NodeName: name, Bind: bind, Join: join, Profile: "local", MaxMembers: max, ReapAfter: reap,
		Meta: MemberMeta{V: GossipVersion, Cluster: "x"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if len(join) > 0 {
		if _, err := d.ml.Join(join); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// The member table is bounded and departed members are reaped (issue 25,
// finding 8: anyone who can send a gossip packet can describe made-up
// members, and 20,000 of them grew a node by 82 MB). Real memberlist nodes
// on loopback.
func TestMemberTableBoundedAndReaped(t *testing.T) {
	addrs, release, err := loopback.Hold(10)
	if err != nil {
		t.Fatal(err)
	}
	release()
	d := quietDiscovery(t, "watcher", addrs[0], nil, 5, 2*time.Second)
	defer d.ml.Shutdown()
	var others []*Discovery
	for i := 1; i < 9; i++ {
		others = append(others, quietDiscovery(t, fmt.Sprintf("m%d", i), addrs[i], []string{addrs[0]}, 0, 0))
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(d.ml.Members()) < 9 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(d.ml.Members()); n < 9 {
		t.Fatalf("memberlist knows %d members, want 9", n)
	}
	if n := len(d.Members()); n != 5 {
		t.Fatalf("the table holds %d members, bounded at 5", n)
	}
	// They leave: shown as departed, then reaped, and room is made.
	for _, o := range others {
		o.Leave(time.Second)
	}
	deadline = time.Now().Add(15 * time.Second)
	for len(d.Members()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if ms := d.Members(); len(ms) != 0 {
		t.Fatalf("departed members not reaped: %+v", ms)
	}
	late := quietDiscovery(t, "late", addrs[9], []string{addrs[0]}, 0, 0)
	defer late.ml.Shutdown()
	deadline = time.Now().Add(10 * time.Second)
	for len(d.Members()) != 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if ms := d.Members(); len(ms) != 1 || ms[0].Node != "late" {
		t.Fatalf("a member joining once room was made: %+v", ms)
	}
}

// TestGossipProfileByAddress: without a profile, a loopback bind address
// gets local timing (a stopped member is dead within seconds, not the WAN
// profile's ~40 s) and any other the WAN's; a given profile is kept.
func TestGossipProfileByAddress(t *testing.T) {
	for _, c := range []struct{ given, host, want string }{
		{"", "127.0.0.1", "local"}, {"", "::1", "local"}, {"", "localhost", "local"},
		{"", "0.0.0.0", "wan"}, {"", "10.0.0.5", "wan"}, {"lan", "127.0.0.1", "lan"}, {"wan", "127.0.0.1", "wan"},
	} {
		if got := GossipProfile(c.given, c.host); got != c.want {
			t.Errorf("GossipProfile(%q, %q) = %q, want %q", c.given, c.host, got, c.want)
		}
	}
}

// levels records the level of each record logged.
type levels struct{ got []slog.Level }

func (h *levels) Enabled(context.Context, slog.Level) bool { return true }
func (h *levels) Handle(_ context.Context, r slog.Record) error {
	h.got = append(h.got, r.Level)
	return nil
}
func (h *levels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levels) WithGroup(string) slog.Handler      { return h }

// TestMemberlistLinesByLevel: memberlist's errors reach the node's log as
// warnings, its chatter as debug, and a send on this node's own socket that
// a clean stop closed as debug too (issue 49: a clean stop logged [ERR]).
func TestMemberlistLinesByLevel(t *testing.T) {
	h := &levels{}
	w := &slogWriter{l: slog.New(h)}
	for _, line := range []string{
		"[ERR] memberlist: Failed to send UDP ping: write udp 127.0.0.1:7613->127.0.0.1:7612: use of closed network connection\n",
		"[ERR] memberlist: Failed to send UDP ping: write udp 127.0.0.1:7613->127.0.0.1:7612: connection refused\n",
		"[DEBUG] memberlist: Stream connection from=127.0.0.1:7611\n",
	} {
		w.Write([]byte(line))
	}
	want := []slog.Level{slog.LevelDebug, slog.LevelWarn, slog.LevelDebug}
	if !slices.Equal(h.got, want) {
		t.Fatalf("levels %v, want %v", h.got, want)
	}
}
