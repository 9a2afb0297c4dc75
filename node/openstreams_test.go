package node

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// TestPeersOpenStreamsRecorded: each cluster's heartbeats tell its open
// streams (issue 51), and its peer's log records them: b's one stream,
// then, after b lost its data and began a new stream, that one alone (the
// old stream, which never advances again, no longer counts toward b's
// frontier).
func TestPeersOpenStreamsRecorded(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := newTestMesh(t, pc, nil, "a", "b")
	ctx := context.Background()
	if _, err := m.nodes["b"].Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	m.converged(20 * time.Second)
	// told waits until a records b's stream now as b's one open stream.
	told := func() entry.StreamID {
		t.Helper()
		var now entry.StreamID
		waitFor(t, 20*time.Second, func() (bool, string) {
			now = m.nodes["b"].rep.Stream().Stream()
			got := m.nodes["a"].machine.Link("b").Open
			return slices.Equal(got, []entry.StreamID{now}), fmt.Sprintf("a records b's open streams %v, b's stream is %s", got, now)
		})
		return now
	}
	first := told()
	m.restart("b", func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	})
	// b begins a stream, finds a holds writes of b it does not remember,
	// seals it and begins another (rejoining): a ends with the last.
	m.converged(20 * time.Second)
	if second := told(); second == first {
		t.Fatalf("b kept stream %s after losing its data", first)
	}
}
