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
