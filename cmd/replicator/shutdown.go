package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"
)

// defaultShutdownTimeout is --shutdown-timeout's default: a stop hands
// leadership over (an election's worth), lets handlers finish their
// commits (bounded at 30 s inside the node, but they take milliseconds) and
// closes the stores. The supervisors' limits are this plus 15 s.
const defaultShutdownTimeout = 30 * time.Second

// closeBounded runs a graceful close, bounded: past the timeout, or on a
// second SIGTERM or SIGINT, it returns an error at once and the process
// exits with what is still running. That is a crash as the node sees it at
// its next start: every acknowledged write is on disk already (each was
// synced before its answer), and a crash is what recovery is built for; an
// unbounded stop instead meets the supervisor's SIGKILL at a moment nobody
// chose, with nothing logged.
func closeBounded(closeFn func() error, timeout time.Duration, again <-chan os.Signal, log *slog.Logger) error {
	log.Info("shutting down", "bound", timeout)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- closeFn() }() // left running if the bound passes: the process exits
	var t <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		t = timer.C
	}
	select {
	case err := <-done:
		log.Info("stopped", "took", time.Since(start).Round(time.Millisecond))
		return err
	case <-t:
		return fmt.Errorf("the stop took longer than --shutdown-timeout %s: exiting now, as after a crash (nothing acknowledged is lost)", timeout)
	case sig := <-again:
		return fmt.Errorf("a second %s during the stop: exiting now, as after a crash (nothing acknowledged is lost)", sig)
	}
}
