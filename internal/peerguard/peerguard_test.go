package peerguard

import (
	"fmt"
	"testing"
	"time"
)

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestBackoffGrows(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	g := New(Config{Strikes: 3, Base: time.Second, Max: 8 * time.Second, Now: c.now})
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	for round, w := range want {
		for i := 1; i < 3; i++ {
			if d := g.Fail("p"); d != 0 {
				t.Fatalf("round %d: failure %d refused the peer for %v; want only the 3rd to", round, i, d)
			}
			if _, ok := g.Refused("p"); ok {
				t.Fatalf("round %d: refused after %d failures", round, i)
			}
		}
		if d := g.Fail("p"); d != w {
			t.Fatalf("round %d: refusal of %v, want %v", round, d, w)
		}
		if left, ok := g.Refused("p"); !ok || left != w {
			t.Fatalf("round %d: Refused = %v, %v; want %v", round, left, ok, w)
		}
		if _, ok := g.Refused("q"); ok {
			t.Fatal("another peer is refused too")
		}
		c.t = c.t.Add(w)
		if _, ok := g.Refused("p"); ok {
			t.Fatalf("round %d: still refused once the period has passed", round)
		}
	}
}

func TestForgetAfterQuiet(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	g := New(Config{Strikes: 1, Base: time.Second, Max: time.Hour, Forget: time.Minute, Now: c.now})
	g.Fail("p")
	c.t = c.t.Add(time.Second)
	if d := g.Fail("p"); d != 2*time.Second {
		t.Fatalf("second refusal %v, want 2s", d)
	}
	c.t = c.t.Add(2*time.Second + 2*time.Minute)
	if d := g.Fail("p"); d != time.Second {
		t.Fatalf("after a quiet period: refusal %v, want the base 1s again", d)
	}
}

func TestMaxPeersKeepsRefused(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	g := New(Config{Strikes: 1, MaxPeers: 8, Now: c.now})
	g.Fail("hostile")
	g.cfg.Strikes = 2 // the others fail once each, never refused
	for i := range 100 {
		g.Fail(fmt.Sprint("flood", i))
	}
	if _, ok := g.Refused("hostile"); !ok {
		t.Fatal("a flood of other peers freed a refused one")
	}
	if len(g.peers) > 8 {
		t.Fatalf("%d peers remembered, bound 8", len(g.peers))
	}
}

func TestDefaults(t *testing.T) {
	cfg := New(Config{}).Config()
	if cfg.Strikes != DefaultStrikes || cfg.Base != DefaultBase || cfg.Max != DefaultMax || cfg.Forget != DefaultForget || cfg.MaxPeers != DefaultMaxPeers {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestMaxPeersAllRefused(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	g := New(Config{Strikes: 1, MaxPeers: 4, Now: c.now})
	for i := range 100 {
		g.Fail(fmt.Sprint("p", i))
	}
	if len(g.peers) > 4 {
		t.Fatalf("%d peers remembered, bound 4", len(g.peers))
	}
	for i := range 4 {
		if _, ok := g.Refused(fmt.Sprint("p", i)); !ok {
			t.Fatalf("peer p%d, refused first, was forgotten", i)
		}
	}
}

// TestFullTableFailsClosed: when every peer the guard remembers is
// refused, a new peer's failures still count, and refuse it.
func TestFullTableFailsClosed(t *testing.T) {
	now := time.Unix(1e9, 0)
	g := New(Config{MaxPeers: 4, Now: func() time.Time { return now }})
	for i := range 4 {
		p := fmt.Sprintf("192.0.2.%d", i)
		for range DefaultStrikes {
			g.Fail(p)
		}
		if _, r := g.Refused(p); !r {
			t.Fatalf("%s not refused after %d failures", p, DefaultStrikes)
		}
	}
	for i := range DefaultStrikes - 1 {
		if d := g.Fail(fmt.Sprintf("198.51.100.%d", i)); d != 0 {
			t.Fatalf("refused after %d failures, not %d", i+1, DefaultStrikes)
		}
	}
	if d := g.Fail("198.51.100.200"); d == 0 {
		t.Fatal("new peers' failures are not counted when the table is full of refused peers")
	}
	if _, r := g.Refused("203.0.113.9"); !r {
		t.Fatal("an unknown peer is let through while new peers' shared record is refused")
	}
	if _, r := g.Refused("192.0.2.0"); !r {
		t.Fatal("a remembered refused peer lost its refusal")
	}
}

// TestIPv6PeersCountedByPrefix: the addresses of one IPv6 /64 share one
// record; other /64s and IPv4 peers do not.
func TestIPv6PeersCountedByPrefix(t *testing.T) {
	now := time.Unix(1e9, 0)
	g := New(Config{Now: func() time.Time { return now }})
	for i := range DefaultStrikes {
		g.Fail(fmt.Sprintf("2001:db8:0:1::%x", i+1))
	}
	if _, r := g.Refused("2001:db8:0:1:ffff::1"); !r {
		t.Fatal("another address of the same /64 is not refused")
	}
	if _, r := g.Refused("2001:db8:0:2::1"); r {
		t.Fatal("an address of another /64 is refused")
	}
	if _, r := g.Refused("::ffff:192.0.2.1"); r {
		t.Fatal("an IPv4-mapped address is refused")
	}
}
