package loopback

import (
	"net"
	"strconv"
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

// Where the kernel says which ports it hands out on its own, Hold chooses
// none of them: a port released by Hold cannot be taken by an outbound
// connection or a listen on port 0 before the child binds it.
func TestHoldAvoidsTheEphemeralRange(t *testing.T) {
	lo, hi := belowEphemeral()
	if hi <= lo {
		t.Skip("the kernel's ephemeral range cannot be read here")
	}
	addrs, release, err := Hold(32)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for _, a := range addrs {
		_, p, _ := net.SplitHostPort(a)
		port, _ := strconv.Atoi(p)
		if port < lo || port >= hi {
			t.Fatalf("%s outside [%d, %d)", a, lo, hi)
		}
	}
}
