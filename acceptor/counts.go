package acceptor

// Counts are the acceptor's outcome counters, per origin cluster.
type Counts struct {
	Batches    uint64 `json:"batches"`
	Applied    uint64 `json:"applied"`    // newly applied and won LWW
	Stale      uint64 `json:"stale"`      // newly applied, lost LWW
	Duplicates uint64 `json:"duplicates"` // already applied (hwm or equal stamp)
	DroppedOwn uint64 `json:"dropped_own"`
	Refused    uint64 `json:"refused"`
	// DeadLettered entries broke this node's limits and were set aside.
	DeadLettered uint64 `json:"dead_lettered"`
	// DroppedUnknown are snapshot entries of clusters this node does not
	// know, not taken.
	DroppedUnknown uint64 `json:"dropped_unknown"`
	// Filtered are indexes the sender's filtered markers covered: entries
	// whose keys its filter for this link keeps home.
	Filtered uint64 `json:"filtered"`
	// Conflicts are the records the sender's entries added to the conflict
	// log: versions last-writer-wins discarded whose winner had not seen
	// them (docs/DATAMODEL.md "Conflicts").
	Conflicts uint64 `json:"conflicts"`
	// RangeDiscards are the sender's range deletes that deleted live keys
	// here: counted per range, not logged per key.
	RangeDiscards uint64 `json:"range_discards"`
	// Resurrections are a re-seed's versions older than this tree's
	// collection horizon, of keys it held nothing of, not taken: they may
	// have been deleted here (docs/ANTIENTROPY.md).
	Resurrections uint64 `json:"possible_resurrections"`
	// Withheld are snapshot entries relaying a third cluster's writes that
	// the third cluster's own filter toward this one keeps home, not taken
	// (docs/DATAMODEL.md "Filters").
	Withheld uint64 `json:"withheld_by_origin_filter"`
	// WithheldUnheard are snapshot entries relaying a third cluster's
	// writes while its filter toward this one was not heard here (this node
	// lost its data, or never heard from it), not taken: the third cluster
	// sends them itself (docs/DATAMODEL.md "Filters").
	WithheldUnheard uint64 `json:"withheld_filter_unheard"`
}

// Counts returns a copy of the per-origin counters.
func (a *Acceptor) Counts() map[string]Counts {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]Counts, len(a.mu.counts))
	for k, v := range a.mu.counts {
		out[k] = *v
	}
	return out
}

// REQUIRES: a.mu held.
func (a *Acceptor) countsLocked(origin string) *Counts {
	c := a.mu.counts[origin]
	if c == nil {
		c = &Counts{}
		a.mu.counts[origin] = c
	}
	return c
}

func (a *Acceptor) count(origin string, f func(*Counts)) {
	a.mu.Lock()
	f(a.countsLocked(origin))
	a.mu.Unlock()
}
