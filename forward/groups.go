package forward

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/internal/raftconn"
)

// A cluster's raft groups after 0 (issue 51) share group 0's raft port and
// its members. What forms and promotes them is each member's state in them,
// which its raft port tells with its description (Described.Groups): gossip
// has no room for 64 groups' indexes.

// groupState is what the node at addr, answering as id, says of its state
// in group g (1 and up).
func groupState(port *raftconn.Layer, id raft.ServerID, addr string, g int) (GroupState, error) {
	who, err := port.Identify(addr, time.Second)
	if err != nil {
		return GroupState{}, err
	}
	if who.ID != string(id) {
		return GroupState{}, fmt.Errorf("forward: %s answers at %s, not %s", who.ID, addr, id)
	}
	var d Described
	if err := json.Unmarshal([]byte(who.Description), &d); err != nil || g-1 >= len(d.Groups) {
		return GroupState{}, fmt.Errorf("forward: %s describes no group %d (another --groups, or an older build)", id, g)
	}
	return d.Groups[g-1], nil
}

// GroupApplied is how group g's leader learns a learner's applied index in
// group g (cluster.Options.MemberApplied): what its raft port tells.
func GroupApplied(port func() *raftconn.Layer, g int) func(id raft.ServerID, addr string) (uint64, error) {
	return func(id raft.ServerID, addr string) (uint64, error) {
		st, err := groupState(port(), id, addr, g)
		return st.Applied, err
	}
}

// FormWith is whom group g forms with (cluster.Options.FormWith): group
// 0's servers, once every one is a voter whose raft port says it holds none
// of group g's state; none before (asked again at the next round).
func FormWith(g0 *cluster.Group, g int) []raft.Server {
	st := g0.Status()
	if st.Leader == "" || len(st.Servers) == 0 {
		return nil
	}
	var servers []raft.Server
	for _, sv := range st.Servers {
		id := raft.ServerID(cluster.ServerID(sv.ID, sv.Incarnation))
		if !sv.Voter {
			return nil
		}
		if id != g0.ID() {
			if gs, err := groupState(g0.Port(), id, sv.Raft, g); err != nil || !gs.Fresh {
				return nil
			}
		}
		servers = append(servers, raft.Server{ID: id, Address: raft.ServerAddress(sv.Raft)})
	}
	return servers
}
