package node

import (
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"

	"github.com/replicator/replicator/listener"
	"github.com/replicator/replicator/node/httpapi"
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

// needScope is the scope r needs: the scope of the route the mux matches
// (httpapi.RouteScope), decided after the path is checked to be canonical
// (false: refused here).
func needScope(mux *http.ServeMux, refused func(code string)) func(w http.ResponseWriter, r *http.Request) (httpapi.Scope, bool) {
	return func(w http.ResponseWriter, r *http.Request) (httpapi.Scope, bool) {
		if !canonical(w, r, refused) {
			return httpapi.ScopeNone, false
		}
		_, pattern := mux.Handler(r)
		return httpapi.RouteScope(pattern), true
	}
}

// canonical refuses a path that is not canonical outside a key
// (httpapi.Canonical), and readies a key route's path for the mux.
func canonical(w http.ResponseWriter, r *http.Request, refused func(code string)) bool {
	if err := httpapi.Canonical(r); err != nil {
		refused("bad_path")
		listener.RefuseEarly(w)
		writeError(w, http.StatusBadRequest, apiError{Code: "bad_path",
			Message: fmt.Sprintf("path %q: %v", r.URL.EscapedPath(), err)})
		return false
	}
	return true
}
