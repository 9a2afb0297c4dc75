package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/atomicfile"
	"github.com/replicator/replicator/wal"
)

// Recovering from the loss of a majority (docs/OPERATIONS.md "Losing a
// majority"). The operator puts a peers.json naming one survivor in its
// raft directory; hashicorp/raft's RecoverCluster applies the survivor's
// log, committed or not, and makes it a group of itself. What the lost
// nodes may hold the survivor does not, so:
//
//   - every server of the configuration before the recovery but the
//     survivor is recorded as removed (lost in a recovery): one that comes
//     back with its old directory is refused and told why, instead of
//     being added back by the leader with a log and a tree of another
//     history;
//   - the stream is sealed (a new one begins): the lost nodes may have
//     shipped indexes the survivor does not hold.
//
// Both are commands of the first term. peers.json stays in place until
// they committed (FinishRecovery): a stop in between recovers again at the
// next start, and the record of the recovery (RecoveryFile, written before
// RecoverCluster, since afterwards the old configuration is gone) says what
// to seal and whom to record.

// PeersFile is where an operator puts the configuration of the node that
// survives the loss of a majority (hashicorp/raft's peers.json, version 3:
// [{"id": "a1", "address": "10.0.0.1:7500", "non_voter": false}]; the id
// may be the node ID or its raft server ID), before starting it again.
const PeersFile = "peers.json"

// RecoveryFile records a recovery under way.
const RecoveryFile = "RECOVERY"

// Recovery is a recovery under way: who was lost, and which stream the
// first term seals.
type Recovery struct {
	// Lost are the raft server IDs of the configuration before the
	// recovery, but the survivor.
	Lost []string `json:"lost"`
	// Stream is the stream the survivor held after applying its log (set
	// by the node once the recovery applied it; empty before).
	Stream string `json:"stream,omitempty"`
	// Began is when the recovery was first asked for.
	Began time.Time `json:"began"`

	dir string
}

// recoverIfAsked rewrites the group's configuration from peers.json when
// the operator put one there. It returns the recovery under way (nil when
// none is).
func recoverIfAsked(o *Options, cfg *raft.Config, store *wal.Store, snaps raft.SnapshotStore, trans raft.Transport) (*Recovery, error) {
	path := filepath.Join(o.Dir, PeersFile)
	recPath := filepath.Join(o.Dir, RecoveryFile)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		// A record without peers.json: a stop after FinishRecovery renamed
		// it, before the record went. The recovery is done.
		if err := os.Remove(recPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		return nil, nil
	}
	if o.Solo {
		return nil, fmt.Errorf("cluster: %s is a recovery of a cluster of several: start the node with its raft port (--raft-listen)", path)
	}
	conf, err := raft.ReadConfigJSON(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", path, err)
	}
	self := cfg.LocalID
	if len(conf.Servers) != 1 || (conf.Servers[0].ID != self && string(conf.Servers[0].ID) != o.Node) {
		// Each survivor would apply its own log's tail, committed or not,
		// and their trees could differ for ever: one recovers, the others
		// join it with empty data directories.
		return nil, fmt.Errorf("cluster: %s must name this node (%s, raft server %s) alone: recover one survivor, then start the others "+
			"with empty data directories (they come back as new incarnations and catch up from it)", path, o.Node, self)
	}
	conf.Servers[0].ID, conf.Servers[0].Suffrage = self, raft.Voter
	rec, err := readRecovery(o.Dir)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		// First time: who is lost is read now, while the log still holds
		// the configuration the recovery replaces.
		before, err := latestConfiguration(store, snaps)
		if err != nil {
			return nil, fmt.Errorf("cluster: recover from %s: the configuration before it: %w", path, err)
		}
		rec = &Recovery{Began: time.Now().UTC(), dir: o.Dir}
		for _, s := range before.Servers {
			if s.ID != self {
				rec.Lost = append(rec.Lost, string(s.ID))
			}
		}
		if err := rec.save(); err != nil {
			return nil, err
		}
	}
	if err := raft.RecoverCluster(cfg, o.FSM, store, store, snaps, trans, conf); err != nil {
		return nil, fmt.Errorf("cluster: recover from %s: %w", path, err)
	}
	o.Logger.Warn("recovered the cluster's configuration after the loss of a majority: the first term records the lost nodes as removed and seals the stream",
		"servers", serverIDs(conf), "lost", rec.Lost)
	return rec, nil
}

func readRecovery(dir string) (*Recovery, error) {
	b, err := os.ReadFile(filepath.Join(dir, RecoveryFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	r := &Recovery{dir: dir}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", filepath.Join(dir, RecoveryFile), err)
	}
	return r, nil
}

func (r *Recovery) save() error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(r.dir, RecoveryFile), append(b, '\n')); err != nil {
		return fmt.Errorf("cluster: record the recovery: %w", err)
	}
	return nil
}

// Recovery returns the recovery under way (nil: none).
func (g *Group) Recovery() *Recovery { return g.recovery.Load() }

// SetStream records the stream the recovery seals (the node reads it once
// the recovery applied the log).
func (r *Recovery) SetStream(stream string) error {
	if r.Stream != "" {
		return nil
	}
	r.Stream = stream
	return r.save()
}

// FinishRecovery ends a recovery once its commands committed: peers.json is
// kept as peers.json.recovered-<time>, then the record goes.
func (g *Group) FinishRecovery() error {
	rec := g.recovery.Load()
	if rec == nil {
		return nil
	}
	path := filepath.Join(g.opts.Dir, PeersFile)
	done := fmt.Sprintf("%s.recovered-%d", path, time.Now().Unix())
	if err := os.Rename(path, done); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := os.Remove(filepath.Join(g.opts.Dir, RecoveryFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := atomicfile.SyncDir(g.opts.Dir); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	g.opts.Logger.Info("the recovery is complete: the lost nodes are recorded as removed", "kept_at", done, "lost", rec.Lost)
	g.recovery.Store(nil)
	return nil
}

// latestConfiguration is the configuration the log and snapshots hold
// (raft's own rule: the newest snapshot's, then every configuration entry
// after it).
func latestConfiguration(store *wal.Store, snaps raft.SnapshotStore) (conf raft.Configuration, err error) {
	from := uint64(1)
	metas, err := snaps.List()
	if err != nil {
		return conf, err
	}
	if len(metas) > 0 {
		conf, from = metas[0].Configuration, metas[0].Index+1
	}
	first, _ := store.FirstIndex()
	last, _ := store.LastIndex()
	defer func() {
		// raft.DecodeConfiguration panics on bytes it cannot read.
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: a configuration entry: %v", wal.ErrCorrupt, r)
		}
	}()
	for i := max(from, first); i <= last && first > 0; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			return conf, err
		}
		if l.Type == raft.LogConfiguration {
			conf = raft.DecodeConfiguration(l.Data)
		}
	}
	return conf, nil
}

// LatestConfiguration reads the configuration of the raft directory under
// dir without starting raft (`replicator restore`, `replicator inspect`).
func LatestConfiguration(dir string) (raft.Configuration, error) {
	if _, err := os.Stat(filepath.Join(dir, "raft")); errors.Is(err, os.ErrNotExist) {
		return raft.Configuration{}, nil
	}
	store, err := wal.Open(filepath.Join(dir, "raft"), nil)
	if err != nil {
		return raft.Configuration{}, err
	}
	defer store.Close()
	snaps, err := openSnapshots(filepath.Join(dir, "snapshots"))
	if err != nil {
		return raft.Configuration{}, err
	}
	return latestConfiguration(store, snaps)
}

// Voters lists a configuration's voters.
func Voters(c raft.Configuration) []raft.ServerID {
	var out []raft.ServerID
	for _, s := range c.Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, s.ID)
		}
	}
	slices.Sort(out)
	return out
}

// HasState reports whether the raft directory under dir holds raft state: a
// term or vote, a log entry, or a snapshot (without starting raft).
func HasState(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "raft", "stable")); err == nil {
		return true
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "raft", "log-*", "*")); len(segs) > 0 {
		return true
	}
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "meta.json"))
	return len(snaps) > 0
}
