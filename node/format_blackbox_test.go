package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/node"
)

// TestMixedVersionClusterKeepsEncoding1: while one member runs a build that
// reads command encoding 1 only (a rolling upgrade half done), the leader
// never writes encoding 2, and that member applies every command; once it
// is upgraded, the log moves to the newest encoding and every node applies
// it. (That an admission in flight holds the raise, and that an older build
// is refused as a new member once the log moved, are replica's tests:
// TestAdmissionHoldsTheFormatRaise.)
func TestMixedVersionClusterKeepsEncoding1(t *testing.T) {
	c := nodetest.NewCluster(t, "m", 3, func(name string, o *node.Options) {
		if name == "m3" {
			o.Testing.ReadsFormat = 1
		}
	})
	put := func(through, key string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := c.Client(through).Put(context.Background(), key, []byte("v"))
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("put %s through %s: %v", key, through, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i := 0; i < 10; i++ {
		put(c.Names[i%3], fmt.Sprint("before/", i))
	}
	time.Sleep(3 * time.Second) // a few rounds of the leader's check
	for _, name := range c.Names {
		if f := c.Nodes[name].LocalCluster().Format; f != 1 {
			t.Fatalf("%s: format %d while m3 reads encoding 1 only", name, f)
		}
		if err := c.Nodes[name].FatalErr(); err != nil {
			t.Fatalf("%s stopped: %v", name, err)
		}
	}
	c.Converged()

	// m3 is upgraded: restarted on this build.
	c.Stop("m3")
	c.Opts["m3"].Testing.ReadsFormat = 0
	c.Start("m3")
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		f := c.Nodes[c.Leader()].LocalCluster().Format
		return f == machine.ReadsFormat, fmt.Sprintf("the log is at encoding %d once every member reads %d", f, machine.ReadsFormat)
	})
	for i := 0; i < 10; i++ {
		put(c.Names[i%3], fmt.Sprint("after/", i))
	}
	if d := c.Converged(); d.Keys != 20 {
		t.Fatalf("%d keys, want 20", d.Keys)
	}
	for _, name := range c.Names {
		if f := c.Nodes[name].LocalCluster().Format; f != machine.ReadsFormat {
			t.Fatalf("%s at format %d", name, f)
		}
		if err := c.Nodes[name].FatalErr(); err != nil {
			t.Fatalf("%s stopped: %v", name, err)
		}
	}
}
