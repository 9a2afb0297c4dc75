package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/replicator/replicator/api"
)

// The reports are the contract's words (package api).
type (
	Conflict        = api.Conflict
	ConflictVersion = api.ConflictVersion
	ConflictPage    = api.ConflictPage
	ConflictQuery   = api.ConflictQuery
)

// Conflicts reads one page of the conflict log.
func (c *Client) Conflicts(ctx context.Context, q ConflictQuery) (ConflictPage, error) {
	var p ConflictPage
	_, err := c.Do(ctx, http.MethodGet, "/admin/conflicts?"+q.Values().Encode(), nil, nil, &p)
	return p, err
}

// RestoreConflict writes a logged loser back as a new write, only while
// its key still holds the conflict's winner (a *Error with status 412 and
// the current version otherwise).
func (c *Client) RestoreConflict(ctx context.Context, id string) (WriteResult, error) {
	var res WriteResult
	err := c.write(ctx, http.MethodPost, "/admin/conflicts/"+url.PathEscape(id)+"/restore", nil, nil, &res)
	return res, err
}

// ConflictsAll pages through every record the query selects.
func (c *Client) ConflictsAll(ctx context.Context, q ConflictQuery) ([]Conflict, error) {
	var all []Conflict
	for {
		p, err := c.Conflicts(ctx, q)
		if err != nil {
			return all, err
		}
		all = append(all, p.Items...)
		if p.Next == "" || len(p.Items) == 0 {
			return all, nil
		}
		q.After = p.Next
	}
}
