package links

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// DeadLetters are the entries peers sent that this node set aside because
// they broke its own limits, and the operator's decisions on them, which go
// through the cluster's log (every node takes the same).
type DeadLetters struct {
	store  *store.Store
	commit func(*machine.Command) (*machine.Result, error)
	log    *slog.Logger
}

// NewDeadLetters reads st's dead letters and decides them through commit.
func NewDeadLetters(st *store.Store, commit func(*machine.Command) (*machine.Result, error), log *slog.Logger) *DeadLetters {
	return &DeadLetters{store: st, commit: commit, log: log}
}

// DeadLetters lists the entries peers sent that this node set aside because
// they broke its own limits (a larger value than it accepts, say).
func (n *DeadLetters) DeadLetters() ([]api.DeadLetterReport, error) {
	dls, err := n.store.DeadLetters()
	if err != nil {
		return nil, err
	}
	out := make([]api.DeadLetterReport, 0, len(dls))
	codec := wire.NewCodec()
	for _, d := range dls {
		r := api.DeadLetterReport{ID: d.ID(), Origin: d.Origin, Stream: entry.StreamID(d.Stream).String(), Index: d.Index,
			At: time.Unix(0, d.At).UTC(), Reason: d.Reason}
		if e, err := codec.DecodeEntry(d.Entry, wire.Defaults{}); err == nil {
			r.Op, r.Key = e.Op.String(), e.Key
		}
		out = append(out, r)
	}
	return out, nil
}

func (n *DeadLetters) deadLetter(id string) (store.DeadLetter, error) {
	dls, err := n.store.DeadLetters()
	if err != nil {
		return store.DeadLetter{}, err
	}
	for _, d := range dls {
		if d.ID() == id {
			return d, nil
		}
	}
	return store.DeadLetter{}, fmt.Errorf("%w: no dead letter %q", api.ErrNotFound, id)
}

// ReplayDeadLetter applies a dead letter as it is (the operator has decided
// this node should take it, e.g. after raising a limit) and removes it,
// through the cluster's log: every node of the cluster takes it.
func (n *DeadLetters) ReplayDeadLetter(id string) error {
	return n.decideDeadLetter(id, machine.DeadReplay, "dead letter replayed by the operator")
}

// DiscardDeadLetter drops a dead letter: the entry will never apply here.
func (n *DeadLetters) DiscardDeadLetter(id string) error {
	return n.decideDeadLetter(id, machine.DeadDiscard, "dead letter discarded by the operator")
}

func (n *DeadLetters) decideDeadLetter(id string, action byte, msg string) error {
	d, err := n.deadLetter(id)
	if err != nil {
		return err
	}
	res, err := n.commit(&machine.Command{DeadLetter: &machine.DeadLetterCmd{Origin: d.Origin, Stream: d.Stream, Index: d.Index, Action: action}})
	if err != nil {
		return err
	}
	if !res.Found {
		return fmt.Errorf("%w: dead letter %q (decided meanwhile)", api.ErrNotFound, id)
	}
	n.log.Warn(msg, "id", id)
	return nil
}
