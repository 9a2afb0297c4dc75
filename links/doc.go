// Package links holds the peer links' side of a node that does not ship:
// each link's settings in step with the cluster's log (settings.go).
//
// What crosses each link is state of the cluster's log (machine.LinkCmd):
// a filter takes effect at a stream index, so every node and every later
// leader ships the same thing for the same index. A node's flags
// (--peer-include, --peer-exclude) seed the log once; after that the log
// wins, and an operator changes a link with PUT /admin/peers/NAME/filter.
//
// The shippers of a term, their health, saturation and admission move here
// from package node next (issue 47).
package links
