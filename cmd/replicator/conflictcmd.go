package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/client"
)

const conflictsUsage = `replicator conflicts [--key K | --prefix P] [--since 1h|TIME] [--limit N] [-o json]
    what last-writer-wins discarded although the winner had not seen it
replicator conflicts restore ID
    write the lost version back, only while the key still holds the winner`

// runConflicts lists the conflict log of the node's cluster.
func runConflicts(args []string) error {
	fs := flag.NewFlagSet("conflicts", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var q client.ConflictQuery
	var since string
	limit := 0
	fs.StringVar(&q.Key, "key", "", "only the records of this key")
	fs.StringVar(&q.Prefix, "prefix", "", "only the records of keys under this prefix")
	fs.StringVar(&since, "since", "", "only records logged since: a duration back from now (1h) or an RFC 3339 time")
	fs.IntVar(&limit, "limit", 100, "print at most this many records (0: all)")
	if err := parse(fs, args); err != nil {
		return err
	}
	restore := fs.NArg() == 2 && fs.Arg(0) == "restore"
	if fs.NArg() != 0 && !restore {
		return usagef("usage:\n%s", conflictsUsage)
	}
	if since != "" {
		if d, err := time.ParseDuration(since); err == nil {
			q.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339Nano, since); err == nil {
			q.Since = t
		} else {
			return usagef("--since %q: want a duration (1h) or an RFC 3339 time", since)
		}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	if restore {
		res, err := c.RestoreConflict(ctx, fs.Arg(1))
		if err != nil {
			var ce *client.Error
			if client.MayHaveWritten(err) && !(errors.As(err, &ce) && ce.Status < 500) {
				// The record says so once the restore is written.
				return fmt.Errorf("%w\nthe restore may or may not have happened: run it again, it answers 'restored' if it did", err)
			}
			return err
		}
		return cf.out.print(writeOut{res, res.Replayed}, func(w io.Writer) {
			fmt.Fprintf(w, "%s\trestored\tversion %s\torigin %s\n", res.Key, res.Version, res.Origin)
		})
	}
	var all []client.Conflict
	for {
		q.Limit = 1000
		if limit > 0 {
			q.Limit = min(1000, limit-len(all))
		}
		p, err := c.Conflicts(ctx, q)
		if err != nil {
			return err
		}
		all = append(all, p.Items...)
		if p.Next == "" || len(p.Items) == 0 || (limit > 0 && len(all) >= limit) {
			break
		}
		q.After = p.Next
	}
	return cf.out.print(client.ConflictPage{Items: all}, func(w io.Writer) { conflictTable(w, all) })
}

func conflictTable(w io.Writer, all []client.Conflict) {
	if len(all) == 0 {
		fmt.Fprintln(w, "no conflicts logged")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKEY\tLOST\tLOST VALUE\tWON\tDISCARDED\tPEER\tLOGGED\tNOTE")
	for _, c := range all {
		note := ""
		switch {
		case c.Restored != "":
			note = "restored as " + c.Restored
		case c.Possible:
			note = "possible (winner sent no context)"
		}
		if len(c.Aliases) > 0 {
			note = strings.TrimPrefix(note+"; was "+strings.Join(c.Aliases, ", "), "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Key, versionTime(c.Loser), lostValue(c.Loser), versionTime(c.Winner),
			c.Discarded, c.Peer, c.Time.UTC().Format(time.RFC3339), note)
	}
	tw.Flush()
}

// lostValue is a discarded value as a table shows it: short text as is,
// anything else by its size.
func lostValue(v client.ConflictVersion) string {
	switch {
	case v.Deleted:
		return "(deleted)"
	case v.ValueOmitted || !utf8.Valid(v.Value):
		return fmt.Sprintf("(%s, sha256 %.12s)", human(int64(v.ValueLen)), v.ValueSHA256)
	case len(v.Value) > 40:
		return fmt.Sprintf("%q...", v.Value[:37])
	}
	return fmt.Sprintf("%q", v.Value)
}

// versionTime is a version as a table shows it: the HLC and origin, with
// the wall clock a person reads beside it.
func versionTime(v client.ConflictVersion) string {
	if v.Time.IsZero() {
		return v.Version // a server before it said no time
	}
	return v.Version + " (" + v.Time.UTC().Format("2006-01-02T15:04:05.000Z") + ")"
}
