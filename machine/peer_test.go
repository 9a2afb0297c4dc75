package machine

import (
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/secret"
)

// TestPeerAddedAndRemovedThroughTheLog: a peer added at run time is state
// of the log (URLs, its secret sealed, where it was added), read back after
// a reopen; an add retried changes nothing; a removal forgets the link's
// cursor (the stream is no longer kept for it) and keeps the peer's marks;
// added again, it begins without a cursor.
func TestPeerAddedAndRemovedThroughTheLog(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	key := make([]byte, secret.KeySize)
	sealed, err := secret.Seal(key, "c", "link-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatRuntimePeers}})
	add := &Command{Peer: &PeerCmd{Name: "c", URLs: []string{"http://c1:7400", "http://c2:7400"}, Secret: sealed}}
	if res := mustApply(t, m, 3, add); !res.Swapped {
		t.Fatal("the add changed nothing")
	}
	if res := mustApply(t, m, 4, add); res.Swapped {
		t.Fatal("a retried add changed the peer")
	}
	mustApply(t, m, 5, &Command{Cursor: &CursorCmd{Peer: "c", At: entry.Cursor{Stream: testStream, Index: 0}}})
	rp := m.Link("c").Runtime
	if rp == nil || len(rp.URLs) != 2 || rp.Added != 3 {
		t.Fatalf("the peer in the log: %+v", rp)
	}
	if got, err := secret.Open(key, "c", rp.Secret); err != nil || got != "link-secret-0123456789" {
		t.Fatalf("the sealed secret: %q %v", got, err)
	}
	if _, err := secret.Open(key, "d", rp.Secret); err == nil {
		t.Fatal("a sealed secret opened as another peer's")
	}
	st.Close()
	m, st = openMachine(t, dir)
	defer st.Close()
	if rp := m.Link("c").Runtime; rp == nil || rp.Added != 3 {
		t.Fatalf("after a reopen: %+v", rp)
	}
	if _, ok, _ := st.Cursor("c"); !ok {
		t.Fatal("no cursor before the removal")
	}
	if res := mustApply(t, m, 6, &Command{Peer: &PeerCmd{Name: "c", Remove: true}}); !res.Swapped {
		t.Fatal("the removal changed nothing")
	}
	if rp := m.Link("c").Runtime; rp != nil {
		t.Fatalf("removed, the peer is still in the log: %+v", rp)
	}
	if _, ok, _ := st.Cursor("c"); ok {
		t.Fatal("the removed peer's cursor stays: the stream would be kept for it")
	}
	if res := mustApply(t, m, 7, &Command{Peer: &PeerCmd{Name: "c", Remove: true}}); res.Swapped {
		t.Fatal("removing a peer not added at run time changed something")
	}
	if res := mustApply(t, m, 8, add); !res.Swapped || m.Link("c").Runtime.Added != 8 {
		t.Fatalf("added again: %+v", m.Link("c").Runtime)
	}
}
