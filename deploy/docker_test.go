package deploy_test

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDockerfile checks the Dockerfile's shape everywhere, and where a
// container engine runs (.ci/run starts Debian's docker.io when it can), builds
// the image with it and runs a pair of clusters from it: a write at one is
// read at the other, both report healthy through the image's own health
// check, and the node runs as the non-root user on the /data volume. Of the
// two ways to give the node its secret (deploy/README.md), a runs as the
// image's user with the secret given to it, b as README.md runs it: as the
// secret's owner (--user), with a 0600 secret and a data directory of that
// owner. A node given a secret it cannot read exits, naming its uid.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	if strings.Count(df, "\nFROM ") != 2 {
		t.Error("want a two-stage build")
	}
	for _, want := range []string{"USER 65532:65532", `VOLUME ["/data"]`, "--chown=65532:65532", "HEALTHCHECK", `"healthcheck"`, "CGO_ENABLED=0", "distroless/static"} {
		if !strings.Contains(df, want) {
			t.Errorf("the Dockerfile lacks %s", want)
		}
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		// No engine (a docker client only): the checks above and a static
		// build of the same binary stand in.
		build := exec.Command("go", "build", "-o", os.DevNull, "./cmd/replicator")
		build.Dir = ".." // the product's module: deploy/ is a module of its own
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, berr := build.CombinedOutput()
		if berr != nil {
			t.Fatalf("the binary the image holds does not build: %v\n%s", berr, out)
		}
		t.Log("no container engine here (a docker client only): the Dockerfile was checked statically, and its build command run outside it")
		return
	}
	if testing.Short() {
		t.Skip("-short: the image build takes minutes")
	}
	for _, line := range strings.Split(df, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "FROM" {
			ensureBaseImage(t, f[1])
		}
	}
	tag := fmt.Sprintf("replicator:test-%d", os.Getpid())
	docker(t, 20*time.Minute, "..", "build", "--network", "host", "--build-arg", "VERSION=image-test",
		"-f", "deploy/docker/Dockerfile", "-t", tag, ".")
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })
	if u := strings.TrimSpace(docker(t, time.Minute, "", "image", "inspect", "-f", "{{.Config.User}}", tag)); u != "65532:65532" {
		t.Errorf("the image runs as %q, want 65532:65532", u)
	}

	// A pair on a network of its own; the nodes find each other by name.
	id := fmt.Sprint(os.Getpid())
	net := "replicator-test-" + id
	docker(t, time.Minute, "", "network", "create", net)
	t.Cleanup(func() { exec.Command("docker", "network", "rm", net).Run() })
	dir := t.TempDir()
	secret := filepath.Join(dir, "ab.secret")
	if err := os.WriteFile(secret, []byte("image-test-secret\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	os.Chown(secret, 65532, 65532)
	// b: README.md's recipe, --user "$(id -u):$(id -g)" (a user of 1000
	// stands in for the operator where the test runs as root).
	owner := [2]int{os.Getuid(), os.Getgid()}
	if owner[0] == 0 {
		owner = [2]int{1000, 1000}
	}
	ownSecret, ownData := filepath.Join(dir, "ab-own.secret"), filepath.Join(dir, "b-data")
	os.WriteFile(ownSecret, []byte("image-test-secret\n"), 0o600)
	os.Mkdir(ownData, 0o700)
	for _, p := range []string{ownSecret, ownData} {
		os.Chown(p, owner[0], owner[1])
	}
	ip := map[string]string{}
	for _, c := range [][2]string{{"a", "b"}, {"b", "a"}} {
		name, peer := "replicator-"+c[0]+"-"+id, "replicator-"+c[1]+"-"+id
		run := []string{"run", "-d", "--name", name, "--network", net, "-v", name + ":/data", "-v", secret + ":/etc/replicator/peer.secret:ro"}
		if c[0] == "b" {
			run = []string{"run", "-d", "--name", name, "--network", net, "--user", fmt.Sprintf("%d:%d", owner[0], owner[1]),
				"-v", ownData + ":/data", "-v", ownSecret + ":/etc/replicator/peer.secret:ro"}
		}
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := exec.Command("docker", "logs", name).CombinedOutput()
				t.Logf("%s's log:\n%s", name, out)
			}
			exec.Command("docker", "rm", "-f", "-v", name).Run()
			exec.Command("docker", "volume", "rm", name).Run()
		})
		docker(t, time.Minute, "", append(run, tag,
			"serve", "--cluster-id", c[0], "--data", "/data", "--listen", "0.0.0.0:7400",
			"--peer", c[1]+"=http://"+peer+":7400", "--peer-secret-file", c[1]+"=/etc/replicator/peer.secret")...)
		ip[c[0]] = strings.TrimSpace(docker(t, time.Minute, "", "inspect", "-f",
			"{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name))
	}
	urlA, urlB := "http://"+ip["a"]+":7400", "http://"+ip["b"]+":7400"
	eventually(t, time.Minute, func() error { return do("PUT", urlA+"/v1/kv/greeting", "from a container") })
	eventually(t, time.Minute, func() error {
		resp, err := http.Get(urlB + "/v1/kv/greeting")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "from a container") {
			return fmt.Errorf("b answers %d %s", resp.StatusCode, body)
		}
		return nil
	})
	var origin struct{ Version string }
	if err := getJSON(urlB+"/admin/origin", &origin); err != nil || origin.Version != "image-test" {
		t.Errorf("b's /admin/origin: %v, version %q (want the build argument)", err, origin.Version)
	}
	// The case: a secret made under umask 077 by someone else than
	// 65532, mounted into the image as it runs.
	unreadable := filepath.Join(dir, "unreadable.secret")
	os.WriteFile(unreadable, []byte("image-test-secret\n"), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", net, "-v", unreadable+":/etc/replicator/peer.secret:ro", tag,
		"serve", "--cluster-id", "c", "--data", "/data", "--listen", "0.0.0.0:7400",
		"--peer", "a=http://replicator-a-"+id+":7400", "--peer-secret-file", "a=/etc/replicator/peer.secret").CombinedOutput()
	if msg := string(out); err == nil || !strings.Contains(msg, "permission denied") || !strings.Contains(msg, "uid 65532") || strings.Contains(msg, "insecure") {
		t.Errorf("a node given a secret it cannot read: %v\n%s", err, msg)
	}
	for _, c := range []string{"a", "b"} {
		name := "replicator-" + c + "-" + id
		eventually(t, 2*time.Minute, func() error {
			st := strings.TrimSpace(docker(t, time.Minute, "", "inspect", "-f", "{{.State.Health.Status}}", name))
			if st != "healthy" {
				return fmt.Errorf("%s health %q", name, st)
			}
			return nil
		})
	}
}

// ensureBaseImage makes ref available: already there, pulled, or, where no
// registry can be reached (these machines reach only the Go module proxy and
// Debian), a stand-in imported from this machine's own files: the Go
// toolchain under busybox's shell for the build image, and for distroless
// only what it is made of (passwd with the nonroot user, CA certificates,
// /tmp). The Dockerfile's instructions, the binary and the image's run are
// then the real ones.
func ensureBaseImage(t *testing.T, ref string) {
	if exec.Command("docker", "image", "inspect", ref).Run() == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if exec.CommandContext(ctx, "docker", "pull", ref).Run() == nil {
		return
	}
	var build func(*tar.Writer) error
	var changes []string
	switch {
	case strings.HasPrefix(ref, "golang:"):
		build, changes = goStandIn, []string{"ENV PATH=/usr/local/go/bin:/go/bin:/bin", "ENV GOPATH=/go",
			"ENV HOME=/root", "ENV GOTOOLCHAIN=local", "WORKDIR /"}
	case strings.HasPrefix(ref, "gcr.io/distroless/static"):
		build, changes = distrolessStandIn, []string{"USER 65532:65532", "WORKDIR /home/nonroot"}
	default:
		t.Fatalf("%s cannot be pulled here, and there is no stand-in for it", ref)
	}
	t.Logf("%s cannot be pulled here (no registry): importing a stand-in made of this machine's files", ref)
	args := []string{"import"}
	for _, c := range changes {
		args = append(args, "--change", c)
	}
	cmd := exec.Command("docker", append(args, "-", ref)...)
	pr, pw := io.Pipe()
	cmd.Stdin = pr
	go func() {
		tw := tar.NewWriter(pw)
		err := build(tw)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker import %s: %v\n%s", ref, err, out)
	}
}

func goStandIn(tw *tar.Writer) error {
	sh, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("the Go stand-in needs a static busybox (apt-get install busybox-static): %w", err)
	}
	for _, d := range []string{"bin", "etc", "etc/ssl", "etc/ssl/certs", "go", "root", "usr", "usr/local"} {
		if err := tarDir(tw, d, 0o755, 0); err != nil {
			return err
		}
	}
	if err := tarDir(tw, "tmp", 0o1777, 0); err != nil {
		return err
	}
	if err := tarFile(tw, "bin/busybox", sh, 0o755); err != nil {
		return err
	}
	for _, tool := range []string{"sh", "mkdir", "ls", "cat", "cp", "rm", "env"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + tool, Linkname: "busybox", Mode: 0o777}); err != nil {
			return err
		}
	}
	if err := tarFile(tw, "etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt", 0o644); err != nil {
		return err
	}
	root := runtime.GOROOT()
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (rel == "test" || rel == "api" || rel == "doc") {
			return filepath.SkipDir
		}
		name := filepath.ToSlash(filepath.Join("usr/local/go", rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return tarDir(tw, name, 0o755, 0)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
		default:
			return tarFile(tw, name, p, int64(info.Mode().Perm()))
		}
	})
}

func distrolessStandIn(tw *tar.Writer) error {
	for _, d := range []string{"etc", "etc/ssl", "etc/ssl/certs", "home"} {
		if err := tarDir(tw, d, 0o755, 0); err != nil {
			return err
		}
	}
	if err := tarDir(tw, "home/nonroot", 0o700, 65532); err != nil {
		return err
	}
	if err := tarDir(tw, "tmp", 0o1777, 0); err != nil {
		return err
	}
	for name, body := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, body); err != nil {
			return err
		}
	}
	return tarFile(tw, "etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt", 0o644)
}

func tarDir(tw *tar.Writer, name string, mode int64, uid int) error {
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid})
}

func tarFile(tw *tar.Writer, name, src string, mode int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: info.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, bufio.NewReader(f))
	return err
}

// docker runs the client and returns its output; a failure fails the test.
func docker(t *testing.T, timeout time.Duration, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func eventually(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func do(method, url, body string) error {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	return nil
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
