package links

import (
	"fmt"
	"net/url"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/transport"
)

// ValidatePeers reports every problem of a node's configured peers: own is
// its cluster's ID, gossip says it learns peers' URLs by gossip, secured
// that links authenticate without a secret (mutual TLS, or insecure peers).
// The errors read as the node's options' (prefixed "node: ").
func ValidatePeers(peers []Peer, own string, gossip, secured bool) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("node: "+format, args...)) }
	seen := map[string]bool{}
	for _, p := range peers {
		if err := origin.Validate(p.Name); err != nil {
			errs = append(errs, fmt.Errorf("node: peer %q: %w", p.Name, err))
		}
		if p.Name == own && own != "" {
			add("peer %q is this node's own cluster", p.Name)
		}
		if seen[p.Name] {
			add("peer %q configured twice", p.Name)
		}
		seen[p.Name] = true
		if u, err := url.Parse(p.URL); p.URL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			add("peer %q: URL %q is not an http(s) URL", p.Name, p.URL)
		}
		if p.URL == "" && !gossip {
			add("peer %q has no URL (--peer %s=URL, or learn it by gossip with --gossip-bind)", p.Name, p.Name)
		}
		if p.Secret == "" && !secured {
			add("peer %q has no secret (--peer-secret %s=SECRET, mutual TLS with --tls-client-ca, or --insecure-peers)", p.Name, p.Name)
		}
		if p.Compression != "" && p.Compression != transport.CompressionNone && p.Compression != transport.CompressionZstd {
			add("peer %q: compression %q, want zstd or none", p.Name, p.Compression)
		}
		if p.Bandwidth < 0 {
			add("peer %q: bandwidth %d is negative", p.Name, p.Bandwidth)
		} else if p.Bandwidth > 0 && p.Bandwidth < 1024 {
			add("peer %q: bandwidth %d bytes/s is below 1 KiB/s (a batch or a heartbeat would not fit)", p.Name, p.Bandwidth)
		}
		if err := p.Filter().Validate(); err != nil {
			add("peer %q: %v", p.Name, err)
		}
		if p.Overflow != "" && p.Overflow != api.OverflowReject && p.Overflow != api.OverflowDetach {
			add("peer %q: overflow %q, want reject or detach", p.Name, p.Overflow)
		}
	}
	return errs
}
