package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
)

// blockingTree is a comparison that runs until released, and says whether
// its context ended before that.
type blockingTree struct {
	release chan struct{}
	ended   chan error // the ctx's error when the comparison returned
}

func (b *blockingTree) Diff(ctx context.Context, peer string, repair bool) (api.DiffReport, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	b.ended <- ctx.Err()
	return api.DiffReport{Peer: peer, Repaired: 7}, ctx.Err()
}

func (b *blockingTree) RebuildTree(context.Context) (api.TreeRebuild, error) {
	return api.TreeRebuild{}, nil
}

// TestRepairOutlivesItsCaller (issue 49, 6): a repair applies in chunks, so
// a client that goes away (a CLI's timeout, a closed terminal) must not
// stop it half-applied: it runs to its end. A comparison alone (nothing to
// apply) stops with its client.
func TestRepairOutlivesItsCaller(t *testing.T) {
	for _, repair := range []bool{true, false} {
		tree := &blockingTree{release: make(chan struct{}), ended: make(chan error, 1)}
		h := New(newFakeNode(), Options{Tree: tree, Metrics: http.NotFoundHandler()}).Handler()
		ctx, cancel := context.WithCancel(context.Background())
		target := "/admin/peers/b/diff"
		if repair {
			target += "?repair=true"
		}
		req := httptest.NewRequest(http.MethodPost, target, nil).WithContext(ctx)
		done := make(chan struct{})
		go func() {
			// Exits when the handler returns: the comparison was released
			// or its context ended.
			defer close(done)
			h.ServeHTTP(httptest.NewRecorder(), req)
		}()
		cancel() // the caller leaves
		if repair {
			select {
			case err := <-tree.ended:
				t.Fatalf("the repair ended with its caller: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			close(tree.release)
			if err := <-tree.ended; err != nil {
				t.Fatalf("the repair ran with an ended context: %v", err)
			}
		} else if err := <-tree.ended; err == nil {
			t.Fatal("a comparison went on after its caller left")
		}
		<-done
	}
}
