package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
)

// TestPeersPrintsRelaysLeftOut: the peers table says, per sender, how many
// relays of third clusters' writes were left out and why; a sender that
// relayed nothing left out gets no line.
func TestPeersPrintsRelaysLeftOut(t *testing.T) {
	var out bytes.Buffer
	printPeers(&out, &api.PeersReport{Cluster: "b", Incoming: map[string]acceptor.Counts{
		"a": {Batches: 3, Applied: 10, Withheld: 2, WithheldUnheard: 5},
		"c": {Batches: 1, Applied: 1},
	}})
	s := out.String()
	if !strings.Contains(s, "relays of third clusters' writes from a left out: 2 kept home by their author's filter, 5 before that filter was heard") {
		t.Fatalf("no line for a's relays left out:\n%s", s)
	}
	if strings.Contains(s, "from c left out") {
		t.Fatalf("a line for c, which relayed nothing left out:\n%s", s)
	}
}

// TestPeersShowsWhatEachLinkCarries (issue 49): the peers table shows each
// link's filter, compression and bandwidth limit, which only -o json had.
func TestPeersShowsWhatEachLinkCarries(t *testing.T) {
	var out bytes.Buffer
	printPeers(&out, &api.PeersReport{Cluster: "a", Links: []api.LinkStatus{
		{Peer: "b", Filter: "+shared/ -shared/tmp/", Compression: "zstd", BandwidthLimit: 20 << 20, ThrottledSeconds: 1.5},
		{Peer: "c", Filter: "every key", Compression: "none"},
	}})
	s := out.String()
	for _, want := range []string{"FILTER", "+shared/ -shared/tmp/", "zstd", "20.0 MiB/s", "1.5s", "every key"} {
		if !strings.Contains(s, want) {
			t.Fatalf("the peers table lacks %q:\n%s", want, s)
		}
	}
}

// TestStatusVerdict (issue 49): status opens with one verdict and exits 6
// unless healthy: a peer down 70 s (its link stalled) is degraded, not
// HEALTHY with exit 0; a missing voter is degraded, a lost quorum or no
// leader down.
func TestStatusVerdict(t *testing.T) {
	healthy := func() *statusOut {
		return &statusOut{Ready: true, Cluster: api.ClusterReport{Cluster: "a", Leader: "a1"}, VotersLive: 3, VotersTotal: 3,
			Saturation: api.SaturationReport{State: api.StateHealthy}, Links: []api.LinkStatus{{Peer: "b", State: "healthy"}}}
	}
	for _, tc := range []struct {
		name    string
		change  func(*statusOut)
		verdict string
		why     string
	}{
		{"healthy", func(*statusOut) {}, "healthy", ""},
		{"a peer down", func(s *statusOut) {
			s.Links[0].State, s.Links[0].LastError = "stalled", "transport: b at http://b refused the connection"
		}, "degraded", "link to b stalled (transport: b at http://b refused the connection)"},
		{"saturated", func(s *statusOut) { s.Saturation.State = api.StateSaturated }, "degraded", "saturation saturated"},
		{"a missing voter", func(s *statusOut) { s.VotersLive = 2 }, "degraded", "2 of 3 voters answering"},
		{"no quorum", func(s *statusOut) { s.VotersLive = 1 }, "down", "no quorum"},
		{"no leader", func(s *statusOut) { s.Cluster.Leader = "" }, "down", "no leader known"},
		{"groups led", func(s *statusOut) {
			s.Cluster.Groups = []api.GroupReport{{Group: 0, Leader: "a1", Slots: 2048}, {Group: 1, Leader: "a2", Slots: 2048}}
		}, "healthy", ""},
		{"a group without a leader", func(s *statusOut) {
			s.Cluster.Groups = []api.GroupReport{{Group: 0, Leader: "a1", Slots: 2048}, {Group: 1, Slots: 2048}}
		}, "down", "raft group 1: no leader known"},
	} {
		s := healthy()
		tc.change(s)
		s.Verdict, s.Why = verdict(s)
		if s.Verdict != tc.verdict || !strings.Contains(strings.Join(s.Why, "; "), tc.why) {
			t.Errorf("%s: %s %q, want %s with %q", tc.name, s.Verdict, s.Why, tc.verdict, tc.why)
		}
		var out bytes.Buffer
		printStatus(&out, s)
		if first := strings.SplitN(out.String(), "\n", 2)[0]; !strings.HasPrefix(first, strings.ToUpper(tc.verdict)) {
			t.Errorf("%s: the status opens with %q", tc.name, first)
		}
		if len(s.Cluster.Groups) > 0 && !strings.Contains(out.String(), "GROUP  LEADER") {
			t.Errorf("%s: the status shows no groups:\n%s", tc.name, out.String())
		}
		if tc.verdict != "healthy" {
			if code := report(&out, &out, "replicator status", unhealthyError{s.Verdict, s.Why}, false); code != 6 {
				t.Errorf("%s: exit %d, want 6", tc.name, code)
			}
		}
	}
}
