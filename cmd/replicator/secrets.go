package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/replicator/replicator/internal/secret"
)

// A link's secret file holds one secret, or two during a rotation: the
// first is the one the link sends, the second one it also takes, for
// --secret-overlap after it appeared (docs/OPERATIONS.md "Rotating a
// link's secret"). SIGHUP rereads every peer's file.

// readSecretFile reads a peer's secret file: one secret per line, the
// first sent, the second (if any) also taken.
func readSecretFile(path string) (send, also string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", secretFileError("secret file", path, err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	switch {
	case len(lines) == 0:
		return "", "", fmt.Errorf("secret file %s is empty", path)
	case len(lines) > 2:
		return "", "", fmt.Errorf("secret file %s holds %d secrets: at most two (the one sent, then one also taken during a rotation)", path, len(lines))
	case len(lines) == 2:
		return lines[0], lines[1], nil
	}
	return lines[0], "", nil
}

// secretPairs are the links' secret pairs the files made, with when each
// second secret first appeared (its overlap counts from there, not from
// each reload).
var secretPairs struct {
	sync.Mutex
	pairs map[string]*secret.Pair
	since map[string]struct {
		also string
		at   time.Time
	}
}

// secretPair makes (or, on a reload, updates) the pair of peer's link.
func (cfg *serveConfig) secretPair(peer, send, also string) *secret.Pair {
	secretPairs.Lock()
	defer secretPairs.Unlock()
	if secretPairs.pairs == nil {
		secretPairs.pairs = map[string]*secret.Pair{}
		secretPairs.since = map[string]struct {
			also string
			at   time.Time
		}{}
	}
	var until int64
	if also != "" {
		s, ok := secretPairs.since[peer]
		if !ok || s.also != also {
			s.also, s.at = also, time.Now()
			secretPairs.since[peer] = s
		}
		until = s.at.Add(time.Duration(cfg.SecretOverlap)).UnixNano()
	} else {
		delete(secretPairs.since, peer)
	}
	p, ok := secretPairs.pairs[peer]
	if !ok {
		p = secret.NewPair(send, also, until)
		secretPairs.pairs[peer] = p
	} else {
		p.Set(send, also, until)
	}
	return p
}

// reloadSecrets rereads every peer's secret file (SIGHUP): a file that
// does not read leaves the link's secrets as they were.
func (cfg *serveConfig) reloadSecrets(log *slog.Logger) {
	for name, p := range cfg.Peers {
		if p.SecretFile == "" {
			continue
		}
		send, also, err := readSecretFile(p.SecretFile)
		if err != nil {
			log.Error("peer secret not reloaded: the link keeps its secrets", "peer", name, "err", err)
			continue
		}
		pair := cfg.secretPair(name, send, also)
		_, sendID := pair.Send()
		if a := pair.Also(time.Now().UnixNano()); a != "" {
			log.Warn("the link sends one secret and takes another too, for a rotation: finish it on both clusters "+
				"(docs/OPERATIONS.md \"Rotating a link's secret\")", "peer", name, "sends", sendID, "also_takes", secret.KeyID(a),
				"until", time.Unix(0, secretPairs.since[name].at.Add(time.Duration(cfg.SecretOverlap)).UnixNano()).UTC().Format(time.RFC3339))
		} else {
			log.Info("peer secret reloaded", "peer", name, "sends", sendID)
		}
	}
}
