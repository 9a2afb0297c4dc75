// Package backup takes a consistent copy of a running node's data and
// writes it out as a data directory a node can start from (`replicator
// backup`, docs/OPERATIONS.md "Online backups").
//
// A backup is the node's tree as a Pebble checkpoint (every command the
// state machine applied before it, none half: each command is one batch),
// with the identity files (CLUSTER_ID, NODE_ID) and a manifest, streamed
// as a tar. It holds no raft log: restored, a node alone finds its log
// shorter than its tree and begins a new stream, and the first peer that
// holds writes the copy lacks makes it rejoin (what the peers received
// comes back); a node of several comes back as a new member and takes
// what the copy lacks from its leader. It holds no secret: link secrets,
// tokens and keys are files the operator gives by flags, never in the data
// directory.
package backup

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ManifestFile names the manifest in a backup and in the data directory
// extracted from it.
const ManifestFile = "BACKUP.json"

// Manifest says what a backup holds.
type Manifest struct {
	Version int       `json:"version"` // 1
	Cluster string    `json:"cluster"`
	Node    string    `json:"node"`
	TakenAt time.Time `json:"taken_at"`
	// Incarnation is the node's incarnation when it was taken: a node of
	// several starts from the copy only as another (`replicator restore`
	// gives it one).
	Incarnation string `json:"incarnation"`
	// Applied is the last command of the cluster's log the state machine
	// had applied when the copy was taken (the copy holds at least that).
	Applied uint64 `json:"applied"`
	// Servers is how many raft servers the node's cluster had.
	Servers int `json:"servers"`
	// Files and Bytes are what the copy of the tree holds.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Source is what a backup is taken of.
type Source struct {
	// Dir is the node's data directory: the checkpoint is made in it (hard
	// links need the same file system) and removed after.
	Dir string
	// Checkpoint writes a consistent copy of the tree into a directory
	// that does not exist (store.Store.Checkpoint).
	Checkpoint func(dir string) error
	// Applied is the state machine's last applied command.
	Applied func() uint64
	Manifest
}

// ErrExists refuses to extract into a directory that holds something.
var ErrExists = errors.New("backup: the target directory exists and is not empty")

// Write streams a backup of src to w as a tar, and returns its manifest.
// A ctx that ends stops it; the checkpoint is removed either way.
func Write(ctx context.Context, w io.Writer, src Source) (Manifest, error) {
	m := src.Manifest
	m.Version = 1
	m.Applied = src.Applied()
	tmp := filepath.Join(src.Dir, fmt.Sprintf("backup-%d", time.Now().UnixNano()))
	if err := src.Checkpoint(tmp); err != nil {
		os.RemoveAll(tmp)
		return m, fmt.Errorf("backup: checkpoint: %w", err)
	}
	defer os.RemoveAll(tmp)
	var files []string
	err := filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tmp, p)
		files = append(files, rel)
		m.Files++
		m.Bytes += info.Size()
		return nil
	})
	if err != nil {
		return m, fmt.Errorf("backup: list the checkpoint: %w", err)
	}
	tw := tar.NewWriter(w)
	man, _ := json.MarshalIndent(m, "", "  ")
	for name, body := range map[string][]byte{ManifestFile: append(man, '\n'), "CLUSTER_ID": []byte(m.Cluster + "\n"), "NODE_ID": []byte(m.Node + "\n")} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), ModTime: m.TakenAt}); err != nil {
			return m, err
		}
		if _, err := tw.Write(body); err != nil {
			return m, err
		}
	}
	for _, rel := range files {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		if err := addFile(tw, filepath.Join(tmp, rel), "store/"+filepath.ToSlash(rel)); err != nil {
			return m, err
		}
	}
	return m, tw.Close()
}

func addFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: info.Size(), ModTime: info.ModTime()}); err != nil {
		return err
	}
	// The checkpoint's files are hard links to immutable tables and a
	// copy of the WAL: their size does not change while they are read.
	if _, err := io.CopyN(tw, f, info.Size()); err != nil {
		return fmt.Errorf("backup: %s: %w", name, err)
	}
	return nil
}

// Extract writes the backup read from r into dir (created; it must not
// exist or be empty), every file synced, and returns its manifest. A
// backup cut short (the node went away, the stream was damaged) is an
// error, and dir is then left for the caller to remove.
func Extract(r io.Reader, dir string) (Manifest, error) {
	var m Manifest
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return m, fmt.Errorf("%w: %s", ErrExists, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return m, err
	}
	tr := tar.NewReader(r)
	seen := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return m, fmt.Errorf("backup: read: %w", err)
		}
		name := filepath.FromSlash(h.Name)
		if h.Typeflag != tar.TypeReg || !filepath.IsLocal(name) || !(strings.HasPrefix(h.Name, "store/") || !strings.Contains(h.Name, "/")) {
			return m, fmt.Errorf("backup: read: unexpected entry %q", h.Name)
		}
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return m, err
		}
		if h.Name == ManifestFile {
			b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
			if err != nil {
				return m, fmt.Errorf("backup: read the manifest: %w", err)
			}
			if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
				return m, fmt.Errorf("backup: the manifest is not one this build reads (%v)", err)
			}
			seen = true
			if err := writeFile(path, strings.NewReader(string(b)), int64(len(b))); err != nil {
				return m, err
			}
			continue
		}
		if err := writeFile(path, tr, h.Size); err != nil {
			return m, err
		}
	}
	if !seen {
		return m, errors.New("backup: read: no manifest (not a backup)")
	}
	return m, syncDirs(dir)
}

func writeFile(path string, r io.Reader, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, r, size); err != nil {
		f.Close()
		return fmt.Errorf("backup: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncDirs syncs dir and every directory under it (the files' names).
func syncDirs(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

// Read returns the manifest of an extracted backup in dir (ok false: dir
// holds none).
func Read(dir string) (Manifest, bool, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, false, fmt.Errorf("backup: %s: %w", ManifestFile, err)
	}
	return m, true, nil
}
