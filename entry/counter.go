package entry

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// MaxComponentLen bounds a counter component's name: a cluster ID, or
// "<cluster>/<stream hex>" (see Component).
const MaxComponentLen = 128

// Component names the totals one WAL stream of a cluster keeps. Totals are
// keyed by stream, not by cluster alone: a node that lost its data (wiped,
// or restored from a backup) begins a new stream, and its new increments
// start fresh totals, which a max-merge against the totals peers hold for
// the old stream cannot absorb. (Counters written before streams named
// their totals carry the bare cluster ID; both kinds merge side by side.)
//
// epoch > 0 names a fresh set of totals within one stream: a node that
// restarts and cannot confirm with every peer, before it takes writes, that
// none holds entries of its stream it does not (a restored backup whose
// peer is unreachable), counts under a new, random epoch, so that increments
// it takes meanwhile cannot be absorbed by totals that peer holds.
func Component(cluster string, stream [16]byte, epoch uint32) string {
	c := cluster + "/" + hex.EncodeToString(stream[:])
	if epoch > 0 {
		c += "." + strconv.FormatUint(uint64(epoch), 10)
	}
	return c
}

// ComponentCluster is the cluster a component's totals belong to.
func ComponentCluster(component string) string {
	c, _, _ := strings.Cut(component, "/")
	return c
}

// PN is one stream's totals: increments and decrements it took.
type PN struct {
	P, N uint64
}

// ClusterTotals sums totals kept per stream (see Component) per cluster:
// what a reader wants.
func ClusterTotals(components map[string]PN) map[string]PN {
	totals := make(map[string]PN, len(components))
	for comp, t := range components {
		cl := ComponentCluster(comp)
		sum := totals[cl]
		sum.P += t.P
		sum.N += t.N
		totals[cl] = sum
	}
	return totals
}
