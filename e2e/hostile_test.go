package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/discovery"
)

// hostile is a gossip member with no credential in every cluster's gossip
// (issue 25: gossip has no key here, as documented for a closed network),
// run through the multi-node robustness schedule:
//
//   - an impersonator of each cluster's leader: the leader's node ID and
//     incarnation, with API and replicate URLs of a fake server that answers
//     every request with a fake success, re-announced as leaders change;
//   - made-up members of each cluster, at raft addresses nobody listens at;
//   - a flood: members that join and leave every few hundred milliseconds.
//
// Nothing of it may reach the fake server, become a member, or cost an
// acknowledged write.
type hostile struct {
	t    *testing.T
	m    *rmesh
	fake *httptest.Server
	hits atomic.Int64
	seen sync.Map // first requests the fake server got, for the report
	stop chan struct{}
	done sync.WaitGroup
	// rounds counts impersonations announced and flood members started.
	rounds, flooded atomic.Int64
	// made are the made-up members, which end takes out of gossip.
	made []*discovery.Discovery
}

func startHostile(t *testing.T, m *rmesh) *hostile {
	h := &hostile{t: t, m: m, stop: make(chan struct{})}
	h.fake = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.hits.Add(1) <= 5 {
			h.seen.Store(r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"), true)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"key":"k","version":"1.0@a","origin":"a","accepted":1,"applied":1,"hwm":1000000}`)
	}))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	member := func(name, cluster, node, inc, raftAddr, url string) *discovery.Discovery {
		seeds := []string{}
		for _, n := range m.members(cluster) {
			seeds = append(seeds, n.gossip)
		}
		// Port 0: memberlist binds a free one (freePort hands each port out
		// once, and a flood of ten minutes would use them all up).
		d, err := discovery.Start(discovery.Options{NodeName: name, Bind: "127.0.0.1:0",
			Profile: "local", Join: seeds, Logger: quiet,
			Meta: api.MemberMeta{V: discovery.GossipVersion, Cluster: cluster, Node: node, Inc: inc, Raft: raftAddr, API: url, Replicate: url}})
		if err != nil {
			t.Logf("hostile member %s: %v", name, err)
			return nil
		}
		d.JoinLoop(h.stop)
		return d
	}
	var made []*discovery.Discovery
	for _, c := range m.clusters {
		for i := 0; i < 10; i++ {
			ghost := fmt.Sprintf("127.0.0.1:%d", 1+i) // nobody listens on ports 1-10
			if d := member(fmt.Sprintf("%s-ghost%d", c, i), c, fmt.Sprintf("ghost%d", i), "0badc0de", ghost, h.fake.URL); d != nil {
				made = append(made, d)
			}
		}
	}
	for _, c := range m.clusters {
		h.done.Add(1)
		go func() {
			// Exits at stop: re-announces the impersonator of c's leader
			// every 3 s, and floods c's gossip with short-lived members.
			defer h.done.Done()
			var imp *discovery.Discovery
			defer func() {
				if imp != nil {
					imp.Leave(time.Second)
				}
			}()
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			var lastLeader string
			for i := 0; ; i++ {
				select {
				case <-h.stop:
					return
				case <-tick.C:
				}
				if i%10 == 0 {
					if l := m.leader(c); l != nil && l.id != lastLeader {
						if r, err := localCluster(l); err == nil {
							if imp != nil {
								imp.Leave(time.Second)
							}
							imp = member(fmt.Sprintf("%s-%s-evil-%d", c, l.id, i), c, l.id, r.Incarnation, l.raft, h.fake.URL)
							lastLeader = l.id
							h.rounds.Add(1)
						}
					}
				}
				if d := member(fmt.Sprintf("%s-flood-%d", c, i), c, fmt.Sprintf("flood%d", i%50), "0badc0de",
					fmt.Sprintf("127.0.0.1:%d", 11+i%50), h.fake.URL); d != nil {
					h.flooded.Add(1)
					h.done.Add(1)
					go func() {
						// Exits after a second.
						defer h.done.Done()
						time.Sleep(time.Second)
						d.Leave(100 * time.Millisecond)
					}()
				}
			}
		}()
	}
	h.made = made
	return h
}

// end stops the hostile members and reports what they achieved: requests
// the fake server got, and made-up members in any configuration.
func (h *hostile) end() []string {
	close(h.stop)
	h.done.Wait()
	for _, d := range h.made {
		d.Leave(100 * time.Millisecond)
	}
	h.fake.Close()
	var bad []string
	if n := h.hits.Load(); n > 0 {
		var first []string
		h.seen.Range(func(k, _ any) bool { first = append(first, k.(string)); return true })
		bad = append(bad, fmt.Sprintf("the hostile gossip member's fake server got %d requests (first: %v)", n, first))
	}
	for _, c := range h.m.clusters {
		l := h.m.leader(c)
		if l == nil {
			continue
		}
		r, err := localCluster(l)
		if err != nil {
			continue
		}
		for _, cn := range r.Nodes {
			if (strings.HasPrefix(cn.ID, "ghost") || strings.HasPrefix(cn.ID, "flood")) && cn.State != "not a member" && cn.State != "removed" {
				bad = append(bad, fmt.Sprintf("made-up member %s is in cluster %s's configuration (%s, voter %v)", cn.ID, c, cn.State, cn.Voter))
			}
		}
	}
	if h.rounds.Load() == 0 || h.flooded.Load() == 0 {
		bad = append(bad, "the hostile gossip member never impersonated a leader or flooded: the check proved nothing")
	}
	return bad
}
