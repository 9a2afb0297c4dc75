package membership

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/replicator/replicator/internal/atomicfile"
	"github.com/replicator/replicator/origin"
)

// ResolveNodeID returns this node's ID: the data directory's, minted at its
// first start (or the one asked for then). A directory keeps its ID: the
// raft configuration names the node by it.
func ResolveNodeID(dir, want string) (string, error) {
	path := filepath.Join(dir, "NODE_ID")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		have := strings.TrimSpace(string(b))
		if want != "" && want != have {
			return "", fmt.Errorf("membership: --node-id %s, but the data directory %s belongs to node %s: start it as %s (or omit --node-id), or give %s an empty data directory",
				want, dir, have, have, want)
		}
		return have, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("membership: node id: %w", err)
	}
	id := want
	if id == "" {
		var r [4]byte
		rand.Read(r[:])
		id = hex.EncodeToString(r[:])
	}
	if err := atomicfile.Write(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("membership: node id: %w", err)
	}
	return id, nil
}

// MemberIncarnation returns the incarnation of a node of several's data
// directory, minted at its first start (origin.Incarnation): raft knows a
// node of several by its node ID and incarnation, so a wiped directory
// comes back as a new member. A directory that joined a group before
// incarnations keeps its bare node ID. A directory copied since its
// incarnation was recorded is refused (it would forget what it
// acknowledged since the copy). hasRaft: the directory holds raft state.
func MemberIncarnation(dir string, hasRaft bool, log *slog.Logger) (string, error) {
	_, err := os.Stat(filepath.Join(dir, origin.IncarnationFile))
	recorded := err == nil
	if !hasRaft && recorded {
		// Its raft state is gone (a partial wipe, identity files kept on
		// another volume): whatever it voted or acknowledged as its old
		// incarnation is forgotten, so it is a new one.
		inc, err := origin.NewIncarnation(dir)
		if err == nil {
			log.Warn("no raft state beside the incarnation record: this node comes back as a new incarnation", "incarnation", inc)
		}
		return inc, err
	}
	inc, err := origin.Incarnation(dir, hasRaft && !recorded)
	if err != nil {
		return "", err
	}
	if hasRaft {
		err = origin.CheckNotCopied(dir)
	}
	return inc, err
}

// AloneIncarnation returns the incarnation of a node alone's data
// directory (see MemberIncarnation); a copied directory is made its own
// (a node alone has no voter to fool).
func AloneIncarnation(dir string, hasRaft bool) (string, error) {
	_, err := os.Stat(filepath.Join(dir, origin.IncarnationFile))
	inc, err := origin.Incarnation(dir, hasRaft && err != nil)
	if err != nil {
		return "", err
	}
	return inc, origin.Refingerprint(dir)
}
