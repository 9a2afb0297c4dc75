package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzAPI sends arbitrary requests to the whole HTTP API of a live node:
// nothing may panic, no answer may be a 500, and every error is the JSON
// error shape.
func FuzzAPI(f *testing.F) {
	n, err := Open(t0ctx(), &Options{ClusterID: "a", DataDir: f.TempDir(), Listen: "127.0.0.1:0", Logger: quiet,
		Peers: []Peer{{Name: "b", URL: "http://127.0.0.1:1", Secret: "s"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { n.Close() })
	h := n.Handler()
	seeds := []struct{ method, path, hdr, body string }{
		{"PUT", "/v1/kv/a", "", "v"},
		{"PUT", "/v1/kv/a", "If-Match: \"1.0@a\"", "v"},
		{"DELETE", "/v1/kv?prefix=a", "Idempotency-Key: k1", ""},
		{"POST", "/v1/counters/c", "", `{"delta":3}`},
		{"POST", "/v1/batch", "", `{"ops":[{"op":"set","key":"x","value":"1"}],"operation_id":"o"}`},
		{"POST", "/v1/bulk", "Content-Type: text/csv", "a,b\n"},
		{"GET", "/v1/kv?start=a&end=b&limit=3", "", ""},
		{"POST", "/v1/replicate", "X-Replicator-Origin: b", "\x84"},
		{"POST", "/admin/peers/b/pause", "", ""},
		{"GET", "/v1/idempotency/k1", "", ""},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.hdr, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method, path, hdr string, body []byte) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") || len(path) > 8192 {
			return
		}
		switch method {
		case "GET", "PUT", "POST", "DELETE", "HEAD", "PATCH":
		default:
			return
		}
		req, err := http.NewRequest(method, "http://node"+path, bytes.NewReader(body))
		if err != nil {
			return
		}
		if k, v, ok := strings.Cut(hdr, ": "); ok && k != "" && !strings.ContainsAny(k+v, "\r\n") {
			req.Header.Set(k, v)
		}
		if strings.HasPrefix(path, "/admin/peers/") && method == "POST" {
			return // pausing the peer link is legitimate, and not what this fuzzes
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s: %d %s", method, path, rec.Code, rec.Body.String())
		}
		if rec.Code >= 400 && method != "HEAD" {
			var e struct {
				Error *struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == nil || e.Error.Code == "" {
				t.Fatalf("%s %s: %d without a JSON error: %q", method, path, rec.Code, rec.Body.String())
			}
		}
	})
}

func t0ctx() context.Context { return context.Background() }
