package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hlc"
)

func offsetClock(d time.Duration) hlc.PhysicalClock {
	return hlc.OffsetClock{Base: hlc.SystemClock{}, Offset: d}
}

type clientFlags struct {
	addr    string
	timeout time.Duration
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "http://127.0.0.1:7400", "node API base URL")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "request timeout")
}

func (c *clientFlags) client() *client.Client { return client.New(c.addr, nil) }

func runClient(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var so client.ScanOptions
	if cmd == "scan" {
		fs.StringVar(&so.Prefix, "prefix", "", "only keys with this prefix")
		fs.StringVar(&so.Start, "start", "", "first key (inclusive)")
		fs.StringVar(&so.End, "end", "", "last key (exclusive)")
		fs.IntVar(&so.Limit, "limit", 0, "at most this many keys (0: all)")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	c := cf.client()
	want := map[string]int{"put": 2, "get": 1, "del": 1, "scan": 0}[cmd]
	if fs.NArg() != want {
		return fmt.Errorf("want %d argument(s), got %d", want, fs.NArg())
	}
	switch cmd {
	case "put":
		value := []byte(fs.Arg(1))
		if fs.Arg(1) == "-" {
			b, err := io.ReadAll(os.Stdin)
			if err != nil {
				return err
			}
			value = b
		}
		res, err := c.Put(ctx, fs.Arg(0), value)
		if err != nil {
			return err
		}
		fmt.Printf("%s\tversion %s\torigin %s\n", res.Key, res.Version, res.Origin)
	case "get":
		v, err := c.Get(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		os.Stdout.Write(v.Value)
		if len(v.Value) > 0 && v.Value[len(v.Value)-1] != '\n' {
			fmt.Println()
		}
		fmt.Fprintf(os.Stderr, "version %s origin %s\n", v.Version, v.Origin)
	case "del":
		res, err := c.Delete(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Printf("%s\tdeleted\tversion %s\n", res.Key, res.Version)
	case "scan":
		var items []client.Item
		var err error
		if so.Limit > 0 {
			var p client.Page
			p, err = c.Scan(ctx, so)
			items = p.Items
		} else {
			items, err = c.ScanAll(ctx, so)
		}
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tVALUE\tVERSION\tORIGIN")
		for _, it := range items {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", it.Key, printable(it.Value), it.Version, it.Origin)
		}
		tw.Flush()
	}
	return nil
}

// printable shows a value in a table: text as is (cut at 60 bytes), binary
// as its length.
func printable(v []byte) string {
	for _, b := range v {
		if b < 0x20 || b > 0x7e {
			return fmt.Sprintf("<%d bytes>", len(v))
		}
	}
	if len(v) > 60 {
		return string(v[:57]) + "..."
	}
	return string(v)
}
