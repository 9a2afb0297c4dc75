package treeforge

import (
	"bytes"
	"context"
	"io"
	"net/http"

	"github.com/replicator/replicator/wire"
)

// Post sends body to a node's peer endpoint at url as peer from, holding
// its link's secret, the way a peer's shipper does (or a hostile peer that
// paces nothing of its own); it returns the answer's status and body.
// hdr adds headers. hc nil: http.DefaultClient.
func Post(ctx context.Context, hc *http.Client, url, from, secret string, body []byte, hdr ...string) (int, []byte, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", wire.ContentType)
	req.Header.Set(wire.HeaderOrigin, from)
	req.Header.Set("Authorization", "Bearer "+secret)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	ans, err := io.ReadAll(resp.Body)
	return resp.StatusCode, ans, err
}
