package api

// Anti-entropy's report (docs/ANTIENTROPY.md): what a comparison of a
// cluster's tree with a peer's found, and what a repair applied.

// Lacks says which side lacks a divergent key's newer version.
type Lacks string

const (
	// LacksLocal: the cluster compared from should pull the peer's version.
	LacksLocal Lacks = "local"
	// LacksPeer: the peer should pull this cluster's version.
	LacksPeer Lacks = "peer"
	// LacksBoth: a counter each side holds some component of higher.
	LacksBoth Lacks = "both"
	// LacksUnknown: the two versions share a stamp but not a value (one
	// side's tree rotted, or was edited by hand): last-writer-wins cannot
	// tell; an operator must (docs/OPERATIONS.md).
	LacksUnknown Lacks = "unknown"
	// LacksMaybeDeleted: one side holds a live version older than the
	// other side's collection horizon, which the other lacks: the other may
	// have deleted it and collected the tombstone. A possible resurrection,
	// never copied (docs/OPERATIONS.md).
	LacksMaybeDeleted Lacks = "possible_resurrection"
	// LacksOwnWrite: the side that lacks the newer version (or counter
	// component) wrote it: it lost its own write (a restore or a wipe whose
	// rejoin did not bring it back, or a bug). A repair never copies a
	// cluster's own writes back to it: a peer could forge them, and a
	// rejoin is how a cluster takes its own writes back
	// (docs/ANTIENTROPY.md "Whose versions a repair takes").
	LacksOwnWrite Lacks = "own_write"
	// LacksThirdOrigin: the newer version (or counter component) is
	// neither side's write but a third cluster's. It reaches each side over
	// that cluster's own link, whose filter may keep it from one on
	// purpose: neither side's repair copies it, and such keys are listed
	// apart from the divergence (DiffReport.ThirdOrigin).
	LacksThirdOrigin Lacks = "third_origin"
	// LacksExpired: one side holds a version that expired by the other
	// side's collection horizon, and stamped below it, which the other
	// lacks: the other collected it (docs/DATAMODEL.md "Expiry"), and the
	// holder will. Not divergence: listed apart (DiffReport.Expired).
	LacksExpired Lacks = "expired"
)

// RangeDelete is a range tombstone one side keeps, as a comparison lists
// it.
type RangeDelete struct {
	Start  string `json:"start"`
	End    string `json:"end"`
	Stamp  string `json:"stamp"`
	Origin string `json:"origin"`
}

// Divergence is one key the two sides disagree on.
type Divergence struct {
	Key     string `json:"key"`
	Counter bool   `json:"counter,omitempty"`
	// Local and Peer are what each side holds (nil: nothing).
	Local *Held `json:"local"`
	Peer  *Held `json:"peer"`
	Lacks Lacks `json:"lacks"`
}

// Held is what one side holds of a key (values are not exchanged).
type Held struct {
	Stamp     string `json:"stamp"`
	Origin    string `json:"origin"`
	Tombstone bool   `json:"tombstone,omitempty"`
	Hash      string `json:"value_hash"`
}

// DiffReport is a comparison's result.
type DiffReport struct {
	Peer string `json:"peer"`
	// Equal: the roots were equal: both sides hold the same live versions
	// (nothing but sums was read).
	Equal bool `json:"equal"`
	// LeavesDiffering are the leaves whose sums differed; Truncated: more
	// than a pass lists the keys of (antientropy.MaxLeavesPerPass), the
	// rest left for the next.
	LeavesDiffering int  `json:"leaves_differing"`
	Truncated       bool `json:"truncated,omitempty"`
	// LeavesCompared are the differing leaves this pass compared the keys
	// of (LeavesDiffering unless Truncated).
	LeavesCompared int `json:"leaves_compared"`
	// Compared is the number of keys of those leaves compared; Candidates
	// those that differed at the first look; InFlight those that changed
	// on a side or agreed at the second look (writes in flight).
	Compared   int `json:"keys_compared"`
	Candidates int `json:"candidates"`
	InFlight   int `json:"in_flight"`
	// Divergent are the keys that still differed, unchanged, at the second
	// look, in a way one of the two sides' repair can mend, or must know
	// of (possible resurrections, same-stamp rot, a side's lost own write).
	Divergent []Divergence `json:"divergent"`
	// ThirdOrigin are the keys that differed only in a third cluster's
	// version (LacksThirdOrigin): not divergence between these two
	// clusters; that cluster's links carry it, or its filter keeps it
	// from one of them on purpose.
	ThirdOrigin []Divergence `json:"third_origin,omitempty"`
	// Expired are the keys that differed only in a version one side
	// collected as expired (LacksExpired): each side collects at its own
	// pace, so the roots differ until both did.
	Expired []Divergence `json:"expired,omitempty"`
	// LinkBehind: this cluster's link to the peer had not delivered, by
	// the second look, what it held at the first; keys the peer lacks
	// were counted in flight.
	LinkBehind bool `json:"link_behind,omitempty"`
	// RangesDiffer: the two sides keep different range deletes of their
	// own two clusters among those neither may have collected yet (newer
	// than both collection horizons), each clipped to the comparison's
	// scope (a filtered link carries a range delete clipped to what it
	// lets cross); RangesHere and RangesPeer count those each side keeps.
	RangesDiffer bool `json:"ranges_differ,omitempty"`
	RangesHere   int  `json:"ranges_here"`
	RangesPeer   int  `json:"ranges_peer"`
	// RangesOnlyHere and RangesOnlyPeer are the range deletes of either
	// side's own cluster (of this pair) that one side keeps and the other
	// does not, clipped to the comparison's scope. Informational (Equal
	// speaks of live versions): a side without one would keep an older
	// write that arrived late into the range, which the collection rules
	// say cannot come any more once both collected below it; but a tree
	// restored from an old backup keeps range tombstones the others
	// collected, and a wiped tree's horizon does not say what it never
	// held. Range deletes of third clusters are left out (their filters
	// decide where they go).
	RangesOnlyHere []RangeDelete `json:"ranges_only_here,omitempty"`
	RangesOnlyPeer []RangeDelete `json:"ranges_only_peer,omitempty"`
	// Bytes is what crossed the wire to and from the peer.
	Bytes int64 `json:"bytes"`
	// Repaired counts the versions a repair of this side applied (-1: no
	// repair asked); Refused those of the peer's it did not take because
	// the inbound path refuses them from that peer too: a stamp further
	// ahead of this node's clock than the max clock offset, a key or a
	// value past its limits, another cluster's version or counter
	// component, a key outside the link's filters; and versions the peer
	// listed in leaves nobody asked for.
	Repaired int `json:"repaired"`
	Refused  int `json:"refused,omitempty"`
	// RefusedWhy counts Refused by reason: "clock", "limits", "origin"
	// (not the peer's own write), "component" (a counter component not
	// the peer's), "scope" (a key outside the link's filters), "unasked"
	// (a version in a leaf the comparison did not ask for).
	RefusedWhy map[string]int `json:"refused_why,omitempty"`
	// Seconds is how long the comparison (and repair) took.
	Seconds float64 `json:"seconds"`
}

// Count returns the number of divergent keys of one kind of lack.
func (r *DiffReport) Count(l Lacks) int {
	n := 0
	for i := range r.Divergent {
		if r.Divergent[i].Lacks == l {
			n++
		}
	}
	return n
}

// TreeRebuild is what a rebuild of a node's kept hashes found
// (POST /admin/tree/rebuild): every leaf summed afresh from the node's tree
// and compared with the kept one; a wrong one corrected.
type TreeRebuild struct {
	Leaves    int `json:"leaves_checked"`
	Corrected int `json:"leaves_corrected"`
	// First are the first leaves corrected (at most 16).
	First   []int   `json:"first,omitempty"`
	Seconds float64 `json:"seconds"`
}
