package node

// stopFatal stops the node for a reason a restart does not fix (its raft
// log was about to lose entries its state machine applied: raft's
// assumptions broke): nothing more is applied or written, leadership is
// handed over, and Fatal is closed (serve exits with the error, so an
// operator looks before it runs again).
func (n *Node) stopFatal(err error) {
	n.fatalOnce.Do(func() {
		n.fatalErr.Store(&err)
		n.log.Error("stopping the node: it cannot go on safely; keep its data directory for inspection and see docs/OPERATIONS.md", "err", err)
		n.rep.Halt(err) // no vote, no append, no apply from here on
		close(n.fatal)
	})
}

// Fatal is closed when the node stopped for a reason a restart does not
// fix; FatalErr says which.
func (n *Node) Fatal() <-chan struct{} { return n.fatal }

// FatalErr is why the node stopped (nil: it did not).
func (n *Node) FatalErr() error {
	if p := n.fatalErr.Load(); p != nil {
		return *p
	}
	return nil
}
