package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/replicator/replicator/api"
)

const peerUsage = `replicator peer add NAME URL... [--secret-file F] [--addr URL]   add a peer cluster at run time (the cluster's log records it)
replicator peer remove NAME [--addr URL]                         remove a peer added at run time
replicator peer show NAME [--addr URL]                           what the log holds of it (never its secret)`

// runPeer serves `replicator peer add|remove|show`: peers at run time
// (docs/OPERATIONS.md "Adding and removing a peer at run time").
func runPeer(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Println(peerUsage)
		if len(args) == 0 {
			return usagef("usage:\n%s", peerUsage)
		}
		return errHelp
	}
	sub := args[0]
	fs := flag.NewFlagSet("peer "+sub, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	secretFile := fs.String("secret-file", "", "add: file with the link's secret (the same the peer gives for this cluster; at least 16 bytes); none: the peer is authenticated by its certificate")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	var r api.PeerReport
	switch {
	case sub == "add" && fs.NArg() >= 2:
		req := map[string]any{"name": fs.Arg(0), "urls": fs.Args()[1:]}
		if *secretFile != "" {
			b, err := os.ReadFile(*secretFile)
			if err != nil {
				return secretFileError("--secret-file", *secretFile, err)
			}
			req["secret"] = strings.TrimSpace(string(b))
		}
		if _, err := c.DoJSON(ctx, http.MethodPost, "/admin/peers", req, &r); err != nil {
			return asWrite(err)
		}
	case sub == "remove" && fs.NArg() == 1:
		if _, err := c.Do(ctx, http.MethodDelete, "/admin/peers/"+url.PathEscape(fs.Arg(0)), nil, nil, &r); err != nil {
			return asWrite(err)
		}
	case sub == "show" && fs.NArg() == 1:
		if _, err := c.Do(ctx, http.MethodGet, "/admin/peers/"+url.PathEscape(fs.Arg(0)), nil, nil, &r); err != nil {
			return err
		}
	default:
		return usagef("usage:\n%s", peerUsage)
	}
	return cf.out.print(r, func(w io.Writer) {
		switch {
		case r.Removed:
			fmt.Fprintf(w, "peer %s removed: its link stopped, the stream is no longer kept for it; added again, it is re-seeded\n", r.Name)
		default:
			secret := "none (its certificate authenticates it)"
			if r.Secret {
				secret = "sealed in the cluster's log"
			}
			fmt.Fprintf(w, "peer     %s\nurls     %s\nsecret   %s\nadded at log index %d\n", r.Name, strings.Join(r.URLs, " "), secret, r.AddedAt)
		}
	})
}
