package main

import (
	"fmt"
	"io"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/datadir"
	"github.com/replicator/replicator/node"
)

// printOverrides appends to --print-config, as YAML comments, the settings
// of links that the cluster's log holds otherwise than these flags declare:
// the log's are in force (docs/OPERATIONS.md "Declared and in force").
func printOverrides(w io.Writer, o *node.Options) {
	if o.DataDir == "" || len(o.Peers) == 0 {
		return
	}
	logged, ok, err := datadir.LinkSettings(o.DataDir)
	switch {
	case err != nil:
		fmt.Fprintf(w, "# the node runs, or its tree does not open (%v): what its cluster's log holds of each link, which wins\n"+
			"# over these values once recorded, is in replicator filter|bandwidth|compression PEER\n", err)
		return
	case !ok:
		return // a first start: the flags seed the log
	}
	for _, p := range o.Peers {
		for _, d := range api.DriftOf(p.Filter(), p.Bandwidth, p.Compression, logged[p.Name]) {
			fmt.Fprintf(w, "# overridden: peer %s %s: declared %s, the cluster's log holds %s (in force; change it with replicator %s %s)\n",
				p.Name, d.Setting, d.Declared, d.InForce, d.Setting, p.Name)
		}
	}
}
