package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/internal/loopback"
)

// ServeHTTPFloor serves what a single PUT costs net/http alone: the node's
// server settings, the body read, the same answer, and nothing stored. The
// puts scenario drives it exactly as it drives a node, so that the server
// CPU per write is reported beside the part of it no node can avoid while
// it serves HTTP/1.1 with net/http. It runs until ctx ends.
func ServeHTTPFloor(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`)
	})
	var n atomic.Int64
	mux.HandleFunc("PUT /v1/kv/{key...}", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body := `{"key":"` + r.PathValue("key") + `","version":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + "." + strconv.FormatInt(n.Add(1)&0xff, 10) + `.a","origin":"a"}` + "\n"
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	})
	// The node's settings (node.Start): they decide the per-request work
	// (header read deadline, the idle timer).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, IdleTimeout: 2 * time.Minute}
	go func() {
		// Exits when ctx ends (the process is told to stop).
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// startHTTPFloor runs this binary's ServeHTTPFloor as a child process (its
// CPU is read from /proc) and returns it as a cluster to drive.
func startHTTPFloor() (*cluster, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	free, err := loopback.Addrs(1)
	if err != nil {
		return nil, err
	}
	addr := free[0]
	cmd := exec.Command(self, "bench-httpfloor", "--listen", addr)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &cluster{name: "httpfloor", url: "http://" + addr, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(c.exited) }() // the child's only waiter; ends with it
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var v map[string]any
		if c.getJSON("/healthz", &v) == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			stop([]*cluster{c})
			return nil, fmt.Errorf("the net/http floor server did not start")
		}
	}
}

// procCPU is a process's user+system CPU seconds from /proc/PID/stat.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (u + st) / 100, nil // USER_HZ is 100 on Linux
}

// httpFloorCPU drives a bare net/http server (ServeHTTPFloor) with the puts
// load and returns its CPU per answered request in microseconds.
func httpFloorCPU(ctx context.Context, cfg *Config, prefix string) (float64, error) {
	f, err := startHTTPFloor()
	if err != nil {
		return 0, err
	}
	defer stop([]*cluster{f})
	pid := f.cmd.Process.Pid
	c0, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	acked, _ := closedLoop(ctx, f, cfg, prefix+"-floor")
	c1, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	if acked.Load() == 0 {
		return 0, errors.New("no request answered")
	}
	return (c1 - c0) / float64(acked.Load()) * 1e6, nil
}
