package bench

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Floor is the least replication lag this machine allows one write,
// measured in the same run, so that lag figures from any machine say how
// close they are to it: the write's local synced commit, the peer's synced
// apply, and one loopback round trip between them.
type Floor struct {
	// CommitMS is the median of 300 synced Pebble commits of one 100-byte
	// entry (default options, a fresh directory on the data's filesystem).
	CommitMS float64 `json:"synced_commit_ms"`
	// CommitP99MS is the p99 of the same commits: the disk's own tail,
	// which a lag p99 pays twice (the sender's fsync and the receiver's).
	CommitP99MS float64 `json:"synced_commit_p99_ms"`
	// RoundTripMS is the median of 300 loopback GET /healthz round trips to
	// a running node.
	RoundTripMS float64 `json:"round_trip_ms"`
	// MS is 2 x CommitMS + RoundTripMS.
	MS float64 `json:"floor_ms"`
	// RaftMS, for clusters of several nodes, adds each cluster's raft
	// round trip (a quorum's append): MS + 2 x RoundTripMS. The quorum's
	// fsyncs run beside the leader's, so they add no commit.
	RaftMS float64 `json:"floor_raft_ms"`
}

// floorSamples is how many commits and round trips the floor's medians take.
const floorSamples = 300

// measureFloor measures the Floor: commits in a fresh Pebble under dir,
// round trips to c.
func measureFloor(dir string, c *cluster) (*Floor, error) {
	db, err := pebble.Open(filepath.Join(dir, "floor"), &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	value := bytes.Repeat([]byte("v"), 100)
	commits := make([]time.Duration, 0, floorSamples)
	for i := 0; i < floorSamples; i++ {
		b := db.NewBatch()
		b.Set([]byte(key("floor", i)), value, nil)
		t0 := time.Now()
		if err := b.Commit(pebble.Sync); err != nil {
			return nil, err
		}
		commits = append(commits, time.Since(t0))
	}
	trips := make([]time.Duration, 0, floorSamples)
	for i := 0; i < floorSamples+1; i++ {
		t0 := time.Now()
		resp, err := hc.Get(c.url + "/healthz")
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i > 0 { // the first one dials
			trips = append(trips, time.Since(t0))
		}
	}
	f := &Floor{CommitMS: medianMS(commits), RoundTripMS: medianMS(trips)}
	f.CommitP99MS = float64(commits[len(commits)*99/100].Nanoseconds()) / 1e6 // sorted by medianMS
	f.MS = 2*f.CommitMS + f.RoundTripMS
	f.RaftMS = f.MS + 2*f.RoundTripMS
	return f, nil
}

func medianMS(d []time.Duration) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)/2].Nanoseconds()) / 1e6
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)              {}
func (quietPebble) Errorf(string, ...any)             {}
func (quietPebble) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
