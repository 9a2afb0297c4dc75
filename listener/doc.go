// Package listener is what a node's listeners do before a request reaches
// a door: bind (or take a given listener), TLS with its reload and the
// cluster a certificate names, bounds on connections and on the body rate,
// the API's tokens and the scope they grant, and the browser checks
// (cross-origin requests, DNS rebinding on loopback). It knows the
// contract's scopes (package api), never the node or its routes: the node
// says which scope a request needs.
package listener
