package replica

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
)

// TestConditionOnKeysNeedsItsFormat: a batch conditional on keys' versions
// is proposed only once every node reads it (command format 10): before,
// it is refused as not written, since a node of an older build would not
// decode it. Only a batch carries one, and its keys are checked as keys.
func TestConditionOnKeysNeedsItsFormat(t *testing.T) {
	format := machine.FormatDeletesOfNothing
	w := &Submitter{Bounds: &Bounds{MaxKeyBytes: 16, MaxValueBytes: 1024, MaxReplicateBytes: 1 << 20, PinWindow: time.Hour,
		Peers: func() []PeerLimits { return nil }}, Format: func() int { return format }}
	tx := api.Write{Ops: []api.BatchOp{{Key: "k", Value: []byte("v")}}, Cond: &api.Condition{Keys: []api.KeyVersion{{Key: "w", Version: "1.0@a"}}}}
	if _, err := w.Prepare(tx); !errors.Is(err, api.ErrNotWritten) || !strings.Contains(err.Error(), "format 10") {
		t.Fatalf("a condition on keys at format %d: %v; want not written, naming the format", format, err)
	}
	format = machine.FormatBatchConditions
	p, err := w.Prepare(tx)
	if err != nil || len(p.Cond.Keys) != 1 {
		t.Fatalf("at format %d: %+v, %v", format, p, err)
	}
	single := api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: "k", Value: []byte("v")}, Cond: tx.Cond}
	if _, err := w.Prepare(single); !errors.Is(err, api.ErrBadRequest) {
		t.Fatalf("keys' versions on a single write: %v", err)
	}
	long := tx
	long.Cond = &api.Condition{Keys: []api.KeyVersion{{Key: strings.Repeat("k", 17)}}}
	if _, err := w.Prepare(long); !errors.Is(err, api.ErrKeyTooLarge) {
		t.Fatalf("a condition on a key past the bound: %v", err)
	}
}
