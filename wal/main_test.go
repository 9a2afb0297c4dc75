package wal

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (raft's, the transport's, the accept
// loops') has exited when it ends.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
