package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// TestLinkCompression: a link set to zstd sends batches of JSON-like values
// compressed once the peer said it decodes them, and the peer holds exactly
// what was written (digests equal); the plain link the other way sends as
// many bytes as it encodes. Both count their bytes before and after.
func TestLinkCompression(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		if o.ClusterID == "a" {
			o.Peers[0].Compression = "zstd"
			o.MaxBatchEntries = 200
		}
	}, "a", "b")
	ctx := context.Background()
	// A link learns what a node decodes from its answers: wait for the
	// first (a heartbeat's) before cutting.
	for deadline := time.Now().Add(10 * time.Second); m.Nodes["a"].PeerStatus()[0].LastContact.IsZero(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a's link to b never had an answer")
		}
	}
	// Written while the links are cut, shipped when they heal: batches of
	// many entries, as a link that keeps up with a steady flow sends them.
	m.Cut("a", "b", true)
	m.Cut("b", "a", true)
	for i := range 2000 {
		doc := fmt.Sprintf(`{"tenant":"t%d","kind":"order","id":%d,"state":"paid","lines":[{"sku":"A-100","qty":1},{"sku":"B-200","qty":2}]}`, i%7, i)
		if _, err := m.Nodes["a"].Put(ctx, fmt.Sprintf("orders/%06d", i), []byte(doc)); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			if _, err := m.Nodes["b"].Put(ctx, fmt.Sprintf("b/%06d", i), []byte(doc)); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.Cut("a", "b", false)
	m.Cut("b", "a", false)
	m.Converged(30 * time.Second)
	ab, ba := m.Nodes["a"].PeerStatus()[0], m.Nodes["b"].PeerStatus()[0]
	if ab.Compression != "zstd" || ab.BytesRaw == 0 || ab.BytesOnWire*3 > ab.BytesRaw {
		t.Fatalf("a -> b (zstd): %d bytes encoded, %d on the wire", ab.BytesRaw, ab.BytesOnWire)
	}
	if ba.Compression != "none" || ba.BytesRaw == 0 || ba.BytesOnWire != ba.BytesRaw {
		t.Fatalf("b -> a (none): %d bytes encoded, %d on the wire", ba.BytesRaw, ba.BytesOnWire)
	}
	t.Logf("a -> b: %d bytes encoded, %d on the wire (%.1fx)", ab.BytesRaw, ab.BytesOnWire, float64(ab.BytesRaw)/float64(ab.BytesOnWire))
}
