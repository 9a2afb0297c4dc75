// Package loopback picks free loopback addresses for child processes
// (demos, benchmarks) that must be told their ports before they start.
package loopback

import "net"

// Hold reserves n distinct loopback addresses ("127.0.0.1:port") and keeps
// them listened on until release is called: a port released at once may be
// handed out again by the next listen (another address chosen, a proxy
// started meanwhile), and two would then share it. Release before the
// children start.
func Hold(n int) (addrs []string, release func(), err error) {
	held := make([]net.Listener, 0, n)
	release = func() {
		for _, l := range held {
			l.Close()
		}
		held = nil
	}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			release()
			return nil, nil, err
		}
		held = append(held, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, release, nil
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
