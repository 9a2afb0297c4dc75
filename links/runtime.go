package links

import (
	"slices"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/secret"
	"github.com/replicator/replicator/transport"
)

// Peers added at run time (machine.PeerCmd): every node lets them in at its
// acceptor and out once the log removes them; the leader links to them as
// to a configured peer, and stops the link of a removed one. A peer of the
// flags is never one of them (the add is refused for its name).

// reconcileRuntime squares this node's runtime peers with the log's.
func (s *Set) reconcileRuntime() {
	d := s.d
	if d.Settings == nil {
		return
	}
	want := map[string]*entry.RuntimePeer{}
	for name, ls := range d.Settings.d.Machine().Links() {
		if ls.Runtime != nil {
			if _, configured := d.Settings.peerOption(name); !configured {
				want[name] = ls.Runtime
			}
		}
	}
	s.runtimeMu.Lock()
	if s.runtime == nil {
		s.runtime = map[string]Peer{}
	}
	var added []Peer
	var removed []string
	for name, rp := range want {
		have, ok := s.runtime[name]
		if ok && have.URL == rp.URLs[0] && slices.Equal(have.Fallbacks, rp.URLs[1:]) && have.sealed == string(rp.Secret) {
			continue
		}
		p := Peer{Name: name, URL: rp.URLs[0], Fallbacks: slices.Clone(rp.URLs[1:]), sealed: string(rp.Secret)}
		if len(rp.Secret) > 0 {
			sec, err := secret.Open(d.SecretsKey, name, rp.Secret)
			if err != nil {
				if !ok {
					s.runtime[name] = Peer{Name: name, sealed: string(rp.Secret), unopened: true}
					d.Logger.Error("a peer added at run time cannot be linked here: its secret does not open", "peer", name, "err", err)
				}
				continue
			}
			p.Secret, p.Secrets = sec, secret.NewPair(sec, "", 0)
		}
		if ok {
			removed = append(removed, name) // changed: linked anew
		}
		s.runtime[name] = p
		added = append(added, p)
	}
	for name := range s.runtime {
		if _, ok := want[name]; !ok {
			delete(s.runtime, name)
			removed = append(removed, name)
		}
	}
	s.runtimeMu.Unlock()
	for _, name := range removed {
		if d.ForgetPeer != nil {
			d.ForgetPeer(name)
		}
		s.removeLink(name)
		d.Logger.Warn("peer removed at run time: its link stopped, the stream is no longer kept for it", "peer", name)
	}
	for _, p := range added {
		if p.unopened {
			continue
		}
		if d.AcceptPeer != nil {
			d.AcceptPeer(p.Name, p.Secrets)
		}
		d.Logger.Info("peer added at run time", "peer", p.Name, "url", p.URL)
		if d.Leading() {
			if _, err := s.add(p); err != nil && err != ErrNoTerm {
				d.Logger.Warn("linking a peer added at run time", "peer", p.Name, "err", err)
			}
		}
	}
}

// removeLink stops the link to peer and forgets it.
func (s *Set) removeLink(peer string) {
	s.mu.Lock()
	var gone *transport.Shipper
	s.mu.shippers = slices.DeleteFunc(s.mu.shippers, func(sh *transport.Shipper) bool {
		if sh.Peer().Name == peer {
			gone = sh
			return true
		}
		return false
	})
	if gone != nil {
		if cancel := s.mu.cancels[gone]; cancel != nil {
			cancel() // its goroutine ends (s.wg)
		}
		delete(s.mu.cancels, gone)
	}
	s.mu.Unlock()
}

// isRuntime reports a peer added at run time.
func (s *Set) isRuntime(peer string) bool {
	s.runtimeMu.Lock()
	defer s.runtimeMu.Unlock()
	_, ok := s.runtime[peer]
	return ok
}
