package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/wire"
)

// TestDeadLetters: b accepts smaller values than a. An entry over b's limit
// is set aside as a dead letter instead of wedging the link; later entries
// flow; the operator can replay or discard it.
func TestDeadLetters(t *testing.T) {
	m := nodetest.NewMesh(t, nil, nil, "a", "b")
	a := m.Nodes["a"]
	ctx := context.Background()
	// b lowers its limit while a's entries are on their way: a took them
	// under the limit b had said it accepts.
	m.Cut("a", "b", true)
	for _, kv := range []struct{ k, v string }{{"big-1", strings.Repeat("x", 2000)}, {"big-2", strings.Repeat("y", 2000)}, {"small", "fine"}} {
		if _, err := a.Put(ctx, kv.k, []byte(kv.v)); err != nil {
			t.Fatal(err)
		}
	}
	m.Opts["b"].MaxValueBytes = 1000
	m.Restart("b", nil)
	b := m.Nodes["b"]
	m.Cut("a", "b", false)
	m.Settle()
	if r, err := b.Get("small"); err != nil || string(r.Value) != "fine" {
		t.Fatalf("the link is wedged behind the oversized entries: %v", err)
	}
	list := func() []api.DeadLetterReport {
		t.Helper()
		resp, body := nodetest.Do(t, http.MethodGet, b.URL()+"/admin/deadletters", nil)
		var got struct {
			DeadLetters []api.DeadLetterReport `json:"dead_letters"`
		}
		if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /admin/deadletters: %d %s", resp.StatusCode, body)
		}
		return got.DeadLetters
	}
	act := func(id, action string) int {
		t.Helper()
		resp, _ := nodetest.Do(t, http.MethodPost, b.URL()+"/admin/deadletters/"+id+"/"+action, nil)
		return resp.StatusCode
	}
	dl := list()
	if len(dl) != 2 || dl[0].Key != "big-1" || dl[0].Op != "set" {
		t.Fatalf("dead letters: %+v", dl)
	}
	var hw []api.StreamReport
	for _, s := range b.PeersReport().Streams {
		if s.Origin == "a" {
			hw = append(hw, s)
		}
	}
	if len(hw) != 1 || hw[0].Merged+hw[0].DeadLettered != hw[0].HWM || hw[0].DeadLettered != 2 {
		t.Fatalf("a's stream at b: %+v", hw)
	}
	if st := act(dl[0].ID, "replay"); st != http.StatusOK {
		t.Fatalf("replay: %d", st)
	}
	if r, err := b.Get("big-1"); err != nil || len(r.Value) != 2000 {
		t.Fatalf("replayed dead letter not applied: %v", err)
	}
	if st := act(dl[1].ID, "discard"); st != http.StatusOK {
		t.Fatalf("discard: %d", st)
	}
	if dl := list(); len(dl) != 0 {
		t.Fatalf("left: %+v", dl)
	}
	if st := act("nope", "discard"); st != http.StatusNotFound {
		t.Fatalf("discarding an unknown dead letter answered %d", st)
	}
}

// TestResentBatchListsItsDeadLetters: a batch whose answer was lost is sent
// again whole; the receiver, which set an entry of it aside the first
// time, lists that entry again in the answer to the resend, so that the
// sender's WAIT does not count it as holding the write (written while
// looking for the cause of a WAIT violation in the combined schedule,
// seed 1: not this path, which holds).
func TestResentBatchListsItsDeadLetters(t *testing.T) {
	o := nodetest.Options("a", t.TempDir())
	o.MaxValueBytes = 64
	o.Peers = []node.Peer{{Name: "b", Secret: "s"}}
	o.Gossip = &node.GossipOptions{Bind: "127.0.0.1:0"}
	n := nodetest.Start(t, o)
	commit := hlc.Timestamp{Wall: time.Now().UnixNano()}
	var es []entry.Entry
	for i, v := range []string{"small", strings.Repeat("v", 200), "small too"} {
		e := entry.Entry{Index: uint64(i + 1), Origin: "b", Stream: entry.StreamID{0xb}, Commit: commit, Op: entry.OpSet,
			Key: fmt.Sprintf("k%d", i), Value: []byte(v)}
		e.Stamp, commit.Logical = e.Commit, commit.Logical+1
		es = append(es, e)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		st, body := nodetest.SendBatch(t, n, "b", "s", es...)
		var ack wire.Ack
		if err := json.Unmarshal(body, &ack); err != nil || st != http.StatusOK {
			t.Fatalf("delivery %d: %d %s", attempt, st, body)
		}
		if ack.HWM != 3 || len(ack.DeadLettered) != 1 || ack.DeadLettered[0] != 2 {
			t.Fatalf("delivery %d: the answer says mark %d, set aside %v (want 3, [2])", attempt, ack.HWM, ack.DeadLettered)
		}
	}
}
