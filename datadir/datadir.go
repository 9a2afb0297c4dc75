// Package datadir reads and prepares a stopped node's data directory, for
// the operator's offline commands (`replicator inspect`, `replicator
// restore`; docs/OPERATIONS.md): which node it is, how far its raft log and
// tree go, and a new identity for a directory put back from a copy.
package datadir

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/replicator/replicator/backup"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
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
	// Online says the directory is an online backup (`replicator backup`):
	// a tree without a raft log.
	Online bool `json:"online_backup,omitempty"`
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
		return r, fmt.Errorf("datadir: restore %s: not a data directory of a node (%w)", dir, err)
	}
	r.Node = strings.TrimSpace(string(b))
	// The node must be stopped: Pebble's lock says whether it runs.
	st, err := store.Open(filepath.Join(dir, "store"), &store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return r, fmt.Errorf("datadir: restore %s: stop the node first (%w)", dir, err)
	}
	st.Close()
	conf, err := cluster.LatestConfiguration(filepath.Join(dir, "cluster"))
	if err != nil {
		return r, fmt.Errorf("datadir: restore %s: %w", dir, err)
	}
	r.Servers = len(conf.Servers)
	man, online, err := backup.Read(dir)
	if err != nil {
		return r, fmt.Errorf("datadir: restore %s: %w", dir, err)
	}
	if _, cerr := os.Stat(filepath.Join(dir, "cluster")); online && errors.Is(cerr, os.ErrNotExist) {
		// An online backup (`replicator backup`): the tree and the
		// identity, no raft log.
		r.Servers, r.Previous, r.Online = man.Servers, man.Incarnation, true
	} else {
		online = false
		_, rerr := os.Stat(filepath.Join(dir, origin.IncarnationFile))
		legacy := r.Servers > 0 && errors.Is(rerr, os.ErrNotExist)
		if r.Previous, err = origin.Incarnation(dir, legacy); err != nil {
			return r, err
		}
	}
	// Always a new incarnation: a copy whose configuration holds this node
	// alone may be of a node that grew into a cluster since.
	if r.Incarnation, err = origin.NewIncarnation(dir); err != nil {
		return r, err
	}
	r.Replaced = true
	switch {
	case online && r.Servers <= 1:
		r.Next = "started alone, it finds no raft log beside its tree and begins a new stream; the first peer that holds writes the " +
			"copy lacks makes it rejoin, and what the peers received comes back (docs/OPERATIONS.md \"Online backups\")"
		return r, nil
	case online:
		r.Next = fmt.Sprintf("started as a node of several, it comes back as a new member %s: the leader adds it, and it takes from the "+
			"leader's log or snapshot what the copy lacks; if its whole cluster was lost, start it alone (without --bootstrap-expect "+
			"and --join) to bring the cluster back from the copy, then grow it (docs/OPERATIONS.md \"Online backups\")",
			cluster.ServerID(r.Node, r.Incarnation))
		return r, nil
	}
	if r.Servers <= 1 {
		r.Next = "started alone, it renames its group of one and reopens its stream, and the first peer that holds writes the copy " +
			"lacks makes it seal the stream and rejoin (docs/OPERATIONS.md \"Restoring a node from a backup\"); started as a node of " +
			"several, it is a new member its cluster's leader adds"
		return r, nil
	}
	r.Next = fmt.Sprintf("a node of several comes back as a new member %s: the leader adds it as a non-voter, makes it a voter once it "+
		"caught up, and takes out %s for good (a voter put back from a copy would have forgotten what it acknowledged since)",
		cluster.ServerID(r.Node, r.Incarnation), cluster.ServerID(r.Node, r.Previous))
	return r, nil
}

// InspectReport is what a stopped node's data directory holds (`replicator
// inspect --data DIR`): which node it is, and how far its raft log and its
// tree go. After the loss of a majority, the survivor to recover is the one
// whose log is the most up to date: the highest LastTerm, then the highest
// LastIndex (raft's own rule: that log holds every committed command).
type InspectReport struct {
	Dir          string   `json:"dir"`
	Cluster      string   `json:"cluster"`
	Node         string   `json:"node"`
	Incarnation  string   `json:"incarnation"`
	ServerID     string   `json:"server_id"`
	FirstIndex   uint64   `json:"first_index"`
	LastIndex    uint64   `json:"last_index"`
	LastTerm     uint64   `json:"last_term"`
	Snapshot     uint64   `json:"snapshot_index"`
	SnapshotTerm uint64   `json:"snapshot_term"`
	Applied      uint64   `json:"applied_index"`
	Stream       string   `json:"stream"`
	Voters       []string `json:"voters"`
	// Servers are every member of the configuration, non-voters too.
	Servers []string `json:"servers"`
	// Copied says the directory was copied since its incarnation was
	// recorded (a node of several must go through Restore).
	Copied string `json:"copied,omitempty"`
}

// Newest is the last entry the directory's raft state holds, as raft ranks
// logs: its log's last, or its snapshot's when that is further (a snapshot
// installed from the leader past the log).
func (r *InspectReport) Newest() (term, index uint64) {
	if r.Snapshot > r.LastIndex {
		return r.SnapshotTerm, r.Snapshot
	}
	return r.LastTerm, r.LastIndex
}

// Inspect reads a stopped node's data directory.
func Inspect(dir string) (InspectReport, error) {
	r := InspectReport{Dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, "NODE_ID"))
	if err != nil {
		return r, fmt.Errorf("datadir: inspect %s: not a data directory of a node (%w)", dir, err)
	}
	r.Node = strings.TrimSpace(string(b))
	if b, err := os.ReadFile(filepath.Join(dir, "CLUSTER_ID")); err == nil {
		r.Cluster = strings.TrimSpace(string(b))
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(dir, "store"), &store.Options{Logger: quiet})
	if err != nil {
		return r, fmt.Errorf("datadir: inspect %s: stop the node first (%w)", dir, err)
	}
	cl := r.Cluster
	if cl == "" {
		cl = "-" // never pinned: the machine reads nothing of its own cluster here
	}
	m, err := machine.Open(st, machine.Options{Cluster: cl, Logger: quiet})
	if err == nil {
		r.Applied, r.Stream = m.Applied(), m.Stream().String()
	}
	st.Close()
	if err != nil {
		return r, err
	}
	ls, err := cluster.Inspect(filepath.Join(dir, "cluster"), quiet)
	if err != nil {
		return r, err
	}
	r.FirstIndex, r.LastIndex, r.LastTerm, r.Snapshot, r.SnapshotTerm = ls.First, ls.Last, ls.LastTerm, ls.Snapshot, ls.SnapshotTerm
	conf, err := cluster.LatestConfiguration(filepath.Join(dir, "cluster"))
	if err != nil {
		return r, err
	}
	for _, id := range cluster.Voters(conf) {
		r.Voters = append(r.Voters, string(id))
	}
	for _, s := range conf.Servers {
		r.Servers = append(r.Servers, string(s.ID))
	}
	if b, err := os.ReadFile(filepath.Join(dir, origin.IncarnationFile)); err == nil && len(b) > 0 {
		r.Incarnation, _ = origin.Incarnation(dir, true)
	}
	r.ServerID = string(cluster.ServerID(r.Node, r.Incarnation))
	if err := origin.CheckNotCopied(dir); err != nil {
		r.Copied = err.Error()
	}
	return r, nil
}

// PIDFile names the process that holds a running node's data directory
// (for the message a second node gets).
const PIDFile = "PID"

// OpenStore opens the tree of the data directory dir for a node that runs
// on it: a directory another process holds is refused naming that process,
// and this process is recorded as its holder.
func OpenStore(dir string, o *store.Options) (*store.Store, error) {
	st, err := store.Open(filepath.Join(dir, "store"), o)
	if err != nil {
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "lock held") {
			holder := "another process"
			if b, rerr := os.ReadFile(filepath.Join(dir, PIDFile)); rerr == nil {
				holder = "process " + strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("node: data directory %s is in use by %s (a running node): stop it first, or give this one another --data", dir, holder)
		}
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, PIDFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		st.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	return st, nil
}

// LinkSettings reads what the cluster's log holds of each link from a
// stopped node's data directory (ok false: the directory holds no tree
// yet). A running node holds its tree locked: the error says so.
func LinkSettings(dir string) (links map[string]entry.LinkSettings, ok bool, err error) {
	path := filepath.Join(dir, "store")
	if _, err := os.Stat(path); err != nil {
		return nil, false, nil
	}
	st, err := store.Open(path, &store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, false, err
	}
	defer st.Close()
	links, err = st.LinkSettings()
	return links, err == nil, err
}
