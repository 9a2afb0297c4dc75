package machine

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/store"
)

// Peers added and removed at run time (issue 49, docs/OPERATIONS.md
// "Adding and removing a peer at run time"): a command of the log, like a
// link's filter, so that every node, every later leader, raft snapshots
// and backups hold the same peers. The secret travels sealed.

// FormatRuntimePeers is format 13 too: from it the log may add and remove
// peers (PeerCmd), which a node of an older build does not decode.
const FormatRuntimePeers = FormatStagedSnapshots

// PeerCmd adds Name at URLs (its secret sealed), or removes it.
type PeerCmd struct {
	Name   string
	Remove bool
	URLs   []string
	Secret []byte
}

// maxPeerURLs bounds a peer's URLs.
const maxPeerURLs = 16

func encodePeer(enc *msgpack.Encoder, pc *PeerCmd) error {
	err := errors.Join(enc.EncodeArrayLen(5), enc.EncodeUint(uint64(KindPeer)), enc.EncodeString(pc.Name), enc.EncodeBool(pc.Remove),
		enc.EncodeArrayLen(len(pc.URLs)))
	for _, u := range pc.URLs {
		err = errors.Join(err, enc.EncodeString(u))
	}
	return errors.Join(err, enc.EncodeBytes(pc.Secret))
}

func decodePeer(dec *msgpack.Decoder, c *Command) error {
	pc := &PeerCmd{}
	var err error
	if pc.Name, err = dec.DecodeString(); err != nil {
		return err
	}
	if !entry.ValidClusterID(pc.Name) {
		return fmt.Errorf("peer %q", pc.Name)
	}
	if pc.Remove, err = dec.DecodeBool(); err != nil {
		return err
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 || n > maxPeerURLs || (n == 0) != pc.Remove {
		return fmt.Errorf("peer of %d URLs (remove %v)", n, pc.Remove)
	}
	for range n {
		u, err := dec.DecodeString()
		if err != nil {
			return err
		}
		if u == "" || len(u) > 2048 {
			return fmt.Errorf("peer URL of %d bytes", len(u))
		}
		pc.URLs = append(pc.URLs, u)
	}
	if pc.Secret, err = dec.DecodeBytes(); err != nil {
		return err
	}
	if len(pc.Secret) > 4096 {
		return fmt.Errorf("a sealed secret of %d bytes", len(pc.Secret))
	}
	c.Peer = pc
	return nil
}

// applyPeer adds or removes a peer. A removal forgets the link's cursor (the
// stream is no longer kept for it) and keeps the peer's marks here (a peer
// added again is deduplicated as before) and its dead letters (the
// operator's to replay or discard); added again, it has no cursor, so its
// link begins with a re-seed.
func (m *Machine) applyPeer(b *store.Batch, index uint64, pc *PeerCmd) (*Result, func(), error) {
	links := m.Links()
	ls := links[pc.Name]
	res := &Result{}
	switch {
	case pc.Remove && ls.Runtime == nil:
		return res, nil, nil // not a peer added at run time
	case pc.Remove:
		ls.Runtime = nil
		if err := b.DeleteCursor(pc.Name); err != nil {
			return nil, nil, err
		}
	case ls.Runtime != nil && slices.Equal(ls.Runtime.URLs, pc.URLs) && string(ls.Runtime.Secret) == string(pc.Secret):
		return res, nil, nil // a retried add
	default:
		ls.Runtime = &entry.RuntimePeer{URLs: slices.Clone(pc.URLs), Secret: slices.Clone(pc.Secret), Added: index}
	}
	res.Swapped = true
	if err := b.SetLinkSettings(pc.Name, ls); err != nil {
		return nil, nil, err
	}
	next := maps.Clone(links)
	if next == nil {
		next = map[string]entry.LinkSettings{}
	}
	next[pc.Name] = ls
	return res, func() { m.links.Store(&next) }, nil
}
