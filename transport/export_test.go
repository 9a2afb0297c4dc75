package transport

// SetBeforeShip sets a hook Run calls after its checks (pause, re-seed,
// heartbeat) and before it builds a batch: where a pause used to slip
// through. Set it before Run starts.
func SetBeforeShip(s *Shipper, f func()) { s.beforeShip = f }

func SetBeforeReseed(s *Shipper, f func()) { s.beforeReseed = f }
