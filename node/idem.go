package node

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/store"
)

// Idempotency looks up the record of an Idempotency-Key, so a caller whose
// call timed out can learn its outcome instead of retrying blindly.
func (n *Node) Idempotency(key string) (api.IdemReport, error) {
	// Kept in the group of the write's key, which the caller need not say.
	for _, g := range n.keys.All() {
		if err := g.Rep.Readable(); err != nil {
			return api.IdemReport{}, err
		}
		rec, ok, err := g.Store.Idem(key)
		if err != nil {
			return api.IdemReport{}, err
		}
		if ok && rec.Expires > n.clock.Physical() {
			return idemReport(&rec), nil
		}
	}
	return api.IdemReport{}, fmt.Errorf("%w: no record of idempotency key %q on cluster %s", api.ErrNotFound, key, n.cluster)
}

func idemReport(rec *store.IdemRecord) api.IdemReport {
	body := json.RawMessage(rec.Body)
	if !json.Valid(body) {
		body, _ = json.Marshal(rec.Body)
	}
	return api.IdemReport{Key: rec.Key, Status: rec.Status, Body: body, Version: rec.Stamp.String(),
		Origin: rec.Stamp.Origin, Expires: time.Unix(0, rec.Expires).UTC()}
}
