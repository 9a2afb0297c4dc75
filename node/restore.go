package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/store"
)

// RestoreReport is what Restore did to a data directory.
type RestoreReport struct {
	Dir  string `json:"dir"`
	Node string `json:"node"`
	// Servers is how many raft servers the directory's configuration
	// holds: more than one is a node of a cluster of several.
	Servers int `json:"servers"`
	// Previous and Incarnation are the directory's incarnation before and
	// after; Replaced says a new one was minted.
	Previous    string `json:"previous_incarnation"`
	Incarnation string `json:"incarnation"`
	Replaced    bool   `json:"new_incarnation"`
	// Next says what happens when the node starts.
	Next string `json:"next"`
}

// Restore prepares a data directory put back from a copy (a backup, a
// snapshot of another disk) before the node starts on it, with the node
// stopped (`replicator restore --data DIR`; docs/OPERATIONS.md).
//
// A node of a cluster of several is a raft voter, and the copy remembers a
// past moment: started as itself, it would have forgotten every vote it
// cast and every entry it acknowledged since. So it gets a new incarnation:
// it comes back as a new member, which the leader adds as a non-voter,
// makes a voter once it caught up (from its own log and tree as far as they
// go, then from the leader's), and the incarnation the copy was taken from
// is taken out and never added back. A node alone keeps its identity (no
// voter to fool): its stream's identity check finds what the copy lacks
// and rejoins its peers, as it always did.
func Restore(dir string) (RestoreReport, error) {
	r := RestoreReport{Dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, "NODE_ID"))
	if err != nil {
		return r, fmt.Errorf("node: restore %s: not a data directory of a node (%w)", dir, err)
	}
	r.Node = strings.TrimSpace(string(b))
	// The node must be stopped: Pebble's lock says whether it runs.
	st, err := store.Open(filepath.Join(dir, "store"), &store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return r, fmt.Errorf("node: restore %s: stop the node first (%w)", dir, err)
	}
	st.Close()
	conf, err := cluster.LatestConfiguration(filepath.Join(dir, "cluster"))
	if err != nil {
		return r, fmt.Errorf("node: restore %s: %w", dir, err)
	}
	r.Servers = len(conf.Servers)
	_, rerr := os.Stat(filepath.Join(dir, origin.IncarnationFile))
	legacy := r.Servers > 0 && errors.Is(rerr, os.ErrNotExist)
	if r.Previous, err = origin.Incarnation(dir, legacy); err != nil {
		return r, err
	}
	r.Incarnation = r.Previous
	if r.Servers <= 1 {
		if err := origin.Refingerprint(dir); err != nil {
			return r, err
		}
		r.Next = "a node alone keeps its identity: at its start it reopens its stream, and the first peer that holds writes the copy " +
			"lacks makes it seal the stream and rejoin (docs/OPERATIONS.md \"Restoring a node from a backup\")"
		return r, nil
	}
	if r.Incarnation, err = origin.NewIncarnation(dir); err != nil {
		return r, err
	}
	r.Replaced = true
	r.Next = fmt.Sprintf("a node of several comes back as a new member %s: the leader adds it as a non-voter, makes it a voter once it "+
		"caught up, and takes out %s for good (a voter put back from a copy would have forgotten what it acknowledged since)",
		cluster.ServerID(r.Node, r.Incarnation), cluster.ServerID(r.Node, r.Previous))
	return r, nil
}
