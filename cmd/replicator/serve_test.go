package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCloseBounded: a stop that hangs ends at the bound, or at a second
// signal, with an error saying so; a stop that ends returns its own error.
func TestCloseBounded(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hang := make(chan struct{})
	defer close(hang)
	hung := func() error { <-hang; return nil }
	again := make(chan os.Signal, 1)
	if err := closeBounded(hung, 20*time.Millisecond, again, log); err == nil || !strings.Contains(err.Error(), "--shutdown-timeout") {
		t.Fatalf("a hung stop past its bound: %v", err)
	}
	want := errors.New("store: closing")
	if err := closeBounded(func() error { return want }, time.Hour, again, log); !errors.Is(err, want) {
		t.Fatalf("a stop that ends: %v", err)
	}
	again <- syscall.SIGTERM
	if err := closeBounded(hung, time.Hour, again, log); err == nil || !strings.Contains(err.Error(), "second") {
		t.Fatalf("a second signal during a hung stop: %v", err)
	}
}

// TestSecretFileUnreadable: a secret file that is there but not readable
// says so, names the uid the node runs as, and points at no other flag (the
// node's "has no secret" hint names --insecure-peers). Built from the error
// os.ReadFile returns, since a test run as root reads any file;
// deploy TestUnreadableSecretFile runs the binary as another user.
func TestSecretFileUnreadable(t *testing.T) {
	msg := secretFileError("peer b: secret file", "/run/ab.secret", syscall.EACCES).Error()
	for _, want := range []string{"/run/ab.secret", "permission denied", "uid " + strconv.Itoa(syscall.Getuid()), "readable by it"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "insecure") {
		t.Errorf("%q steers toward --insecure-peers", msg)
	}
	// Any other failure keeps its own words.
	if msg := secretFileError("peer b: secret file", "/x", syscall.ENOENT).Error(); !strings.Contains(msg, "no such file") || strings.Contains(msg, "uid") {
		t.Errorf("a missing file: %q", msg)
	}
}
