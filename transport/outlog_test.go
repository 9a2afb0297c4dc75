package transport_test

import (
	"fmt"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
)

// outLog is a cluster's outbound stream as production ships it: the
// machine's Outbound, kept in the tree, appended to and cut back through
// the machine's commands as the leader applies them.
type outLog struct {
	*machine.Outbound
	m     *machine.Machine
	st    *store.Store
	enc   *machine.Encoder
	index uint64 // the last command applied (the log index)
}

// newOutLog opens a tree in dir with a machine of cluster "a" that has
// minted its stream.
func newOutLog(t testing.TB, dir string) *outLog {
	t.Helper()
	st, err := store.Open(dir, &store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m, err := machine.Open(st, machine.Options{Cluster: "a", Logger: quiet})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	l := &outLog{Outbound: m.Outbound(), m: m, st: st, enc: machine.NewEncoder()}
	if err := l.apply(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return l
}

func (l *outLog) apply(c *machine.Command) error {
	b, err := l.enc.Encode(c)
	if err != nil {
		return err
	}
	res, err := l.m.Apply(l.index+1, b)
	if err != nil {
		return err
	}
	l.index++
	for i, w := range res.Writes {
		if w.Err != nil {
			return fmt.Errorf("write %d refused: %w", i, w.Err)
		}
	}
	return nil
}

// Append commits entries as one local group: each takes the stream's next
// index, as the leader's writes do, and ents are filled in as applied.
func (l *outLog) Append(ents []*entry.Entry) error {
	ps := make([]machine.Proposal, len(ents))
	for i, e := range ents {
		ps[i] = machine.Proposal{Entry: *e}
	}
	first := l.Last() + 1
	if err := l.apply(&machine.Command{Local: ps}); err != nil {
		return err
	}
	for i, e := range ents {
		e.Index, e.Origin, e.Stream = first+uint64(i), "a", l.Stream()
	}
	return nil
}
