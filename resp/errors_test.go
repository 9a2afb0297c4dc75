package resp

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/replicator/replicator/api"
)

// TestErrorClasses: each error of the node's write path answers with the
// prefix docs/RESP.md gives it; an unknown outcome is never told as not
// written, even when its chain also names a refusal.
func TestErrorClasses(t *testing.T) {
	for _, c := range []struct {
		err    error
		prefix string
	}{
		{fmt.Errorf("%w: saturated", api.ErrNotWritten), "NOTWRITTEN "},
		{&api.SaturatedError{Source: "outbound_backlog", Peer: "b"}, "NOTWRITTEN "}, // as admission refuses
		{fmt.Errorf("%w: group commit lost", api.ErrUnknownOutcome), "UNKNOWNOUTCOME "},
		{fmt.Errorf("%w: %w", api.ErrUnknownOutcome, api.ErrNotWritten), "UNKNOWNOUTCOME "},
		{fmt.Errorf("%w: a counter", api.ErrKindConflict), "WRONGTYPE "},
		{api.ErrCounterRange, "ERR "},
		{api.ErrKeyTooLarge, "ERR "},
		{api.ErrCatchingUp, "NOTWRITTEN "},
		{&api.CrossGroupError{Groups: []int{0, 1}, Keys: []string{"a", "b"}}, "CROSSSLOT "}, // Redis Cluster's, which its clients know
		{api.FailureOf(&api.CrossGroupError{Groups: []int{0, 1}, Keys: []string{"a", "b"}}).Err(), "CROSSSLOT "},
	} {
		kind, msg := classify(c.err)
		if !strings.HasPrefix(msg, c.prefix) {
			t.Errorf("%v: %q, want the prefix %q", c.err, msg, c.prefix)
		}
		// Counted by its kind (a kind not counted stopped the node).
		if !slices.Contains(errorKinds, kind) {
			t.Errorf("%v: kind %q is not among the counted kinds %v", c.err, kind, errorKinds)
		}
	}
}
