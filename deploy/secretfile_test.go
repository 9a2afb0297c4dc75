//go:build unix

package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestUnreadableSecretFile: a peer secret the node cannot read (README.md's
// `umask 077` secret in the image, which runs as 65532) stops it with an
// error that says so and names the uid it runs as, and does not steer toward
// --insecure-peers. Run as root (which reads any file), the node runs as
// 65532, as in the image; otherwise the file is made unreadable to its
// owner.
func TestUnreadableSecretFile(t *testing.T) {
	bin := replicatorBinary(t)
	dir, err := os.MkdirTemp("", "replicator-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755) // the node's user enters it
	secret := filepath.Join(dir, "ab.secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--cluster-id", "a", "--data", filepath.Join(dir, "a"), "--listen", "127.0.0.1:0",
		"--peer", "b=http://127.0.0.1:7402", "--peer-secret-file", "b="+secret)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	uid := os.Getuid()
	if uid == 0 {
		uid = 65532
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
	} else if err := os.Chmod(secret, 0); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the node started with a secret it cannot read:\n%s", out)
	}
	msg := string(out)
	for _, want := range []string{secret, "permission denied", "uid " + strconv.Itoa(uid), "readable by it"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "insecure") {
		t.Errorf("the error steers toward --insecure-peers:\n%s", msg)
	}
}
