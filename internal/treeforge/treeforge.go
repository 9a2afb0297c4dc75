// Package treeforge plays a hostile peer's anti-entropy answers in tests
// (issue 46): a RoundTripper on a link that lets the real peer answer, then
// rewrites each tree answer and signs it again with the link's secret,
// which a hostile peer holds.
package treeforge

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/wire"
)

// Forger rewrites the tree answers that pass through it with Forge, and
// records the keys every versions request named. Other requests pass
// untouched.
type Forger struct {
	Next   http.RoundTripper
	Secret string
	Forge  func(req *wire.TreeRequest, ans *wire.TreeAnswer)

	mu    sync.Mutex
	named []string
}

func (f *Forger) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path != wire.PathTree || r.Body == nil {
		return f.Next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	req, err := wire.DecodeTreeRequest(body)
	if err != nil {
		return nil, err
	}
	resp, err := f.Next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	ans, err := wire.DecodeTreeAnswer(b)
	if err != nil {
		return nil, err
	}
	if req.Op == wire.TreeVersions {
		f.mu.Lock()
		for _, k := range req.Keys {
			f.named = append(f.named, k.Key)
		}
		f.mu.Unlock()
	}
	f.Forge(req, ans)
	wire.SortVersions(ans.Versions)
	if b, err = wire.EncodeTree(ans); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	if nonce := r.Header.Get(wire.HeaderNonce); nonce != "" {
		resp.Header.Set(wire.HeaderMAC, wire.AnswerMAC(f.Secret, nonce, resp.StatusCode, b))
	}
	return resp, nil
}

// Named are the keys the asker named in its versions requests so far.
func (f *Forger) Named() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.named...)
}

// KeyIn is a key named prefix-N whose leaf is leaf (in), or is not.
func KeyIn(prefix string, leaf int, in bool) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if (hashtree.Leaf(k) == leaf) == in {
			return k
		}
	}
}
