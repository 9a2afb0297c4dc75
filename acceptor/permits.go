package acceptor

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/wire"
)

// Saturation sources of a refusal. Values appear in error bodies and
// metrics; never rename them.
const (
	SourceReplayPermit    = "replay_permit_admission"
	SourceOutboundBacklog = "outbound_backlog"
)

// ErrNoPermit refuses a batch when every replay permit is taken and the
// wait queue is full (or the wait ran out).
var ErrNoPermit = errors.New("acceptor: no replay permit free")

// PermitStats describe the replay permits (api.PermitStats).
type PermitStats = api.PermitStats

// slots count what is held of a bounded resource, in all and per sender
// (guarded by the acceptor's mu).
type slots struct {
	all int
	of  map[string]int
}

// take takes one of s for sender unless max are held in all or share by
// sender; it does not wait. all and of say what was held when it refused.
func (a *Acceptor) take(s *slots, sender string, max, share int) (release func(), all, of int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.all >= max || s.of[sender] >= share {
		return nil, s.all, s.of[sender], false
	}
	if s.of == nil {
		s.of = map[string]int{}
	}
	s.all++
	s.of[sender]++
	return func() {
		a.mu.Lock()
		s.all--
		s.of[sender]--
		a.mu.Unlock()
	}, 0, 0, true
}

// bodySlot takes one of the slots for reading a body, within the sender's
// share (a quarter of them, at least one); it does not wait.
func (a *Acceptor) bodySlot(sender string) (release func(), err error) {
	share := max(1, a.opts.MaxBodies/4)
	release, all, of, ok := a.take(&a.mu.bodies, sender, a.opts.MaxBodies, share)
	if !ok {
		a.refusals.permit.Add(1)
		return nil, fmt.Errorf("%w: %d batches being read (%d from %s, its share %d)", ErrNoPermit, all, of, sender, share)
	}
	return release, nil
}

// acquire takes a replay permit, waiting in the bounded queue if need be.
// No sender holds more than its share of the permits (half, at least one),
// so a peer whose batches are slow to apply cannot stall every other.
func (a *Acceptor) acquire(r *http.Request, sender string) (release func(), err error) {
	share := max(1, a.opts.Permits/2)
	a.mu.Lock()
	if a.mu.permitsOf[sender] >= share {
		a.mu.Unlock()
		a.refusals.permit.Add(1)
		return nil, fmt.Errorf("%w: %s holds its share of %d permits", ErrNoPermit, sender, share)
	}
	a.mu.permitsOf[sender]++
	a.mu.Unlock()
	release = func() {
		<-a.permits
		a.mu.Lock()
		a.mu.permitsOf[sender]--
		a.mu.Unlock()
	}
	unshare := func() {
		a.mu.Lock()
		a.mu.permitsOf[sender]--
		a.mu.Unlock()
	}
	select {
	case a.permits <- struct{}{}:
		return release, nil
	default:
	}
	if int(a.queued.Add(1)) > a.opts.PermitQueue {
		a.queued.Add(-1)
		unshare()
		return nil, fmt.Errorf("%w: %d applying, %d waiting", ErrNoPermit, a.opts.Permits, a.opts.PermitQueue)
	}
	defer a.queued.Add(-1)
	t := time.NewTimer(a.opts.PermitWait)
	defer t.Stop()
	select {
	case a.permits <- struct{}{}:
		return release, nil
	case <-t.C:
		unshare()
		return nil, fmt.Errorf("%w: waited %s", ErrNoPermit, a.opts.PermitWait)
	case <-r.Context().Done():
		unshare()
		return nil, fmt.Errorf("%w: %v", ErrNoPermit, r.Context().Err())
	}
}

// Permits reports the replay permits and the pressure they are under.
func (a *Acceptor) Permits() PermitStats {
	st := PermitStats{Capacity: a.opts.Permits, InUse: len(a.permits), Queued: int(a.queued.Load()),
		QueueCap: a.opts.PermitQueue, Refused: a.refusals.permit.Load()}
	st.State = a.pressure(st)
	return st
}

func (a *Acceptor) pressure(st PermitStats) string {
	switch {
	case st.Queued*2 >= st.QueueCap:
		return "saturated"
	case st.Queued > 0 || st.InUse >= st.Capacity:
		return "throttled"
	}
	return "healthy"
}

// hints fills the ack's flow hints from the permits' pressure: throttled
// halves the sender's batches and pauses it briefly; saturated asks for
// batches of one and a longer pause.
func (a *Acceptor) hints(ack *wire.Ack, batchLen int) {
	switch a.pressure(PermitStats{Capacity: a.opts.Permits, InUse: len(a.permits) - 1, Queued: int(a.queued.Load()), QueueCap: a.opts.PermitQueue}) {
	case "saturated":
		ack.SuggestedBatch, ack.PauseMS = 1, 200
	case "throttled":
		ack.SuggestedBatch, ack.PauseMS = max(1, batchLen/2), 20
	}
}
