package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/policy"
)

type clientFlags struct {
	addr      string
	timeout   time.Duration
	idemKey   string
	retries   int
	token     string
	tokenFile string
	caFile    string
	out       outputFlags
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", envAddr(), "node API base URL (or $REPLICATOR_ADDR)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "overall deadline, retries included")
	fs.StringVar(&c.tokenFile, "token-file", os.Getenv("REPLICATOR_TOKEN_FILE"), "file with the API bearer token (or $REPLICATOR_TOKEN_FILE)")
	fs.StringVar(&c.caFile, "ca-file", "", "PEM CA to verify an https node")
	c.out.register(fs)
}

func (c *clientFlags) registerWrite(fs *flag.FlagSet) {
	fs.StringVar(&c.idemKey, "idempotency-key", "", "send this Idempotency-Key: a retry under it replays instead of writing twice")
	fs.IntVar(&c.retries, "retries", 0, "with --idempotency-key: retry transient failures up to this many times")
}

func (c *clientFlags) client() (*client.Client, error) {
	if err := c.out.check(); err != nil {
		return nil, err
	}
	o := &client.Options{}
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		o.Token = strings.TrimSpace(string(b))
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", c.caFile)
		}
		o.HTTPClient = &http.Client{Timeout: c.timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	if c.retries > 0 {
		if c.idemKey == "" {
			return nil, usagef("--retries needs --idempotency-key: a write is never retried without an identity")
		}
		p, err := policy.New(policy.Options{MaxAttempts: c.retries + 1, OnRetry: func(n int, d time.Duration, err error) {
			fmt.Fprintf(os.Stderr, "attempt %d failed (%v); retrying in %s\n", n, err, d.Round(time.Millisecond))
		}})
		if err != nil {
			return nil, err
		}
		o.Retry = p
	}
	base, err := nodeURL(c.addr, c.caFile != "")
	if err != nil {
		return nil, err
	}
	return client.New(base, o), nil
}

// nodeURL is the base URL --addr names. Like etcdctl's endpoints and
// CONSUL_HTTP_ADDR, it takes host:port without a scheme: http, or https
// when a CA is given to verify the node.
func nodeURL(addr string, secure bool) (string, error) {
	if !strings.Contains(addr, "://") {
		scheme := "http://"
		if secure {
			scheme = "https://"
		}
		addr = scheme + addr
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usagef("--addr %q: want host:port, or http(s)://host:port", strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://"))
	}
	return strings.TrimRight(addr, "/"), nil
}

// scope pins the --idempotency-key on ctx, if given.
func (c *clientFlags) scope(ctx context.Context) context.Context {
	if c.idemKey == "" {
		return ctx
	}
	return policy.WithKey(ctx, policy.Key{ID: c.idemKey})
}

func runClient(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var so client.ScanOptions
	if cmd == "put" || cmd == "del" {
		cf.registerWrite(fs)
	}
	var ttl time.Duration
	if cmd == "put" {
		fs.DurationVar(&ttl, "ttl", 0, "the value expires this long after the node takes it (30s, 1h; 0: never)")
	}
	if cmd == "scan" {
		fs.StringVar(&so.Prefix, "prefix", "", "only keys with this prefix")
		fs.StringVar(&so.Start, "start", "", "first key (inclusive)")
		fs.StringVar(&so.End, "end", "", "last key (exclusive)")
		fs.IntVar(&so.Limit, "limit", 0, "at most this many keys (0: all)")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	ctx = cf.scope(ctx)
	c, err := cf.client()
	if err != nil {
		return err
	}
	want := map[string]int{"put": 2, "get": 1, "del": 1, "scan": 0}[cmd]
	if fs.NArg() != want {
		return usagef("want %d argument(s), got %d", want, fs.NArg())
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
		if ttl < 0 {
			return usagef("--ttl %s: want a positive duration", ttl)
		}
		res, err := c.PutWith(ctx, fs.Arg(0), value, client.WriteOptions{TTL: ttl})
		if err != nil {
			return unknownOutcome(err, cf.idemKey)
		}
		return cf.out.print(writeOut{res, res.Replayed}, func(w io.Writer) {
			fmt.Fprintf(w, "%s\tversion %s\torigin %s%s\n", res.Key, res.Version, res.Origin, replayed(res))
		})
	case "get":
		v, err := c.Get(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		out := newValueOut(fs.Arg(0), v.Value, v.Version, v.Origin)
		if !v.Expires.IsZero() {
			out.Expires = v.Expires.UTC().Format(time.RFC3339Nano)
		}
		return cf.out.print(out, func(w io.Writer) {
			// the value as is, so `get K > file` round-trips; its version aside
			w.Write(v.Value)
			if len(v.Value) > 0 && v.Value[len(v.Value)-1] != '\n' {
				fmt.Fprintln(w)
			}
			expires := ""
			if out.Expires != "" {
				expires = " expires " + out.Expires
			}
			fmt.Fprintf(os.Stderr, "version %s origin %s%s\n", v.Version, v.Origin, expires)
		})
	case "del":
		res, err := c.Delete(ctx, fs.Arg(0))
		if err != nil {
			return unknownOutcome(err, cf.idemKey)
		}
		return cf.out.print(writeOut{res, res.Replayed}, func(w io.Writer) {
			if res.Version == "" {
				// A delete removes only what this cluster holds: nothing.
				fmt.Fprintf(w, "%s\tabsent\tnothing to delete, nothing written\n", res.Key)
				return
			}
			fmt.Fprintf(w, "%s\tdeleted\tversion %s%s\n", res.Key, res.Version, replayed(res))
		})
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
		out := struct {
			Items []valueOut `json:"items"`
		}{Items: []valueOut{}}
		for _, it := range items {
			out.Items = append(out.Items, newValueOut(it.Key, it.Value, it.Version, it.Origin))
		}
		return cf.out.print(out, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tVALUE\tVERSION\tORIGIN")
			for _, it := range items {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", it.Key, printable(it.Value), it.Version, it.Origin)
			}
			tw.Flush()
		})
	}
	return nil
}

func replayed(r client.WriteResult) string {
	if r.Replayed {
		return "\t(replayed: an earlier attempt under this key did the write)"
	}
	return ""
}

// unknownOutcome tells the user what a failed write means, as the server
// and the connection tell it: nothing written, or maybe, and how to find
// out (docs/OPERATIONS.md, "Errors").
func unknownOutcome(err error, key string) error {
	var ce *client.Error
	switch {
	case errors.As(err, &ce) && ce.Status < 500:
		return err // refused: nothing was written, the message says why
	case !client.MayHaveWritten(err):
		return fmt.Errorf("%w\nnothing was written", err)
	case key == "":
		return fmt.Errorf("%w\nthe write may or may not have happened; next time send --idempotency-key to be able to ask", err)
	}
	return fmt.Errorf("%w\nthe write may or may not have happened: ask with 'replicator outcome --idempotency-key %s'", err, key)
}

// runOutcome looks up what an Idempotency-Key's request was answered
// (`status --idempotency-key K`, its first name, still runs it).
func runOutcome(args []string) error {
	fs := flag.NewFlagSet("outcome", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	key := fs.String("idempotency-key", "", "the key to look up (or as the argument)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *key == "" && fs.NArg() == 1 {
		*key = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usagef("want one key, as --idempotency-key K or as the argument")
	}
	if *key == "" {
		return usagef("--idempotency-key is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	c, err := cf.client()
	if err != nil {
		return err
	}
	rec, err := c.Idempotency(ctx, *key)
	type statusOut struct {
		Key   string `json:"key"`
		Found bool   `json:"found"`
		*client.IdempotencyRecord
	}
	if client.IsNotFound(err) {
		return cf.out.print(statusOut{Key: *key}, func(w io.Writer) {
			fmt.Fprintf(w, "no record of %q on this cluster: the request did not take effect here (yet); if it was sent elsewhere, replication may still bring it\n", *key)
		})
	}
	if err != nil {
		return err
	}
	return cf.out.print(statusOut{Key: rec.Key, Found: true, IdempotencyRecord: &rec}, func(w io.Writer) {
		fmt.Fprintf(w, "key      %s\nanswered %d %s\nversion  %s\norigin   %s\nexpires  %s\n", rec.Key, rec.Status,
			strings.TrimSpace(string(rec.Body)), rec.Version, rec.Origin, rec.Expires.Format(time.RFC3339))
	})
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

// runHealthcheck asks /healthz: liveness only (a saturated node is alive);
// with --ready, /readyz (takes traffic); with --wait, until it passes.
func runHealthcheck(args []string) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	ready := fs.Bool("ready", false, "ask /readyz (the node takes reads and writes) instead of /healthz (the process answers)")
	wait := fs.Duration("wait", 0, "ask again until the check passes or this long has passed (a script waiting for a node it started)")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), min(cf.timeout, 3*time.Second))
		defer cancel()
		if *ready {
			return c.Ready(ctx)
		}
		return c.Healthy(ctx)
	}
	deadline := time.Now().Add(*wait)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
