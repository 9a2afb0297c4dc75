package membership

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replicator/replicator/api"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestNodeIDIsTheDirectorys: minted at the first start (or the one asked
// for), kept after, and a start that names another is refused.
func TestNodeIDIsTheDirectorys(t *testing.T) {
	dir := t.TempDir()
	id, err := ResolveNodeID(dir, "")
	if err != nil || len(id) != 8 {
		t.Fatalf("minted %q: %v", id, err)
	}
	if again, err := ResolveNodeID(dir, ""); err != nil || again != id {
		t.Fatalf("restart: %q %v, want %q", again, err, id)
	}
	if same, err := ResolveNodeID(dir, id); err != nil || same != id {
		t.Fatalf("named its own: %q %v", same, err)
	}
	if _, err := ResolveNodeID(dir, "other"); err == nil || !strings.Contains(err.Error(), "belongs to node "+id) {
		t.Fatalf("another ID: %v", err)
	}
	asked := t.TempDir()
	if got, err := ResolveNodeID(asked, "n1"); err != nil || got != "n1" {
		t.Fatalf("asked for n1: %q %v", got, err)
	}
}

// TestIncarnationOfADirectory: a directory keeps its incarnation across
// restarts; a node of several whose raft state is gone comes back as a new
// one.
func TestIncarnationOfADirectory(t *testing.T) {
	dir := t.TempDir()
	inc, err := MemberIncarnation(dir, false, quiet)
	if err != nil || inc == "" {
		t.Fatalf("%q %v", inc, err)
	}
	if again, err := MemberIncarnation(dir, true, quiet); err != nil || again != inc {
		t.Fatalf("restart with its raft state: %q %v, want %q", again, err, inc)
	}
	fresh, err := MemberIncarnation(dir, false, quiet)
	if err != nil || fresh == inc {
		t.Fatalf("raft state gone: %q %v, want a new incarnation", fresh, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "NODE_ID")); err == nil {
		t.Fatal("the incarnation wrote the node ID")
	}
}

// TestGossipBeforeItStarts: a view that has not joined answers empty (the
// group's reconciliation may ask before Start), and leaving is a no-op.
func TestGossipBeforeItStarts(t *testing.T) {
	var peers []api.Member
	g := New(Deps{Cluster: "a", NodeID: "n1", Logger: quiet, OnPeer: func(m api.Member) { peers = append(peers, m) }})
	if g.Members() != nil || g.SameCluster() != nil {
		t.Fatal("members before gossip started")
	}
	if _, ok := g.Member("n2"); ok {
		t.Fatal("a member before gossip started")
	}
	g.Refresh(func(*api.MemberMeta) { t.Fatal("refreshed without gossip") })
	g.Note("x", true, "")
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	gm := &GroupMembers{Gossip: g, NodeID: "n1"}
	if m := gm.Members(); len(m) != 0 {
		t.Fatalf("the group sees %v before it is open", m)
	}
	// Only members of other clusters are the node's to link to.
	for _, m := range []api.Member{{Meta: api.MemberMeta{Cluster: "a"}}, {Meta: api.MemberMeta{}}, {Meta: api.MemberMeta{Cluster: "b"}, Note: "x"},
		{Node: "b-1", Meta: api.MemberMeta{Cluster: "b"}}} {
		g.onMember(m)
	}
	if len(peers) != 1 || peers[0].Node != "b-1" {
		t.Fatalf("peers told %v", peers)
	}
}
