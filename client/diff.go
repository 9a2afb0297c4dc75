package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/replicator/replicator/api"
)

// The reports are the contract's words (package api).
type (
	Lacks       = api.Lacks
	RangeDelete = api.RangeDelete
	Divergence  = api.Divergence
	Held        = api.Held
	DiffReport  = api.DiffReport
	TreeRebuild = api.TreeRebuild
)

const (
	LacksLocal        = api.LacksLocal
	LacksPeer         = api.LacksPeer
	LacksBoth         = api.LacksBoth
	LacksUnknown      = api.LacksUnknown
	LacksMaybeDeleted = api.LacksMaybeDeleted
	LacksOwnWrite     = api.LacksOwnWrite
	LacksThirdOrigin  = api.LacksThirdOrigin
	LacksExpired      = api.LacksExpired
)

// Diff compares the node's cluster with the peer's (and, with repair,
// pulls what this cluster lacks).
func (c *Client) Diff(ctx context.Context, peer string, repair bool) (DiffReport, error) {
	var r DiffReport
	path := "/admin/peers/" + url.PathEscape(peer) + "/diff"
	if repair {
		path += "?repair=true"
	}
	_, err := c.untimed().Do(ctx, http.MethodPost, path, nil, nil, &r)
	return r, err
}

// RebuildTree sums the kept hashes of the node addressed afresh from its
// tree and corrects those that were wrong. Each node keeps its own: it is
// not forwarded to the leader.
func (c *Client) RebuildTree(ctx context.Context) (TreeRebuild, error) {
	var r TreeRebuild
	_, err := c.untimed().Do(ctx, http.MethodPost, "/admin/tree/rebuild", nil, nil, &r)
	return r, err
}

// untimed is c without its HTTP client's own timeout (10 s by default): a
// comparison waits for the link's lag and reads the differing leaves on
// both sides, and a rebuild reads the whole tree, so ctx alone bounds them.
func (c *Client) untimed() *Client {
	cp := *c
	hc := *c.http
	hc.Timeout = 0
	cp.http = &hc
	return &cp
}
