package loopback

import (
	"net"
	"testing"
)

func TestAddrsDistinctAndFree(t *testing.T) {
	addrs, err := Addrs(64)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 64 {
		t.Fatalf("got %d addresses, want 64", len(addrs))
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("address %s given twice", a)
		}
		seen[a] = true
		// Released: each can be listened on now.
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s not free after Addrs returned: %v", a, err)
		}
		l.Close()
	}
}

func TestHoldKeepsThemTaken(t *testing.T) {
	addrs, release, err := Hold(4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if l, err := net.Listen("tcp", a); err == nil {
			l.Close()
			t.Fatalf("%s could be listened on while held", a)
		}
	}
	release()
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s not free after release: %v", a, err)
		}
		l.Close()
	}
}
