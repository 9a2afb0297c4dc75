// Package links holds the node's links to its peer clusters.
//
// A Set, built from Deps, makes a shipper (package transport) per peer from
// the cursors the cluster's log holds, and runs them for the node's stream
// while it may ship: a node alone from Start to Stop, a cluster of several
// for each leadership term of its leader (BeginTerm makes a Term's links,
// Run starts them once the term's bookkeeping is done, End stops them). It
// takes the operator's actions on a link, reports each link (a follower
// shows where each peer's cursor stands in the log), keeps the dashboard's
// history, and decides what the links hold back: the stream's entries a
// peer has not acknowledged (Truncate), the tombstones a peer may still need
// (TombstoneCutoff, KeepRanges) and their collection.
//
// What crosses each link is state of the cluster's log (machine.LinkCmd):
// a filter takes effect at a stream index, so every node and every later
// leader ships the same thing for the same index. A node's flags
// (--peer-include, --peer-exclude) seed the log once; after that the log
// wins, and an operator changes a link with PUT /admin/peers/NAME/filter
// (Settings).
//
// Saturation measures the links' backlogs against the water marks, detaches
// links in overflow mode detach, admits or refuses local writes, and
// forecasts when a backlog reaches a mark (trend.go). DeadLetters are what
// peers sent that this node set aside. Each part registers its own
// Prometheus series.
package links
