package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// cluster is one node the bench talks to, maybe its own child.
type cluster struct {
	name, url string
	cmd       *exec.Cmd
	exited    chan struct{} // closed once cmd was waited for (a child only)
	log       string
	peakRSS   atomic.Int64
	proxy     *delayProxy // in front of its peer endpoint (PeerDelay), or nil
	// resp is its RESP door's address when writes go through it (RESP);
	// conns are idle connections to it.
	resp  string
	conns chan *respConn
}

var hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}

func (c *cluster) getJSON(path string, out any) error {
	resp, err := hc.Get(c.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s%s: %d %s", c.url, path, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *cluster) post(path string, body []byte) error {
	resp, err := hc.Post(c.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s%s: %d %s", c.url, path, resp.StatusCode, b)
	}
	return nil
}

// put writes one key with a single PUT; anything but 200 is an error.
func (c *cluster) put(k, value string) error {
	if c.resp != "" {
		return c.respSet(k, value)
	}
	req, err := http.NewRequest(http.MethodPut, c.url+"/v1/kv/"+k, strings.NewReader(value))
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("put %s: %d", k, resp.StatusCode)
	}
	return nil
}

// metric reads one unlabelled series of /metrics.
func (c *cluster) metric(name string) (float64, error) {
	m, err := c.metrics(name)
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("%s: no %s", c.url, name)
	}
	return v, nil
}

// metrics reads the named unlabelled series from one scrape; a name the
// node does not export is left out.
func (c *cluster) metrics(names ...string) (map[string]float64, error) {
	resp, err := hc.Get(c.url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && slices.Contains(names, name) {
			if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				out[name] = v
			}
		}
	}
	return out, sc.Err()
}

// wireBytes is what the node sent to its peers as request bodies after
// compression (replicator_peer_sent_bytes_total{form="wire"}, summed);
// false from a build without it.
func (c *cluster) wireBytes() (float64, bool) {
	resp, err := hc.Get(c.url + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sum, ok := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "replicator_peer_sent_bytes_total{") || !strings.Contains(l, `form="wire"`) {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
				sum, ok = sum+v, true
			}
		}
	}
	return sum, ok
}

type walDoc struct {
	Stream string `json:"stream"`
	Last   uint64 `json:"last_index"`
}

type peersDoc struct {
	Streams []struct {
		Origin string `json:"origin"`
		Stream string `json:"stream"`
		HWM    uint64 `json:"hwm"`
	} `json:"streams"`
}

// caughtUp reports whether dst applied everything src's WAL holds.
func caughtUp(src, dst *cluster) (bool, error) {
	var w walDoc
	if err := src.getJSON("/admin/wal", &w); err != nil {
		return false, err
	}
	if w.Last == 0 {
		return true, nil
	}
	var p peersDoc
	if err := dst.getJSON("/admin/peers", &p); err != nil {
		return false, err
	}
	for _, s := range p.Streams {
		if s.Stream == w.Stream {
			return s.HWM >= w.Last, nil
		}
	}
	return false, nil
}

func waitCaughtUp(ctx context.Context, pairs ...[2]*cluster) error {
	for {
		all := true
		for _, p := range pairs {
			ok, err := caughtUp(p[0], p[1])
			if err != nil {
				return err
			}
			all = all && ok
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// respConn is a connection to a RESP door, writing SETs one at a time.
type respConn struct {
	nc net.Conn
	br *bufio.Reader
}

// respSet writes one key through the RESP door and waits for its +OK.
func (c *cluster) respSet(k, value string) error {
	var rc *respConn
	select {
	case rc = <-c.conns:
	default:
		nc, err := net.Dial("tcp", c.resp)
		if err != nil {
			return err
		}
		rc = &respConn{nc: nc, br: bufio.NewReader(nc)}
	}
	_, err := fmt.Fprintf(rc.nc, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(value), value)
	var line string
	if err == nil {
		line, err = rc.br.ReadString('\n')
	}
	if err != nil {
		rc.nc.Close()
		return err
	}
	select {
	case c.conns <- rc:
	default:
		rc.nc.Close()
	}
	if !strings.HasPrefix(line, "+OK") {
		return fmt.Errorf("SET %s: %s", k, strings.TrimSpace(line))
	}
	return nil
}
