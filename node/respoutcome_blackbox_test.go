package node_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ports "github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// TestRESPUnknownOutcome: the leader of a cluster of three is cut off from
// the others with a pipeline of writes in flight. Its log holds them, no
// quorum can: the first is answered UNKNOWNOUTCOME (not OK, not NOTWRITTEN:
// a new leader may or may not have it), none after it is answered OK, and
// the connection closes, so a failover cannot reorder what follows. Once
// healed, a new connection writes again.
func TestRESPUnknownOutcome(t *testing.T) {
	free, release, err := ports.Hold(3)
	if err != nil {
		t.Fatal(err)
	}
	addrs, blocks := map[string]string{}, map[string]string{}
	c := nodetest.NewCluster(t, "u", 3, func(name string, o *node.Options) {
		addrs[name], free = free[0], free[1:]
		o.RESPListen = addrs[name]
		blocks[name] = filepath.Join(t.TempDir(), name+".block")
		os.WriteFile(blocks[name], nil, 0o644)
		o.Testing.RaftBlockFile = blocks[name]
		if name == "u3" {
			release()
		}
	})
	l := c.Leader()
	ctx := context.Background()
	rc := redisClient(t, addrs[l], 2, func(o *redis.Options) { o.PoolSize = 1 })
	if err := rc.Set(ctx, "before", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Two ways: the leader reaches no other node, none reaches it.
	var others []string
	for name := range c.Nodes {
		if name != l {
			others = append(others, c.Opts[name].Raft.Listen)
			os.WriteFile(blocks[name], []byte(c.Opts[l].Raft.Listen+"\n"), 0o644)
		}
	}
	os.WriteFile(blocks[l], []byte(strings.Join(others, "\n")+"\n"), 0o644)
	time.Sleep(60 * time.Millisecond) // each node reads its list at most every 20 ms
	// A raw connection: what the server answers, and that it closes.
	nc, err := net.Dial("tcp", addrs[l])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var req []byte
	const writes = 20
	for i := range writes {
		k := fmt.Sprintf("cut-%02d", i)
		req = fmt.Appendf(req, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n", len(k), k)
	}
	if _, err := nc.Write(req); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(nc)
	for i := range writes {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		switch {
		case i == 0 && !strings.HasPrefix(line, "-UNKNOWNOUTCOME"):
			t.Fatalf("the first write of a leader cut off from its quorum: %q", line)
		case !strings.HasPrefix(line, "-UNKNOWNOUTCOME") && !strings.HasPrefix(line, "-NOTWRITTEN"):
			t.Fatalf("write %d after an unknown outcome: %q", i, line)
		}
	}
	if rest, err := br.ReadString('\n'); err != io.EOF {
		t.Fatalf("the connection stayed open after an unknown outcome: %q %v", rest, err)
	}
	for name := range c.Nodes {
		os.WriteFile(blocks[name], nil, 0o644)
	}
	// Once healed, the cluster settles on a leader; until then a write is
	// NOTWRITTEN (safe to retry), never an error of another class.
	var after *redis.Client
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		after = redisClient(t, addrs[c.Leader()], 2, nil)
		err := after.Set(ctx, "after", "v", 0).Err()
		if err != nil && !strings.HasPrefix(err.Error(), "NOTWRITTEN") {
			t.Fatalf("a write after the heal: %v", err)
		}
		return err == nil, fmt.Sprint(err)
	})
	if got := after.Get(ctx, "before").Val(); got != "v" {
		t.Fatalf("the write acknowledged before the cut: %q", got)
	}
}
