package origin

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/replicator/replicator/internal/atomicfile"
)

// A node of a cluster of several is a raft voter: it must never forget a
// vote it cast or an entry it acknowledged. Its memory is its data
// directory, so its raft identity lives and dies with it (issue 24,
// docs/CLUSTER.md "A node's identity"): each data directory mints an
// incarnation at its first start, and raft knows the node as (node ID,
// incarnation). A wiped directory mints a new one, so the node comes back
// as a new member that nobody counts a vote from until it caught up.
//
// A whole-directory copy carries its incarnation with it, and with it the
// memory of a past moment: a voter put back from a copy would forget what
// it acknowledged since. `replicator restore` mints a new incarnation for
// such a directory; a raw copy is detected where it can be: the
// INCARNATION file records which file NODE_ID is (its inode, and its birth
// time where the file system keeps one), and every copy (cp, rsync, tar, a
// file-level backup tool) writes NODE_ID anew. A block-level snapshot of
// the whole file system keeps both and is not detected.

// IncarnationFile names the data directory's incarnation record.
const IncarnationFile = "INCARNATION"

// nodeIDFile is the file whose identity tells a copied directory apart.
const nodeIDFile = "NODE_ID"

// ErrCopied is the class of errors for a data directory that is a copy of
// another (or was put back from one) and holds a voter's identity.
var ErrCopied = errors.New("origin: the data directory is a copy")

// incarnationPattern is an incarnation's syntax: 8 hex digits.
var incarnationPattern = regexp.MustCompile(`^[0-9a-f]{8}$`)

// ValidIncarnation reports whether inc is an incarnation ("" is the
// identity of a directory that joined a cluster before incarnations).
func ValidIncarnation(inc string) bool { return inc == "" || incarnationPattern.MatchString(inc) }

// fileID says which file a path is.
type fileID struct {
	Ino   uint64 `json:"ino"`
	Btime int64  `json:"btime_ns,omitempty"`
}

type incarnationRecord struct {
	Incarnation string `json:"incarnation"`
	// NodeIDFile is which file NODE_ID was when the record was written.
	NodeIDFile *fileID `json:"node_id_file,omitempty"`
}

func readIncarnation(dir string) (incarnationRecord, bool, error) {
	var r incarnationRecord
	b, err := os.ReadFile(filepath.Join(dir, IncarnationFile))
	if errors.Is(err, os.ErrNotExist) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("origin: incarnation: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil || !ValidIncarnation(r.Incarnation) {
		return r, false, fmt.Errorf("origin: %s is not an incarnation record (%v): a node of several must not guess its raft identity; "+
			"if the directory was wiped or restored, run `replicator restore --data %s`", filepath.Join(dir, IncarnationFile), err, dir)
	}
	return r, true, nil
}

func writeIncarnation(dir, inc string) error {
	r := incarnationRecord{Incarnation: inc}
	if id, ok, err := identify(filepath.Join(dir, nodeIDFile)); err != nil {
		return fmt.Errorf("origin: incarnation: %w", err)
	} else if ok {
		r.NodeIDFile = &id
	}
	b, _ := json.Marshal(r)
	if err := atomicfile.Write(filepath.Join(dir, IncarnationFile), append(b, '\n')); err != nil {
		return fmt.Errorf("origin: incarnation: %w", err)
	}
	return nil
}

func mint() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Incarnation returns the data directory's incarnation, minting one at the
// first start. legacy says the directory already belongs to a raft group
// under its bare node ID (a build before incarnations): it keeps that
// identity (incarnation "") until it is wiped or restored.
func Incarnation(dir string, legacy bool) (string, error) {
	r, ok, err := readIncarnation(dir)
	if err != nil || ok {
		return r.Incarnation, err
	}
	inc := mint()
	if legacy {
		inc = ""
	}
	return inc, writeIncarnation(dir, inc)
}

// NewIncarnation gives the data directory a new incarnation (a restore):
// the node comes back as a new member.
func NewIncarnation(dir string) (string, error) {
	inc := mint()
	return inc, writeIncarnation(dir, inc)
}

// Refingerprint records which file NODE_ID is now: the directory is this
// node's own from here on (a node alone, or `replicator restore`).
func Refingerprint(dir string) error {
	r, ok, err := readIncarnation(dir)
	if err != nil || !ok {
		return err
	}
	return writeIncarnation(dir, r.Incarnation)
}

// CheckNotCopied refuses a data directory whose NODE_ID is not the file the
// incarnation record names: the directory (or NODE_ID) was copied since.
func CheckNotCopied(dir string) error {
	r, ok, err := readIncarnation(dir)
	if err != nil || !ok || r.NodeIDFile == nil {
		return err
	}
	now, ok, err := identify(filepath.Join(dir, nodeIDFile))
	if err != nil || !ok {
		return err
	}
	if now.Ino == r.NodeIDFile.Ino && (now.Btime == 0 || r.NodeIDFile.Btime == 0 || now.Btime == r.NodeIDFile.Btime) {
		return nil
	}
	return fmt.Errorf("%w: %s was written since its incarnation %q was recorded (file %d, was %d): it was copied or put back from a "+
		"backup, and a voter put back from a copy would forget what it acknowledged since. Run `replicator restore --data %s`: "+
		"the node comes back as a new incarnation and catches up from the cluster (docs/OPERATIONS.md \"Restoring a node of a cluster of several\")",
		ErrCopied, filepath.Join(dir, nodeIDFile), r.Incarnation, now.Ino, r.NodeIDFile.Ino, dir)
}
