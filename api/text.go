package api

import "regexp"

// pkgPrefix matches the package prefixes of the product's errors
// ("machine: ", "node: "): a client reads what happened, not where in the
// code (issue 48).
var pkgPrefix = regexp.MustCompile(`\b(acceptor|api|client|cluster|forward|machine|node|raftconn|replica|resp|store|transport|wire): `)

// ClientText is an error's text as a client reads it: without the
// product's package prefixes.
func ClientText(s string) string { return pkgPrefix.ReplaceAllString(s, "") }
