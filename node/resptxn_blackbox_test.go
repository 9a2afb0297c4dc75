package node_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// TestRESPTransactionsAtAFollower: a transaction sent to a follower runs
// over what the follower reads and reaches the leader as one conditional
// batch (a typed proposal of version 2): it commits whole; one whose
// WATCHed key another client changed at the leader answers nil (the
// leader's state machine decides, whatever the follower has read yet) and
// writes nothing; MSETNX through the follower excludes as at the leader.
func TestRESPTransactionsAtAFollower(t *testing.T) {
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	c := nodetest.NewCluster(t, "x", 3, func(name string, o *node.Options) {
		addrs[name], free = free[0], free[1:]
		o.RESPListen = addrs[name]
		if name == "x3" {
			release()
		}
	})
	l, f := c.Leader(), c.Follower()
	ctx := context.Background()
	fc := redisClient(t, addrs[f], 2, nil)
	lc := redisClient(t, addrs[l], 2, nil)

	var got *redis.StringCmd
	if _, err := fc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "x", "1", 0)
		p.Set(ctx, "y", "2", 0)
		got = p.Get(ctx, "x")
		return nil
	}); err != nil || got.Val() != "1" {
		t.Fatalf("a transaction at follower %s: %q %v", f, got.Val(), err)
	}
	if r, err := c.Nodes[l].Get("y"); err != nil || string(r.Value) != "2" {
		t.Fatalf("the leader's y: %q %v", r.Value, err)
	}

	// WATCH at the follower; another client writes the key at the leader
	// before EXEC.
	err = fc.Watch(ctx, func(tx *redis.Tx) error {
		if err := lc.Set(ctx, "w", "theirs", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "x", "mine", 0)
			p.Set(ctx, "side", "s", 0)
			return nil
		})
		return err
	}, "w")
	if err != redis.TxFailedErr {
		t.Fatalf("EXEC at the follower after the WATCHed key changed at the leader: %v, want nil (TxFailedErr)", err)
	}
	if r, err := c.Nodes[l].Get("x"); err != nil || string(r.Value) != "1" {
		t.Fatalf("x at the leader: %q %v: a failed transaction wrote", r.Value, err)
	}
	if _, err := c.Nodes[l].Get("side"); err == nil {
		t.Fatal("side was written by a failed transaction")
	}
	if ok, err := fc.MSetNX(ctx, "n1", "a", "x", "b").Result(); err != nil || ok {
		t.Fatalf("MSETNX through the follower over a held key: %v %v", ok, err)
	}
	if ok, err := fc.MSetNX(ctx, "n1", "a", "n2", "b").Result(); err != nil || !ok {
		t.Fatalf("MSETNX through the follower: %v %v", ok, err)
	}
	if r, err := c.Nodes[l].Get("n2"); err != nil || string(r.Value) != "b" {
		t.Fatalf("n2 at the leader: %q %v", r.Value, err)
	}
}
