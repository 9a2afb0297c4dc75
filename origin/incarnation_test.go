package origin

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func nodeDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "a2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "NODE_ID"), []byte("a2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A directory mints its incarnation once and keeps it; a directory that
// joined a cluster before incarnations keeps its bare identity; a restore
// mints a new one.
func TestIncarnationLivesWithTheDirectory(t *testing.T) {
	dir := nodeDir(t)
	inc, err := Incarnation(dir, false)
	if err != nil || !incarnationPattern.MatchString(inc) {
		t.Fatalf("minted %q %v", inc, err)
	}
	again, err := Incarnation(dir, true)
	if err != nil || again != inc {
		t.Fatalf("a second start read %q %v, want %q", again, err, inc)
	}
	fresh, err := NewIncarnation(dir)
	if err != nil || fresh == inc || !incarnationPattern.MatchString(fresh) {
		t.Fatalf("a restore minted %q %v (was %q)", fresh, err, inc)
	}
	legacy := nodeDir(t)
	if inc, err := Incarnation(legacy, true); err != nil || inc != "" {
		t.Fatalf("a directory of a group before incarnations: %q %v", inc, err)
	}
	if inc, err := Incarnation(legacy, false); err != nil || inc != "" {
		t.Fatalf("its identity is kept: %q %v", inc, err)
	}
	os.WriteFile(filepath.Join(legacy, IncarnationFile), []byte("{\"incarnation\":\"nothex!\"}"), 0o644)
	if _, err := Incarnation(legacy, false); err == nil {
		t.Fatal("a damaged incarnation record was read")
	}
}

// A copy of the directory (cp -a, as a backup tool would) is refused until
// it is restored; a move (rename) is the same directory.
func TestCopiedDirectoryDetected(t *testing.T) {
	dir := nodeDir(t)
	if _, err := Incarnation(dir, false); err != nil {
		t.Fatal(err)
	}
	if err := CheckNotCopied(dir); err != nil {
		t.Fatalf("the directory itself: %v", err)
	}
	moved := dir + "-moved"
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := CheckNotCopied(moved); err != nil {
		t.Fatalf("a moved directory: %v", err)
	}
	copied := dir + "-copy"
	if out, err := exec.Command("cp", "-a", moved, copied).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := CheckNotCopied(copied); !errors.Is(err, ErrCopied) {
		t.Fatalf("a copy: %v", err)
	}
	if err := Refingerprint(copied); err != nil {
		t.Fatal(err)
	}
	if err := CheckNotCopied(copied); err != nil {
		t.Fatalf("after it was made this node's own: %v", err)
	}
	// Put back in place: the original removed, the copy copied over it.
	os.RemoveAll(moved)
	if out, err := exec.Command("cp", "-a", copied, moved).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := CheckNotCopied(moved); !errors.Is(err, ErrCopied) {
		t.Fatalf("a backup put back in place: %v", err)
	}
}
