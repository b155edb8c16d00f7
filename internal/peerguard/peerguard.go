// Package peerguard cuts off peers that keep failing remote accesses: the
// listeners of the providers count, per peer (a remote IP address on
// tcp0), the connections that ended because the peer named a key, range
// or right it did not have, and refuse that peer's connections for a
// back-off period once it has failed too often. Each further failure
// after a refusal doubles the period, up to a ceiling, so that guessing a
// key costs hours rather than seconds.
//
// A peer that is an IPv6 address is counted by its /64 prefix, the least
// a site is handed, so that one host cannot start afresh by changing its
// interface identifier. When the guard remembers MaxPeers peers and every
// one of them is refused, new peers' failures are counted together on one
// shared record, and while that record is refused so is every peer the
// guard does not remember: a flood of addresses cannot make the guard
// stop counting (it fails closed, at the cost of refusing unknown honest
// peers for the flood's back-off).
package peerguard

import (
	"net/netip"
	"sync"
	"time"
)

// Config says how a Guard treats failing peers. The zero value of a field
// takes its default.
type Config struct {
	// Strikes is the number of failed remote accesses a peer may make
	// before its connections are refused (default 4).
	Strikes int
	// Base is the first refusal period (default 1 s); each refusal after
	// it doubles, up to Max (default 1 h).
	Base, Max time.Duration
	// Forget is how long a peer must make no failed access, after its
	// refusal has ended, before it starts afresh (default 24 h).
	Forget time.Duration
	// MaxPeers bounds the peers remembered (default 65536); when it is
	// reached, peers not refused at the moment are forgotten first, and
	// if all are refused, new peers share one record.
	MaxPeers int
	// Now returns the time (default time.Now), for tests.
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultStrikes  = 4
	DefaultBase     = time.Second
	DefaultMax      = time.Hour
	DefaultForget   = 24 * time.Hour
	DefaultMaxPeers = 1 << 16
)

func (c Config) withDefaults() Config {
	if c.Strikes <= 0 {
		c.Strikes = DefaultStrikes
	}
	if c.Base <= 0 {
		c.Base = DefaultBase
	}
	if c.Max <= 0 {
		c.Max = DefaultMax
	}
	if c.Max < c.Base {
		c.Max = c.Base
	}
	if c.Forget <= 0 {
		c.Forget = DefaultForget
	}
	if c.MaxPeers <= 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Guard counts failures per peer and says which peers are refused. It is
// safe for concurrent use; its zero value is not: use New.
type Guard struct {
	cfg      Config
	mu       sync.Mutex
	peers    map[string]*record
	overflow record // the failures of new peers while the table is full of refused ones
}

type record struct {
	strikes int       // failures since the last refusal
	bans    int       // refusals so far: the next lasts Base<<bans
	until   time.Time // refused until then
	last    time.Time // the last failure
}

// New returns a Guard with cfg (defaults filled in).
func New(cfg Config) *Guard {
	return &Guard{cfg: cfg.withDefaults(), peers: map[string]*record{}}
}

// Config returns the guard's configuration, defaults filled in.
func (g *Guard) Config() Config { return g.cfg }

// Fail records a failed remote access by peer. It reports the refusal
// period that starts now, or 0 if the peer is not refused yet.
func (g *Guard) Fail(peer string) time.Duration {
	peer = key(peer)
	now := g.cfg.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.peers[peer]
	if r != nil && now.After(r.until) && now.Sub(r.last) > g.cfg.Forget && now.Sub(r.until) > g.cfg.Forget {
		r = nil // quiet long enough: starts afresh
	}
	if r == nil {
		if g.makeRoom(now) {
			r = &record{}
			g.peers[peer] = r
		} else {
			r = &g.overflow // every peer remembered is refused now
		}
	}
	r.last = now
	if r.strikes++; r.strikes < g.cfg.Strikes {
		return 0
	}
	r.strikes = 0
	d := g.cfg.Max
	if r.bans < 62 && g.cfg.Base<<r.bans > 0 && g.cfg.Base<<r.bans < g.cfg.Max {
		d = g.cfg.Base << r.bans
	}
	r.bans++
	r.until = now.Add(d)
	return d
}

// Refused reports whether peer is refused now, and for how much longer.
func (g *Guard) Refused(peer string) (time.Duration, bool) {
	peer = key(peer)
	now := g.cfg.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.peers[peer]
	if r == nil {
		r = &g.overflow
	}
	if !now.Before(r.until) {
		return 0, false
	}
	return r.until.Sub(now), true
}

// makeRoom forgets peers, if the guard remembers MaxPeers of them: those
// quiet for Forget first, then any not refused now. A flood of addresses
// can make the guard forget peers that failed, never free refused ones.
// It reports whether there is room. g.mu is held.
func (g *Guard) makeRoom(now time.Time) bool {
	if len(g.peers) < g.cfg.MaxPeers {
		return true
	}
	for p, r := range g.peers {
		if now.After(r.until) && now.Sub(r.last) > g.cfg.Forget {
			delete(g.peers, p)
		}
	}
	for p, r := range g.peers {
		if len(g.peers) < g.cfg.MaxPeers {
			break
		}
		if !now.Before(r.until) {
			delete(g.peers, p)
		}
	}
	return len(g.peers) < g.cfg.MaxPeers
}

// key is the name peer is counted under: an IPv6 address's /64 prefix,
// else peer itself.
func key(peer string) string {
	a, err := netip.ParseAddr(peer)
	if err != nil || !a.Is6() || a.Is4In6() {
		return peer
	}
	p, err := a.Prefix(64)
	if err != nil {
		return peer
	}
	return p.String()
}
