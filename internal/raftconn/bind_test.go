package raftconn

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftfsm"
)

// A dial bound to a server ID reaches that server only: another identity
// at the address refuses before raft reads anything, and says who it is.
func TestBoundDialReachesOnlyItsIdentity(t *testing.T) {
	for _, mode := range []string{"gossip-key", "loopback"} {
		t.Run(mode, func(t *testing.T) {
			opts := func(id string) Options {
				o := Options{Cluster: "a", Node: strings.Split(id, ".")[0], ID: id, Applied: func() uint64 { return 42 }}
				if mode == "gossip-key" {
					o.GossipKey = keyA
				} else {
					o.Loopback = true
				}
				return o
			}
			a, b := listen(t, opts("a1.11111111")), listen(t, opts("a2.22222222"))
			addr := raft.ServerAddress(b.Addr().String())
			done := echo(b)
			c, err := a.Dial(BindAddress("a2.22222222", addr), 2*time.Second)
			if err != nil {
				t.Fatalf("a dial bound to the identity there: %v", err)
			}
			c.SetDeadline(time.Now().Add(2 * time.Second))
			c.Write([]byte("hello"))
			buf := make([]byte, 5)
			if _, err := c.Read(buf); err != nil || string(buf) != "hello" {
				t.Fatalf("round trip after the preamble: %q %v", buf, err)
			}
			c.Close()
			if err := <-done; err != nil {
				t.Fatal(err)
			}

			done = echo(b)
			_, err = a.Dial(BindAddress("a2.33333333", addr), 2*time.Second)
			if !errors.Is(err, ErrWrongIdentity) || !strings.Contains(err.Error(), "a2.22222222") {
				t.Fatalf("a dial bound to another incarnation: %v", err)
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the accepting side served a connection meant for another identity")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the accepting side still waits")
			}

			echo(b)
			who, err := a.Identify(string(addr), 2*time.Second)
			if err != nil || who.ID != "a2.22222222" || who.Applied != 42 {
				t.Fatalf("identify: %+v %v", who, err)
			}
		})
	}
}

// A node that refuses another says why, and the refused node keeps it.
func TestRefusedSenderIsToldWhy(t *testing.T) {
	told := make(chan string, 4)
	a := listen(t, Options{Cluster: "a", Node: "a1", ID: "a1.11111111", Loopback: true,
		OnRefused: func(by, _, why string) { told <- by + ": " + why }})
	b := listen(t, Options{Cluster: "a", Node: "a2", ID: "a2.22222222", Loopback: true,
		Refuse: func(sender string) string {
			if sender == "a1.11111111" {
				return "a1.11111111 was lost in the recovery of cluster a"
			}
			return ""
		}})
	echo(b)
	_, err := a.Dial(BindAddress("a2.22222222", raft.ServerAddress(b.Addr().String())), 2*time.Second)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "lost in the recovery") {
		t.Fatalf("a refused sender: %v", err)
	}
	if r := a.Refused(); r.By != "a2.22222222" || !strings.Contains(r.Reason, "lost in the recovery") || r.At.IsZero() {
		t.Fatalf("the refusal kept: %+v", r)
	}
	if got := <-told; !strings.HasPrefix(got, "a2.22222222: ") {
		t.Fatalf("OnRefused: %q", got)
	}
	// Asking who answers is refused too: a node kept out learns it at its
	// first dial, before raft could campaign.
	echo(b)
	if _, err := a.Identify(b.Addr().String(), 2*time.Second); !errors.Is(err, ErrRefused) {
		t.Fatalf("identify by a refused sender: %v", err)
	}
	if r := b.Refusing(time.Minute); r["a1.11111111"].Reason == "" {
		t.Fatalf("the refusing side keeps whom it refused: %+v", r)
	}
}

// A connection without the preamble (a node of an older build) is served
// as raft's stream, unbound.
func TestUnboundConnectionServed(t *testing.T) {
	b := listen(t, Options{Cluster: "a", ID: "a2.22222222", Loopback: true})
	done := echo(b)
	c, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write([]byte{0, 'a', 'b', 'c', 'd'})
	buf := make([]byte, 5)
	if _, err := c.Read(buf); err != nil || string(buf) != "\x00abcd" {
		t.Fatalf("%q %v", buf, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// voter is a raft node on a fixed address whose log and stable state
// survive its restarts (its disk), unless it is wiped.
type voter struct {
	id    raft.ServerID
	addr  string
	store *raft.InmemStore
	snaps *raft.InmemSnapshotStore
	fsm   *raftfsm.Recorder
	r     *raft.Raft
	close func()
}

func (v *voter) start(t *testing.T, bound bool) {
	t.Helper()
	l, err := Listen(v.addr, nil, Options{Cluster: "a", ID: string(v.id), Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	v.addr = l.Addr().String()
	cfg := &raft.NetworkTransportConfig{Stream: l, MaxPool: 2, Timeout: time.Second, Logger: hclog.NewNullLogger()}
	var trans raft.Transport
	if bound {
		trans = NewTransport(l, cfg)
	} else {
		trans = raft.NewNetworkTransportWithConfig(cfg)
	}
	rc := raft.DefaultConfig()
	rc.LocalID = v.id
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
	rc.Logger = hclog.NewNullLogger()
	if v.store == nil {
		v.store, v.snaps = raft.NewInmemStore(), raft.NewInmemSnapshotStore()
	}
	// The state machine is memory: raft applies the log again at a start.
	v.fsm = &raftfsm.Recorder{}
	r, err := raft.NewRaft(rc, v.fsm, v.store, v.store, v.snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	v.r = r
	v.close = func() {
		r.Shutdown().Error()
		trans.(raft.WithClose).Close()
	}
}

func (v *voter) stop() {
	if v.close != nil {
		v.close()
		v.close = nil
	}
}

// TestWipedVoterCannotElectAStaleCandidate is the audit's sequence in raft
// terms: voters L, W, F; F stops; L commits 5 commands with W; L and W
// stop; W comes back wiped (an empty log, no vote) at its address, and F
// comes back. Unbound, W's new life grants F its vote (its configuration
// is empty) and F, whose log lacks the 5 commands, is elected: they are
// lost. Bound, W's new life is a new identity: it refuses what is meant
// for the old, F cannot get a quorum, and nothing committed is lost.
func TestWipedVoterCannotElectAStaleCandidate(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprintf("bound=%v", bound), func(t *testing.T) {
			vs := []*voter{{id: "l.1", addr: "127.0.0.1:0"}, {id: "w.1", addr: "127.0.0.1:0"}, {id: "f.1", addr: "127.0.0.1:0"}}
			var servers []raft.Server
			for _, v := range vs {
				v.start(t, bound)
				servers = append(servers, raft.Server{ID: v.id, Address: raft.ServerAddress(v.addr)})
			}
			t.Cleanup(func() {
				for _, v := range vs {
					v.stop()
				}
			})
			if err := vs[0].r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
				t.Fatal(err)
			}
			var l, w, f *voter
			waitFor(t, "a leader", func() bool {
				for i, v := range vs {
					if v.r.State() == raft.Leader {
						l, w, f = v, vs[(i+1)%3], vs[(i+2)%3]
						return true
					}
				}
				return false
			})
			if err := l.r.Apply([]byte("before"), time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "all applied the first command", func() bool { return len(f.fsm.Applied()) == 1 && len(w.fsm.Applied()) == 1 })
			f.stop()
			for i := 0; i < 5; i++ {
				if err := l.r.Apply([]byte(fmt.Sprint("acked-", i)), time.Second).Error(); err != nil {
					t.Fatal(err)
				}
			}
			l.stop()
			w.stop()
			// W's disk is lost: it starts empty at the same address. A bound
			// node is a new incarnation.
			w.store, w.snaps = nil, nil
			if bound {
				w.id = "w.2"
			}
			w.start(t, bound)
			f.start(t, bound)
			// F's state is watched over the whole window, not sampled once
			// at its end: on a loaded machine a leader with a 50 ms lease
			// may step down and stand again, and a sample at that instant
			// reads as "never elected" (a CI run found it).
			elected := false
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && !elected; time.Sleep(5 * time.Millisecond) {
				elected = f.r.State() == raft.Leader // twenty election timeouts
			}
			if !bound {
				// The hazard the binding exists for: F leads without the 5
				// acknowledged commands. (Should hashicorp/raft stop granting
				// votes from an empty configuration, this says so.)
				if !elected {
					waitFor(t, "unbound, F elected (raft no longer grants a vote from an empty configuration?)", func() bool { return f.r.State() == raft.Leader })
				}
				return
			}
			if elected {
				t.Fatal("F, whose log lacks 5 committed commands, was elected with the vote of W's wiped disk")
			}
			if got := w.fsm.Applied(); len(got) != 0 {
				t.Fatalf("the wiped node applied %v", got)
			}
			// L returns: it leads again with every acknowledged command.
			l.start(t, bound)
			waitFor(t, "L leads again", func() bool { return l.r.State() == raft.Leader })
			if err := l.r.Barrier(time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "F catches up", func() bool { return len(f.fsm.Applied()) == 6 })
			if got := strings.Join(f.fsm.Applied(), ","); got != "before,acked-0,acked-1,acked-2,acked-3,acked-4" {
				t.Fatalf("F applied %s", got)
			}
		})
	}
}

// The port holds at most MaxConns connections others dialled: one over it
// is closed at once, and a slot freed takes the next (a flood of idle
// connections cannot hold the port, issue 25).
func TestConnectionsBounded(t *testing.T) {
	l := listen(t, Options{Cluster: "a", ID: "a1.11111111", Loopback: true, MaxConns: 5})
	accepted := make(chan net.Conn, 100)
	go func() {
		// Exits when the layer closes (the test's cleanup).
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for i := 0; i < 10; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var held []net.Conn
	for len(held) < 5 {
		select {
		case c := <-accepted:
			held = append(held, c)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d connections accepted, want 5", len(held))
		}
	}
	// The port closes the 5 over the bound (polled: a loaded machine may
	// take its time), and no more.
	closed := map[int]bool{}
	for deadline := time.Now().Add(5 * time.Second); len(closed) < 5 && time.Now().Before(deadline); {
		for i, c := range clients {
			if closed[i] {
				continue
			}
			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				closed[i] = true
			}
		}
	}
	if len(closed) != 5 {
		t.Fatalf("%d of the 10 connections were closed by the port, want the 5 over the bound", len(closed))
	}
	held[0].Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("a freed slot did not take the next connection")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// FuzzPreamble: the preamble and its answer, as a dialled or accepting node
// reads them from whoever connects: any bytes decode or are refused, never
// panic, and what was written reads back the same.
func FuzzPreamble(f *testing.F) {
	var p, a bytes.Buffer
	writePreamble(&p, "a2.22222222", "a1.11111111")
	writeAnswer(&a, statusRefused, "a2.22222222", 42, "lost in a recovery")
	var sv bytes.Buffer
	writePreambleFor(&sv, purposeService, 0, "a2.22222222", "a1.11111111")
	var gr bytes.Buffer
	writePreambleFor(&gr, purposeGroup, 3, "a2.22222222", "a1.11111111")
	f.Add(p.Bytes()[1:])
	f.Add(sv.Bytes()[1:])
	f.Add(gr.Bytes()[1:])
	f.Add(a.Bytes())
	f.Add([]byte{preambleVersion, 255})
	f.Add([]byte{preambleService, 7, 0, 0})
	f.Add([]byte{statusOK, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if purpose, group, target, sender, err := readPreamble(bytes.NewReader(b)); err == nil {
			var w bytes.Buffer
			if err := writePreambleFor(&w, purpose, group, target, sender); err != nil {
				t.Fatal(err)
			}
			p2, g2, t2, s2, err := readPreamble(bytes.NewReader(w.Bytes()[1:]))
			if err != nil || p2 != purpose || g2 != group || t2 != target || s2 != sender {
				t.Fatalf("%d %d %q %q read back as %d %d %q %q %v", purpose, group, target, sender, p2, g2, t2, s2, err)
			}
		}
		if status, id, applied, msg, err := readAnswer(bytes.NewReader(b)); err == nil {
			var w bytes.Buffer
			writeAnswer(&w, status, id, applied, msg)
			s2, id2, ap2, msg2, err := readAnswer(bytes.NewReader(w.Bytes()))
			if err != nil || s2 != status || id2 != id || ap2 != applied || (len(msg) <= 4096 && msg2 != msg) {
				t.Fatalf("answer read back differently: %v", err)
			}
		}
	})
}

// A node's request to another (issue 25: forwarding to the leader, asking a
// member's state) goes over the raft port, to the server meant, and the
// accepting side learns who sent it from the preamble: the raft port's
// credential authenticates both ends, no API token crosses.
func TestServiceConnections(t *testing.T) {
	for _, mode := range []string{"gossip-key", "loopback"} {
		t.Run(mode, func(t *testing.T) {
			opts := func(id string) Options {
				o := Options{Cluster: "a", Node: strings.Split(id, ".")[0], ID: id,
					Describe: func() string { return `{"api":"https://` + id + `"}` }}
				if mode == "gossip-key" {
					o.GossipKey = keyA
				} else {
					o.Loopback = true
				}
				return o
			}
			a, b := listen(t, opts("a1.11111111")), listen(t, opts("a2.22222222"))
			addr := b.Addr().String()

			// Not serving requests yet: refused, and not taken for an
			// older build.
			echo(b)
			if _, err := a.DialService("a2.22222222", addr, 2*time.Second); err == nil || errors.Is(err, ErrOlderBuild) {
				t.Fatalf("a node serving no requests: %v", err)
			}

			svc := b.ServiceListener()
			served := make(chan error, 1)
			go func() {
				// Exits after one connection, or when the listener closes.
				c, err := svc.Accept()
				if err != nil {
					served <- err
					return
				}
				defer c.Close()
				if s := c.(*ServiceConn).Sender; s != "a1.11111111" {
					served <- fmt.Errorf("the sender named %q", s)
					return
				}
				buf := make([]byte, 5)
				if _, err := io.ReadFull(c, buf); err != nil {
					served <- err
					return
				}
				_, err = c.Write(buf)
				served <- err
			}()
			raftSide := echo(b) // raft's accept loop sees the connection first
			c, err := a.DialService("a2.22222222", addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(2 * time.Second))
			c.Write([]byte("hello"))
			buf := make([]byte, 5)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
				t.Fatalf("round trip: %q %v", buf, err)
			}
			c.Close()
			if err := <-served; err != nil {
				t.Fatal(err)
			}
			if err := <-raftSide; !errors.Is(err, errHandedOff) {
				t.Fatalf("raft's side of a service connection: %v", err)
			}

			// Meant for another incarnation: refused like raft's.
			echo(b)
			if _, err := a.DialService("a2.33333333", addr, 2*time.Second); !errors.Is(err, ErrWrongIdentity) {
				t.Fatalf("a service dial meant for another incarnation: %v", err)
			}
			// Identify carries what the node says of itself.
			echo(b)
			who, err := a.Identify(addr, 2*time.Second)
			if err != nil || who.Description != `{"api":"https://a2.22222222"}` {
				t.Fatalf("identify: %+v %v", who, err)
			}
			svc.Close()
			if _, err := svc.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("accept after close: %v", err)
			}
		})
	}
}

// A node of the build before service connections reads preamble version 1
// only, and answers version 2 as malformed: the dialler learns it is an
// older build (and forwards the old way), rather than a refusal.
func TestServiceDialToAnOlderBuild(t *testing.T) {
	a := listen(t, Options{Cluster: "a", Node: "a1", ID: "a1.11111111", Loopback: true})
	addr := olderBuild(t, "a2.22222222", func(hdr [2]byte) string {
		return fmt.Sprintf("preamble version %d, want %d", hdr[1], preambleVersion)
	})
	if _, err := a.DialService("a2.22222222", addr, 2*time.Second); !errors.Is(err, ErrOlderBuild) {
		t.Fatalf("a service dial to an older build: %v", err)
	}
}

// olderBuild listens for one connection as a node of an older build would
// answer it: it reads the preamble's first two bytes (magic, version) and
// answers malformed with what answer says of them. It returns the address.
func olderBuild(t *testing.T, id string, answer func(hdr [2]byte) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		// Exits after one connection.
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [2]byte
		io.ReadFull(c, hdr[:])
		writeAnswer(c, statusMalformed, id, 0, answer(hdr))
	}()
	return ln.Addr().String()
}
