package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/backup"
	"github.com/replicator/replicator/entry"
)

// The admin reports are the contract's words (package api).
type (
	FilterReport     = api.FilterReport
	BandwidthReport  = api.BandwidthReport
	DeadLetterReport = api.DeadLetterReport
	Filter           = entry.Filter
)

// DoJSON sends in as the request's JSON body and decodes the answer into
// out (the CLI's admin calls).
func (c *Client) DoJSON(ctx context.Context, method, path string, in, out any) (http.Header, error) {
	return c.doJSON(ctx, method, path, in, out)
}

// doJSON sends in as the request's JSON body.
func (c *Client) doJSON(ctx context.Context, method, path string, in, out any) (http.Header, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	return c.Do(ctx, method, path, b, http.Header{"Content-Type": {"application/json"}}, out)
}

func peerPath(peer, rest string) string { return "/admin/peers/" + url.PathEscape(peer) + rest }

// LinkFilter is the filter of the link to peer as the cluster's log holds
// it, with its epochs, pending backfill and kept tombstones.
func (c *Client) LinkFilter(ctx context.Context, peer string) (FilterReport, error) {
	var r FilterReport
	_, err := c.Do(ctx, http.MethodGet, peerPath(peer, "/filter"), nil, nil, &r)
	return r, err
}

// SetLinkFilter records f as the filter of the link to peer (a widening
// backfills what it newly lets cross).
func (c *Client) SetLinkFilter(ctx context.Context, peer string, f Filter) (FilterReport, error) {
	var r FilterReport
	_, err := c.doJSON(ctx, http.MethodPut, peerPath(peer, "/filter"), f, &r)
	return r, err
}

// ReleaseLinkFilter declares the link's narrowing permanent: the
// tombstones kept for a later widening may be collected.
func (c *Client) ReleaseLinkFilter(ctx context.Context, peer string) (FilterReport, error) {
	var r FilterReport
	_, err := c.Do(ctx, http.MethodPost, peerPath(peer, "/filter/release"), nil, nil, &r)
	return r, err
}

// LinkBandwidth is the link's limit as the cluster's log holds it.
func (c *Client) LinkBandwidth(ctx context.Context, peer string) (BandwidthReport, error) {
	var r BandwidthReport
	_, err := c.Do(ctx, http.MethodGet, peerPath(peer, "/bandwidth"), nil, nil, &r)
	return r, err
}

// SetLinkBandwidth sets the link's limit in bytes a second (0: none).
func (c *Client) SetLinkBandwidth(ctx context.Context, peer string, bytesPerSecond int64) (BandwidthReport, error) {
	var r BandwidthReport
	body := struct {
		BytesPerSecond int64 `json:"bytes_per_second"`
	}{bytesPerSecond}
	_, err := c.doJSON(ctx, http.MethodPut, peerPath(peer, "/bandwidth"), body, &r)
	return r, err
}

// DeadLetters lists the writes of peers set aside at this cluster.
func (c *Client) DeadLetters(ctx context.Context) ([]DeadLetterReport, error) {
	var r struct {
		DeadLetters []DeadLetterReport `json:"dead_letters"`
	}
	_, err := c.Do(ctx, http.MethodGet, "/admin/deadletters", nil, nil, &r)
	return r.DeadLetters, err
}

// ReplayDeadLetter applies a dead letter now; DiscardDeadLetter drops it.
func (c *Client) ReplayDeadLetter(ctx context.Context, id string) error {
	_, err := c.Do(ctx, http.MethodPost, "/admin/deadletters/"+url.PathEscape(id)+"/replay", nil, nil, nil)
	return err
}

// DiscardDeadLetter drops a dead letter for good.
func (c *Client) DiscardDeadLetter(ctx context.Context, id string) error {
	_, err := c.Do(ctx, http.MethodPost, "/admin/deadletters/"+url.PathEscape(id)+"/discard", nil, nil, nil)
	return err
}

// LinkCompression is the link's compression of batch bodies, and whether
// the cluster's log holds it.
func (c *Client) LinkCompression(ctx context.Context, peer string) (api.CompressionReport, error) {
	var r api.CompressionReport
	_, err := c.Do(ctx, http.MethodGet, peerPath(peer, "/compression"), nil, nil, &r)
	return r, err
}

// SetLinkCompression sets the link's compression ("zstd" or "none")
// through the cluster's log.
func (c *Client) SetLinkCompression(ctx context.Context, peer, compression string) (api.CompressionReport, error) {
	var r api.CompressionReport
	_, err := c.doJSON(ctx, http.MethodPut, peerPath(peer, "/compression"), map[string]string{"compression": compression}, &r)
	return r, err
}

// Backup takes an online backup of the node addressed (each node backs up
// its own tree: not forwarded) and writes it into dir as a data directory
// (package backup). ctx alone bounds it: a large tree takes a while.
func (c *Client) Backup(ctx context.Context, dir string) (backup.Manifest, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/admin/backup", nil)
	if err != nil {
		return backup.Manifest{}, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.untimed().http.Do(req)
	if err != nil {
		return backup.Manifest{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return backup.Manifest{}, decodeError(resp)
	}
	return backup.Extract(resp.Body, dir)
}
