package cluster

import "slices"

// SpreadMove picks one leadership transfer that brings a cluster's raft
// groups' leaders toward an even spread over its nodes (issue 51: each
// node leads about G/N groups, so that the leaders' share of every write
// is spread): from a node that leads the most groups to one that leads the
// fewest, when they differ by two or more. leaders[g] is the node leading
// group g ("": none known, left alone); nodes are the voters that may lead.
// It moves the highest-numbered group the loaded node leads, so group 0,
// which holds what is the cluster's, moves last. ok is false when the
// spread is even (no two nodes differ by more than one).
func SpreadMove(leaders []string, nodes []string) (group int, to string, ok bool) {
	if len(nodes) < 2 {
		return 0, "", false
	}
	count := make(map[string]int, len(nodes))
	for _, n := range nodes {
		count[n] = 0
	}
	for _, l := range leaders {
		if _, voter := count[l]; voter {
			count[l]++
		}
	}
	sorted := slices.Clone(nodes)
	slices.Sort(sorted)
	most, fewest := sorted[0], sorted[0]
	for _, n := range sorted[1:] {
		if count[n] > count[most] {
			most = n
		}
		if count[n] < count[fewest] {
			fewest = n
		}
	}
	if count[most]-count[fewest] < 2 {
		return 0, "", false
	}
	for g := len(leaders) - 1; g >= 0; g-- {
		if leaders[g] == most {
			return g, fewest, true
		}
	}
	return 0, "", false
}
