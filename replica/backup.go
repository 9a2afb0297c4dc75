package replica

import (
	"context"
	"io"
	"time"

	"github.com/replicator/replicator/backup"
)

// Backup streams a consistent copy of this node's tree, with its identity
// and a manifest, to w (package backup): GET /admin/backup.
func (r *Replica) Backup(ctx context.Context, w io.Writer) error {
	servers := 1
	if g := r.opened.Load(); g != nil {
		servers = max(1, len(g.Status().Servers))
	}
	_, err := backup.Write(ctx, w, backup.Source{
		Dir:        r.d.Dir,
		Checkpoint: r.d.Store.Checkpoint,
		Applied:    r.Applied,
		Manifest: backup.Manifest{Cluster: r.d.Cluster, Node: r.d.NodeID, Incarnation: r.d.Incarnation,
			TakenAt: time.Now().UTC(), Servers: servers},
	})
	return err
}
