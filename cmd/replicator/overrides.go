package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/replicator/replicator/links"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/store"
)

// printOverrides appends to --print-config, as YAML comments, the settings
// of links that the cluster's log holds otherwise than these flags declare:
// the log's are in force (docs/OPERATIONS.md "Declared and in force").
func printOverrides(w io.Writer, o *node.Options) {
	if o.DataDir == "" || len(o.Peers) == 0 {
		return
	}
	dir := filepath.Join(o.DataDir, "store")
	if _, err := os.Stat(dir); err != nil {
		return // a first start: the flags seed the log
	}
	st, err := store.Open(dir, &store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintf(w, "# the node runs (%v): what its cluster's log holds of each link, which wins over these\n"+
			"# values once recorded, is in replicator filter|bandwidth|compression PEER\n", err)
		return
	}
	defer st.Close()
	logged, err := st.LinkSettings()
	if err != nil {
		fmt.Fprintf(w, "# the cluster's log's link settings could not be read: %v\n", err)
		return
	}
	for _, p := range o.Peers {
		for _, d := range links.DriftOf(links.Configured{Name: p.Name, Filter: p.Filter(), Bandwidth: p.Bandwidth, Compression: p.Compression}, logged[p.Name]) {
			fmt.Fprintf(w, "# overridden: peer %s %s: declared %s, the cluster's log holds %s (in force; change it with replicator %s %s)\n",
				p.Name, d.Setting, d.Declared, d.InForce, d.Setting, p.Name)
		}
	}
}
