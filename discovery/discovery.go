// Package discovery finds the nodes of a cluster and its peer clusters
// through hashicorp/memberlist: what each node says of itself (member
// metadata, at most 512 bytes), join, leave, and the member table, bounded
// against made-up members. It knows nothing of raft or of the links:
// package membership reads its members for both.
package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/replicator/replicator/api"
)

// GossipVersion is the version of the member metadata below. Readers ignore
// members of another major version (shown, not shipped to).
const GossipVersion = 1

// MemberMeta is what each node gossips about itself (memberlist node meta,
// at most 512 bytes).
type MemberMeta = api.MemberMeta

// Liveness of a member, as memberlist sees it (api's words).
const (
	LiveAlive   = api.LiveAlive
	LiveSuspect = api.LiveSuspect
	LiveDead    = api.LiveDead
	LiveLeft    = api.LiveLeft
)

// Member is one node known through gossip (api.Member).
type Member = api.Member

// Options configure gossip.
type Options struct {
	NodeName  string
	Bind      string   // host:port to listen on (UDP and TCP)
	Advertise string   // host:port others reach this node at (default Bind)
	Join      []string // seeds
	Key       []byte   // memberlist encryption key (16, 24 or 32 bytes); nodes without it cannot join
	// Profile picks memberlist's timing: "wan" (default), "lan", "local".
	Profile string
	Meta    MemberMeta
	// OnChange is called (from memberlist's goroutines) after a member
	// joins, updates, leaves or dies.
	OnChange func(Member)
	// MaxMembers bounds the member table (default 1024): anyone who can
	// send a gossip packet (no key) can describe made-up members. A new one
	// over the bound takes the place of the member departed longest ago,
	// or is not recorded when none departed.
	MaxMembers int
	// ReapAfter is how long a departed (dead or left) member is still
	// shown (default 1h).
	ReapAfter time.Duration
	Logger    *slog.Logger
}

// Discovery finds and watches peers through hashicorp/memberlist.
type Discovery struct {
	ml   *memberlist.Memberlist
	opts Options
	meta []byte

	mu struct {
		sync.Mutex
		members map[string]*Member
		full    bool // the table is full (logged once until room is made)
	}
}

// Start creates the memberlist node and joins the seeds (a seed
// that is not up yet is retried by JoinLoop).
func Start(opts Options) (*Discovery, error) {
	host, port, err := splitHostPort(opts.Bind)
	if err != nil {
		return nil, fmt.Errorf("transport: --gossip-bind %q: %w", opts.Bind, err)
	}
	var conf *memberlist.Config
	switch GossipProfile(opts.Profile, host) {
	case "wan":
		conf = memberlist.DefaultWANConfig()
	case "lan":
		conf = memberlist.DefaultLANConfig()
	case "local":
		conf = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("transport: gossip profile %q, want wan, lan or local", opts.Profile)
	}
	conf.Name = opts.NodeName
	conf.BindAddr, conf.BindPort = host, port
	if opts.Advertise != "" {
		ah, ap, err := splitHostPort(opts.Advertise)
		if err != nil {
			return nil, fmt.Errorf("transport: gossip advertise %q: %w", opts.Advertise, err)
		}
		conf.AdvertiseAddr, conf.AdvertisePort = ah, ap
	}
	if len(opts.Key) > 0 {
		conf.SecretKey = opts.Key
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	conf.Logger = log.New(&slogWriter{opts.Logger}, "", 0)
	if opts.MaxMembers <= 0 {
		opts.MaxMembers = 1024
	}
	if opts.ReapAfter <= 0 {
		opts.ReapAfter = time.Hour
	}
	d := &Discovery{opts: opts}
	d.mu.members = map[string]*Member{}
	d.meta, err = json.Marshal(opts.Meta)
	if err != nil {
		return nil, err
	}
	if len(d.meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("transport: gossip metadata of %d bytes over %d", len(d.meta), memberlist.MetaMaxSize)
	}
	conf.Delegate = metaDelegate{d}
	conf.Events = eventDelegate{d}
	ml, err := memberlist.Create(conf)
	if err != nil {
		return nil, fmt.Errorf("transport: start gossip on %s: %w", opts.Bind, err)
	}
	d.ml = ml
	return d, nil
}

// JoinLoop joins the seeds, retrying until one answers or stop is closed.
// It exits then.
func (d *Discovery) JoinLoop(stop <-chan struct{}) {
	if len(d.opts.Join) == 0 {
		return
	}
	for delay := 200 * time.Millisecond; ; delay = min(delay*2, 10*time.Second) {
		n, err := d.ml.Join(d.opts.Join)
		if n > 0 {
			d.opts.Logger.Info("gossip: joined", "seeds", d.opts.Join, "reached", n)
			return
		}
		d.opts.Logger.Warn("gossip: no seed reachable yet", "seeds", d.opts.Join, "err", err)
		select {
		case <-stop:
			return
		case <-time.After(delay):
		}
	}
}

func splitHostPort(hp string) (string, int, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, err
	}
	if h == "" {
		h = "0.0.0.0"
	}
	return h, port, nil
}

// LocalAddr is the gossip address this node is reachable at.
func (d *Discovery) LocalAddr() string { return d.ml.LocalNode().FullAddress().Addr }

// Members lists every member seen, the departed included, sorted by name;
// alive and suspect come from memberlist's current view.
func (d *Discovery) Members() []Member {
	live := map[string]memberlist.NodeStateType{}
	for _, n := range d.ml.Members() {
		live[n.Name] = n.State
	}
	d.mu.Lock()
	d.reapLocked()
	out := make([]Member, 0, len(d.mu.members))
	for name, m := range d.mu.members {
		c := *m
		if st, ok := live[name]; ok && st == memberlist.StateSuspect {
			c.State = LiveSuspect
		}
		out = append(out, c)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// SetMeta replaces what this node gossips about itself and tells the
// others (within timeout; they learn it at the next push-pull otherwise).
func (d *Discovery) SetMeta(meta MemberMeta, timeout time.Duration) error {
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	if len(b) > memberlist.MetaMaxSize {
		return fmt.Errorf("transport: gossip metadata of %d bytes over %d", len(b), memberlist.MetaMaxSize)
	}
	d.mu.Lock()
	d.opts.Meta, d.meta = meta, b
	d.mu.Unlock()
	return d.ml.UpdateNode(timeout)
}

// Meta is what this node gossips about itself now.
func (d *Discovery) Meta() MemberMeta {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.opts.Meta
}

// Leave announces a graceful departure (first as metadata, so that the
// others record "left" rather than "dead"), then shuts gossip down.
func (d *Discovery) Leave(timeout time.Duration) error {
	meta := d.Meta()
	meta.Leaving = true
	if b, err := json.Marshal(meta); err == nil {
		d.mu.Lock()
		d.meta = b
		d.mu.Unlock()
		d.ml.UpdateNode(timeout / 2)
		// The update is gossip (UDP): a push-pull with each live member
		// (TCP) makes sure they hold it before the leave, which otherwise
		// may overtake it under load and make them record "dead". All at
		// once, and waited for at most timeout/4: one after another, a
		// member that does not answer would hold the shutdown a TCP
		// timeout each. A push still running after the wait exits when its
		// dial or exchange times out (the gossip profile's TCP timeout).
		// The addresses come from this node's own member table: the nodes
		// memberlist hands out are its live records, which its packet
		// handler writes meanwhile (a data race).
		var addrs []string
		d.mu.Lock()
		for _, m := range d.mu.members {
			if m.State == LiveAlive && m.Addr != "" {
				addrs = append(addrs, m.Addr)
			}
		}
		d.mu.Unlock()
		var wg sync.WaitGroup
		for _, addr := range addrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.ml.Join([]string{addr})
			}()
		}
		pushed := make(chan struct{})
		go func() { wg.Wait(); close(pushed) }() // exits with the last push
		select {
		case <-pushed:
		case <-time.After(timeout / 4):
		}
	}
	err := d.ml.Leave(timeout / 2)
	return errors.Join(err, d.ml.Shutdown())
}

func (d *Discovery) record(n *memberlist.Node, state string) {
	if n.Name == d.opts.NodeName {
		return
	}
	var meta MemberMeta
	note := ""
	if err := json.Unmarshal(n.Meta, &meta); err != nil {
		note = "unreadable metadata: " + err.Error()
	} else if meta.V != GossipVersion {
		note = fmt.Sprintf("gossip metadata version %d, this node speaks %d", meta.V, GossipVersion)
	}
	d.mu.Lock()
	m := d.mu.members[n.Name]
	if m == nil {
		d.reapLocked()
		if len(d.mu.members) >= d.opts.MaxMembers && !d.evictLocked() {
			full := !d.mu.full
			d.mu.full = true
			d.mu.Unlock()
			if full {
				d.opts.Logger.Warn("gossip: the member table is full; new members are not recorded until some depart",
					"max", d.opts.MaxMembers, "refused", n.Name)
			}
			return
		}
		m = &Member{Node: n.Name}
		d.mu.members[n.Name] = m
	}
	if m.State != state {
		m.Since = time.Now()
	}
	m.Addr, m.State = n.FullAddress().Addr, state
	if note == "" {
		m.Meta = meta
		if meta.Leaving && state == LiveAlive {
			m.State = "leaving"
		}
	}
	m.Note = note
	c := *m
	d.mu.Unlock()
	if d.opts.OnChange != nil {
		d.opts.OnChange(c)
	}
}

// departed reports a member that is dead or left.
func departed(m *Member) bool { return m.State == LiveDead || m.State == LiveLeft }

// reapLocked forgets the members departed longer than ReapAfter ago.
func (d *Discovery) reapLocked() {
	for name, m := range d.mu.members {
		if departed(m) && time.Since(m.Since) > d.opts.ReapAfter {
			delete(d.mu.members, name)
			d.mu.full = false
		}
	}
}

// evictLocked forgets the member departed longest ago, to make room; it
// reports false when none departed.
func (d *Discovery) evictLocked() bool {
	var oldest *Member
	for _, m := range d.mu.members {
		if departed(m) && (oldest == nil || m.Since.Before(oldest.Since)) {
			oldest = m
		}
	}
	if oldest == nil {
		return false
	}
	delete(d.mu.members, oldest.Node)
	return true
}

// SetNote annotates a member (why it is, or is not, shipped to).
func (d *Discovery) SetNote(node string, shipped bool, note string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.mu.members[node]; m != nil {
		m.Shipped, m.Note = shipped, note
	}
}

type metaDelegate struct{ d *Discovery }

func (m metaDelegate) NodeMeta(limit int) []byte {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	return m.d.meta
}
func (metaDelegate) NotifyMsg([]byte)                       {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte        { return nil }
func (metaDelegate) LocalState(bool) []byte                 { return nil }
func (metaDelegate) MergeRemoteState(buf []byte, join bool) {}

type eventDelegate struct{ d *Discovery }

func (e eventDelegate) NotifyJoin(n *memberlist.Node)   { e.d.record(n, LiveAlive) }
func (e eventDelegate) NotifyUpdate(n *memberlist.Node) { e.d.record(n, LiveAlive) }
func (e eventDelegate) NotifyLeave(n *memberlist.Node) {
	var meta MemberMeta
	if json.Unmarshal(n.Meta, &meta) == nil && meta.Leaving {
		e.d.record(n, LiveLeft)
		return
	}
	e.d.record(n, LiveDead)
}

// slogWriter feeds memberlist's standard logger into slog at debug level
// (it is chatty), errors at warn.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	if len(msg) > 0 && msg[len(msg)-1] == '\n' {
		msg = msg[:len(msg)-1]
	}
	level := slog.LevelDebug
	if len(msg) > 7 && (msg[:7] == "[ERR] m" || msg[:8] == "[WARN] m") && !strings.Contains(msg, "use of closed network connection") {
		// (A send on this node's own socket, closed by a clean stop, is
		// not a problem of the cluster's.)
		level = slog.LevelWarn
	}
	w.l.Log(nil, level, msg, "component", "memberlist")
	return len(p), nil
}

var _ io.Writer = (*slogWriter)(nil)

// GossipProfile is the memberlist timing a node uses: the one given, or
// with none, "local" on a loopback bind address (every member on one
// machine: the WAN profile would take some 40 s to call a stopped node
// dead) and "wan" otherwise (the safe one when members may be far apart).
func GossipProfile(given, bindHost string) string {
	if given != "" {
		return given
	}
	if ip := net.ParseIP(bindHost); (ip != nil && ip.IsLoopback()) || bindHost == "localhost" {
		return "local"
	}
	return "wan"
}
