package node

import (
	"crypto/x509"
	"net/url"

	"github.com/replicator/replicator/listener"
)

// ReloadTLS reads --tls-cert and --tls-key again (SIGHUP, or the files
// changed): new connections, served and shipped, present the new
// certificate. A pair that does not load leaves the old one in place.
func (n *Node) ReloadTLS() error { return n.tls.Reload() }

// How a peer certificate names its cluster (package listener).
const (
	SANModeURI = listener.SANModeURI
	SANModeDNS = listener.SANModeDNS
)

// ErrWrongCluster refuses a certificate that names another cluster.
var ErrWrongCluster = listener.ErrWrongCluster

// ClusterFromCert reads the cluster ID a peer certificate names.
func ClusterFromCert(c *x509.Certificate, mode string) (string, error) {
	return listener.ClusterFromCert(c, mode)
}

// ClusterURI is the URI SAN that names a cluster in a peer certificate.
func ClusterURI(id string) *url.URL { return listener.ClusterURI(id) }
