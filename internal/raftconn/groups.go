package raftconn

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// A cluster of several raft groups (issue 51, docs/CLUSTER.md "Several raft
// groups per cluster") runs one hashicorp/raft instance per group over the
// node's one raft port. The first group's connections are the layer's own,
// byte for byte what they were before groups (a cluster of one group, and
// every older build, sees nothing new). A connection of group g >= 1 opens
// with a version-2 preamble of purpose 2 that names the group:
//
//	0xA7 | 2 | 2 | g | len(target) | target | len(sender) | sender
//
// The accepting node checks it as any preamble (credentials, refusals, the
// target's identity), then hands the connection to group g's stream layer,
// whose transport serves raft's RPCs on it. A node that runs no group g
// answers it as malformed, naming the group; an older build answers a
// version-2 preamble as malformed too (ErrOlderBuild at the dial). The first
// group's transport runs the port's accept loop: it must run for any group
// to be reached.

// MaxGroup is the highest group a connection can name.
const MaxGroup = 255

// ErrNoGroup: the node dialled runs no raft group of the number the dial
// named (not yet, or no longer).
var ErrNoGroup = errors.New("raftconn: the other node runs no such raft group")

// noGroupAnswer begins the answer of a node that runs no group asked for.
const noGroupAnswer = "this node runs no raft group"

// Group returns the stream layer of raft group g on this port: the layer
// itself for group 0, else a layer whose connections name g. Close it when
// the group stops; the port's Close closes every group's. Group 0's layer is
// the port: closing it (as raft's transport of group 0 does when it closes)
// closes every group's connections, so group 0 stops last. Every group's
// connections count against the port's one bound (Options.MaxConns).
func (l *Layer) Group(g int) (raft.StreamLayer, error) {
	if g == 0 {
		return l, nil
	}
	if g < 0 || g > MaxGroup {
		return nil, fmt.Errorf("raftconn: group %d out of range (0 to %d)", g, MaxGroup)
	}
	l.groups.Lock()
	defer l.groups.Unlock()
	if l.groups.closed {
		return nil, net.ErrClosed
	}
	if _, ok := l.groups.layers[byte(g)]; ok {
		return nil, fmt.Errorf("raftconn: group %d already has a layer on this port", g)
	}
	if l.groups.layers == nil {
		l.groups.layers = map[byte]*groupLayer{}
	}
	gl := &groupLayer{l: l, g: byte(g), ch: make(chan net.Conn), done: make(chan struct{})}
	l.groups.layers[byte(g)] = gl
	return gl, nil
}

// NewGroupTransport is NewTransport for raft group g: raft's network
// transport over the group's stream layer, every RPC bound to the server ID
// it is meant for.
func NewGroupTransport(l *Layer, g int, cfg *raft.NetworkTransportConfig) (Transport, error) {
	sl, err := l.Group(g)
	if err != nil {
		return Transport{}, err
	}
	c := *cfg
	c.Stream = sl
	return Transport{raft.NewNetworkTransportWithConfig(&c)}, nil
}

// closeGroups closes every group's layer: their Accepts return.
func (l *Layer) closeGroups() {
	l.groups.Lock()
	l.groups.closed = true
	layers := l.groups.layers
	l.groups.layers = nil
	l.groups.Unlock()
	for _, gl := range layers {
		gl.closeOnce.Do(func() { close(gl.done) })
	}
}

// groupLayer is raft group g's stream layer (g >= 1) over a Layer's port.
type groupLayer struct {
	l         *Layer
	g         byte
	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

// Accept returns the next connection another node dialled for this group.
func (gl *groupLayer) Accept() (net.Conn, error) {
	select {
	case c := <-gl.ch:
		return c, nil
	case <-gl.done:
		return nil, net.ErrClosed
	}
}

// Close stops the group's connections from being taken: a node that dials
// this group here is then answered that it runs no such group.
func (gl *groupLayer) Close() error {
	gl.l.groups.Lock()
	if gl.l.groups.layers[gl.g] == gl {
		delete(gl.l.groups.layers, gl.g)
	}
	gl.l.groups.Unlock()
	gl.closeOnce.Do(func() { close(gl.done) })
	return nil
}

// Addr is the port's advertised address: every group shares it.
func (gl *groupLayer) Addr() net.Addr { return gl.l.advertise }

// Dial connects to server target of group g: connections of a group are
// always bound (an address made by BindAddress), since only builds that
// bind run groups.
func (gl *groupLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	target, addr, bound := splitBound(address)
	if !bound {
		return nil, fmt.Errorf("raftconn: dial group %d at %s: the address names no server (BindAddress)", gl.g, address)
	}
	c, err := gl.l.dialRaw(addr, timeout)
	if err != nil {
		return nil, err
	}
	if !bindsTo(c) {
		c.Close()
		return nil, fmt.Errorf("%w: %s at %s speaks the legacy protocol (no raft groups)", ErrOlderBuild, target, addr)
	}
	if _, err := gl.l.bindFor(c, purposeGroup, gl.g, target, addr, timeout); err != nil {
		c.Close()
		return nil, err
	}
	return gl.l.trackTo(c, addr)
}

// handOffGroup gives a connection whose preamble named group g (its sender
// and target already checked) to the group's layer, or answers that this
// node runs no such group.
func (c *boundConn) handOffGroup(g byte, sender string) {
	l := c.l
	l.groups.Lock()
	gl := l.groups.layers[g]
	l.groups.Unlock()
	if gl == nil {
		msg := fmt.Sprintf("%s %d", noGroupAnswer, g)
		writeAnswer(c.Conn, statusMalformed, l.id, l.applied(), msg)
		l.logOnce(fmt.Sprintf("nogroup:%d", g), slog.LevelWarn, "raftconn: refused a connection of "+sender+": "+msg)
		c.fail(errHandedOff)
		return
	}
	c.handTo(gl.ch, gl.done, c.Conn)
}
