// Package loopback picks free loopback addresses for child processes
// (demos, benchmarks) that must be told their ports before they start.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// Hold reserves n distinct loopback addresses ("127.0.0.1:port") and keeps
// them listened on until release is called: a port released at once may be
// handed out again by the next listen (another address chosen, a proxy
// started meanwhile), and two would then share it. Release before the
// children start.
//
// The ports come from below the kernel's ephemeral range where it can be
// read (Linux): between release and the child's bind, no outbound
// connection's local port and no listen on port 0 can take them, which a
// port the kernel chose for a listen on port 0 cannot promise (a CI run saw
// "address already in use" at a raft port so taken). Only another Hold
// that draws the same number in that window could.
func Hold(n int) (addrs []string, release func(), err error) {
	held := make([]net.Listener, 0, n)
	release = func() {
		for _, l := range held {
			l.Close()
		}
		held = nil
	}
	lo, hi := belowEphemeral()
	for range n {
		l, err := listenIn(lo, hi)
		if err != nil {
			release()
			return nil, nil, err
		}
		held = append(held, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, release, nil
}

// listenIn listens on a random free loopback port in [lo, hi), or on
// port 0 when the range is empty or every try failed.
func listenIn(lo, hi int) (net.Listener, error) {
	for try := 0; hi > lo && try < 64; try++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo)))
		if err == nil {
			return l, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// belowEphemeral returns the ports [10000, low end of the ephemeral range),
// or an empty range when the kernel's range cannot be read.
func belowEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil || first <= 11000 {
		return 0, 0
	}
	return 10000, first
}

// Addrs returns n distinct loopback addresses that were free a moment ago.
func Addrs(n int) ([]string, error) {
	addrs, release, err := Hold(n)
	if err != nil {
		return nil, err
	}
	release()
	return addrs, nil
}
