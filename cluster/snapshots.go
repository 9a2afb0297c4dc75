package cluster

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/atomicfile"
)

// Snapshots are directories (docs/CLUSTER.md): meta.json (raft's
// metadata), head (the state machine's document, what it applied) and, in
// a cluster of several, tree/ (a checkpoint of the whole tree: hard links
// to its tables). Taking one costs a checkpoint, never a copy of the data;
// compacting the raft log after it never loses an unshipped entry, which
// lives in the tree. Open streams head and tree as one stream of known size,
// which raft sends to a follower that lags behind the log, and the
// follower's sink unpacks it into a directory as it arrives:
//
//	head (JSON, then '\n') | 0 (no tree) or 1 | files... | u16 0
//	file: u16 len(name) | name | u64 size | bytes
//
// A snapshot is written under a temporary name and renamed once synced; a
// crash leaves only temporary directories, removed at open.

// ErrBadSnapshot is a snapshot stream or directory that does not parse.
var ErrBadSnapshot = errors.New("cluster: malformed snapshot")

// TreeSink is the sink a state machine persists a snapshot into: its head,
// and the checkpoint directory it took, adopted (renamed) as the tree.
type TreeSink interface {
	raft.SnapshotSink
	SetHead(head []byte)
	AdoptTree(dir string) error
}

// TreeSnapshot is what Open returns: the stream, and the snapshot's
// directory, so that a state machine restoring it can use the tree in
// place instead of reading the stream.
type TreeSnapshot interface {
	io.ReadCloser
	Head() []byte
	// TreeDir is the tree's directory ("" when the snapshot has none).
	TreeDir() string
}

const (
	snapMeta = "meta.json"
	snapHead = "head"
	snapTree = "tree"
	snapTmp  = ".tmp"
	maxHead  = 1 << 20
	maxName  = 255
	// diskReserve is left free by a snapshot being received: a stream
	// whose files announce more than the free space less this is
	// refused at the file that does, before its bytes are written (a
	// file announced at 2^62 bytes used to be written until the stream
	// ended).
	diskReserve = 64 << 20
)

var (
	// maxFiles bounds the files of a snapshot stream (issue 25, finding
	// 9: a stream of 20,001 files was taken whole). A checkpoint of the
	// tree has a few files per level plus its 64 MiB tables: 10,000 of
	// them is a tree of over 600 GiB. (A variable for tests.)
	maxFiles = 10_000
)

const (
	keepSnaps  = 2
	treeMarker = 1
)

// dirSnapshots is the raft.SnapshotStore of a group.
type dirSnapshots struct {
	dir string
	mu  sync.Mutex // serialises reaping
}

func openSnapshots(dir string) (*dirSnapshots, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: snapshots: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshots: %w", err)
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		switch {
		case strings.HasSuffix(e.Name(), snapTmp):
			os.RemoveAll(path) // a crash during Create
		case e.IsDir():
			// A snapshot's meta is synced before it is renamed in place and
			// removed first when it is reaped: without one, a crash cut its
			// reap short, and its tree's hard links would hold old tables.
			if _, err := os.Stat(filepath.Join(path, snapMeta)); errors.Is(err, os.ErrNotExist) {
				os.RemoveAll(path)
			}
		}
	}
	return &dirSnapshots{dir: dir}, nil
}

func (s *dirSnapshots) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	if version != 1 {
		return nil, fmt.Errorf("cluster: snapshot version %d, this build writes 1", version)
	}
	id := fmt.Sprintf("%d-%d-%d", term, index, time.Now().UnixNano())
	tmp := filepath.Join(s.dir, id+snapTmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: snapshot: %w", err)
	}
	meta := raft.SnapshotMeta{Version: version, ID: id, Index: index, Term: term, Configuration: configuration,
		ConfigurationIndex: configurationIndex, Peers: encodePeers(configuration, trans)}
	return &dirSink{store: s, tmp: tmp, final: filepath.Join(s.dir, id), meta: meta}, nil
}

func encodePeers(c raft.Configuration, trans raft.Transport) []byte {
	var peers []string
	for _, sv := range c.Servers {
		if sv.Suffrage == raft.Voter {
			peers = append(peers, string(trans.EncodePeer(sv.ID, sv.Address)))
		}
	}
	b, _ := json.Marshal(peers)
	return b
}

func (s *dirSnapshots) List() ([]*raft.SnapshotMeta, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshots: %w", err)
	}
	var out []*raft.SnapshotMeta
	for _, e := range ents {
		if !e.IsDir() || strings.HasSuffix(e.Name(), snapTmp) {
			continue
		}
		m, err := readMeta(filepath.Join(s.dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // half reaped: its meta goes first
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Term != out[j].Term {
			return out[i].Term > out[j].Term
		}
		if out[i].Index != out[j].Index {
			return out[i].Index > out[j].Index
		}
		return out[i].ID > out[j].ID
	})
	return out, nil
}

func readMeta(dir string) (*raft.SnapshotMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, snapMeta))
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshot %s: %w", dir, err)
	}
	var m raft.SnapshotMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSnapshot, dir, err)
	}
	return &m, nil
}

func (s *dirSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	if id == "" || strings.ContainsAny(id, `/\`) || strings.HasPrefix(id, ".") {
		return nil, nil, fmt.Errorf("%w: id %q", ErrBadSnapshot, id)
	}
	dir := filepath.Join(s.dir, id)
	m, err := readMeta(dir)
	if err != nil {
		return nil, nil, err
	}
	head, err := os.ReadFile(filepath.Join(dir, snapHead))
	if errors.Is(err, os.ErrNotExist) {
		// Written by raft's file store (a build before tree snapshots):
		// its content is the head alone.
		head, err = readBounded(filepath.Join(dir, "state.bin"), maxHead)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: snapshot %s: %w", id, err)
	}
	if len(head) == 0 || head[len(head)-1] != '\n' {
		return nil, nil, fmt.Errorf("%w: %s: a head without its end", ErrBadSnapshot, id)
	}
	files, size, err := treeFiles(filepath.Join(dir, snapTree))
	if err != nil {
		return nil, nil, err
	}
	m.Size = int64(len(head)) + 1 + size
	r := &snapReader{head: head, dir: dir, files: files}
	if files != nil {
		r.tree = filepath.Join(dir, snapTree)
		// Every file is opened now: a newer snapshot may reap this one
		// while a slow follower is still being sent it, and an open file
		// outlives its name.
		for _, fi := range files {
			f, err := os.Open(filepath.Join(r.tree, fi.Name()))
			if err != nil {
				r.closeFiles()
				return nil, nil, fmt.Errorf("cluster: snapshot %s: %w", id, err)
			}
			r.open = append(r.open, f)
		}
	}
	pr, pw := io.Pipe()
	r.ReadCloser = pr
	go r.stream(pw) // exits when the stream is written or the reader closed
	return m, r, nil
}

// treeFiles lists a tree directory's files and the stream bytes they take
// (nil, 0 when there is no tree).
func treeFiles(dir string) ([]os.FileInfo, int64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: snapshot tree: %w", err)
	}
	files := []os.FileInfo{}
	size := int64(2) // the end mark
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return nil, 0, fmt.Errorf("cluster: snapshot tree: %w", err)
		}
		if !fi.Mode().IsRegular() || len(e.Name()) > maxName {
			return nil, 0, fmt.Errorf("%w: tree entry %q", ErrBadSnapshot, e.Name())
		}
		files = append(files, fi)
		size += 2 + int64(len(e.Name())) + 8 + fi.Size()
	}
	return files, size, nil
}

// snapReader streams a snapshot directory.
type snapReader struct {
	io.ReadCloser
	head  []byte
	dir   string
	tree  string
	files []os.FileInfo
	open  []*os.File // files[i], opened by Open; the stream closes them
}

func (r *snapReader) closeFiles() {
	for _, f := range r.open {
		f.Close()
	}
	r.open = nil
}

func (r *snapReader) Head() []byte    { return r.head }
func (r *snapReader) TreeDir() string { return r.tree }

func (r *snapReader) stream(pw *io.PipeWriter) {
	defer r.closeFiles()
	w := bufio.NewWriterSize(pw, 256<<10)
	err := func() error {
		if _, err := w.Write(r.head); err != nil {
			return err
		}
		if r.files == nil {
			return w.WriteByte(0)
		}
		if err := w.WriteByte(treeMarker); err != nil {
			return err
		}
		var hdr [10]byte
		for i, fi := range r.files {
			binary.BigEndian.PutUint16(hdr[:2], uint16(len(fi.Name())))
			if _, err := w.Write(hdr[:2]); err != nil {
				return err
			}
			if _, err := w.WriteString(fi.Name()); err != nil {
				return err
			}
			binary.BigEndian.PutUint64(hdr[2:], uint64(fi.Size()))
			if _, err := w.Write(hdr[2:]); err != nil {
				return err
			}
			// Exactly the size announced: a file of the checkpoint never
			// changes, and the stream's size was promised.
			k, err := io.Copy(w, io.LimitReader(r.open[i], fi.Size()))
			if err == nil && k != fi.Size() {
				err = fmt.Errorf("%w: %s shrank to %d bytes", ErrBadSnapshot, fi.Name(), k)
			}
			if err != nil {
				return err
			}
		}
		_, err := w.Write([]byte{0, 0})
		return err
	}()
	if err == nil {
		err = w.Flush()
	}
	pw.CloseWithError(err)
}

// dirSink receives a snapshot: from the state machine (SetHead, AdoptTree)
// or as a stream from the leader (Write), unpacked as it arrives.
type dirSink struct {
	store      *dirSnapshots
	tmp, final string
	meta       raft.SnapshotMeta
	head       []byte
	pw         *io.PipeWriter
	unpacked   chan error
	done       bool
}

func (s *dirSink) ID() string { return s.meta.ID }

func (s *dirSink) SetHead(head []byte) { s.head = bytes.Clone(head) }

func (s *dirSink) AdoptTree(dir string) error {
	if err := os.Rename(dir, filepath.Join(s.tmp, snapTree)); err != nil {
		return fmt.Errorf("cluster: snapshot: adopt the tree: %w", err)
	}
	return nil
}

func (s *dirSink) Write(p []byte) (int, error) {
	if s.pw == nil {
		pr, pw := io.Pipe()
		s.pw, s.unpacked = pw, make(chan error, 1)
		go func() { // exits when the stream ends (Close, Cancel)
			err := unpack(pr, s.tmp, &s.head)
			pr.CloseWithError(err)
			s.unpacked <- err
		}()
	}
	return s.pw.Write(p)
}

// unpack reads a snapshot stream into dir (head into *head, files into
// dir/tree), each file synced.
func unpack(r io.Reader, dir string, head *[]byte) error {
	br := bufio.NewReaderSize(r, 256<<10)
	h, err := br.ReadSlice('\n')
	if err != nil {
		return fmt.Errorf("%w: head: %v", ErrBadSnapshot, err)
	}
	if len(h) > maxHead {
		return fmt.Errorf("%w: head of %d bytes", ErrBadSnapshot, len(h))
	}
	*head = bytes.Clone(h)
	mark, err := br.ReadByte()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	switch mark {
	case 0:
		return expectEOF(br)
	case treeMarker:
	default:
		return fmt.Errorf("%w: mark %d", ErrBadSnapshot, mark)
	}
	tree := filepath.Join(dir, snapTree)
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}
	budget, err := freeBytes(tree)
	if err != nil {
		return fmt.Errorf("cluster: snapshot: free space of %s: %w", tree, err)
	}
	budget -= diskReserve
	var hdr [8]byte
	for files := 0; ; files++ {
		if _, err := io.ReadFull(br, hdr[:2]); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		nl := int(binary.BigEndian.Uint16(hdr[:2]))
		if nl == 0 {
			break
		}
		if files >= maxFiles {
			return fmt.Errorf("%w: more than %d files", ErrBadSnapshot, maxFiles)
		}
		if nl > maxName {
			return fmt.Errorf("%w: a name of %d bytes", ErrBadSnapshot, nl)
		}
		name := make([]byte, nl)
		if _, err := io.ReadFull(br, name); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		if !validName(string(name)) {
			return fmt.Errorf("%w: file name %q", ErrBadSnapshot, name)
		}
		if _, err := io.ReadFull(br, hdr[:8]); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		size := int64(binary.BigEndian.Uint64(hdr[:8]))
		if size < 0 {
			return fmt.Errorf("%w: size %d", ErrBadSnapshot, size)
		}
		if size > budget {
			return fmt.Errorf("%w: file %s announces %d bytes, and %d are free for it (%d kept free)",
				ErrBadSnapshot, name, size, max(budget, 0), diskReserve)
		}
		budget -= size
		f, err := os.OpenFile(filepath.Join(tree, string(name)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		k, err := io.CopyN(f, br, size)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: file %s cut at %d of %d bytes", ErrBadSnapshot, name, k, size)
		}
		if err != nil {
			return fmt.Errorf("cluster: snapshot file %s (%d of %d bytes): %w", name, k, size, err)
		}
	}
	if err := atomicfile.SyncDir(tree); err != nil {
		return err
	}
	return expectEOF(br)
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%w: %s over %d bytes", ErrBadSnapshot, path, max)
	}
	return b, err
}

func validName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.ContainsAny(n, "/\\\x00")
}

func expectEOF(br *bufio.Reader) error {
	if _, err := br.ReadByte(); err != io.EOF {
		return fmt.Errorf("%w: bytes after the end", ErrBadSnapshot)
	}
	return nil
}

func (s *dirSink) Close() error {
	if s.done {
		return nil
	}
	s.done = true
	if s.pw != nil {
		s.pw.Close()
		if err := <-s.unpacked; err != nil {
			os.RemoveAll(s.tmp)
			return err
		}
	}
	if len(s.head) == 0 {
		os.RemoveAll(s.tmp)
		return fmt.Errorf("%w: no head", ErrBadSnapshot)
	}
	_, size, err := treeFiles(filepath.Join(s.tmp, snapTree))
	if err != nil {
		os.RemoveAll(s.tmp)
		return err
	}
	s.meta.Size = int64(len(s.head)) + 1 + size
	meta, err := json.Marshal(&s.meta)
	if err == nil {
		err = writeSynced(filepath.Join(s.tmp, snapHead), s.head)
	}
	if err == nil {
		err = writeSynced(filepath.Join(s.tmp, snapMeta), meta)
	}
	if err == nil {
		err = atomicfile.SyncDir(s.tmp)
	}
	if err == nil {
		err = os.Rename(s.tmp, s.final)
	}
	if err == nil {
		err = atomicfile.SyncDir(s.store.dir)
	}
	if err != nil {
		os.RemoveAll(s.tmp)
		return fmt.Errorf("cluster: snapshot %s: %w", s.meta.ID, err)
	}
	return s.store.reap()
}

func (s *dirSink) Cancel() error {
	if s.done {
		return nil
	}
	s.done = true
	if s.pw != nil {
		s.pw.CloseWithError(errors.New("cancelled"))
		<-s.unpacked
	}
	return os.RemoveAll(s.tmp)
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// reap keeps the newest keepSnaps snapshots.
func (s *dirSnapshots) reap() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	metas, err := s.List()
	if err != nil {
		return err
	}
	for _, m := range metas[min(len(metas), keepSnaps):] {
		// The meta first: a reap a crash interrupts leaves a directory
		// List skips, never half a snapshot it lists.
		os.Remove(filepath.Join(s.dir, m.ID, snapMeta))
		if err := os.RemoveAll(filepath.Join(s.dir, m.ID)); err != nil {
			return fmt.Errorf("cluster: reap snapshot %s: %w", m.ID, err)
		}
	}
	return nil
}
