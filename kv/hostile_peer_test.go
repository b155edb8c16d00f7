package kv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// Hostile peers for the tests of the server's limits: on tcp:// another
// host (connections from 127.0.0.2, where honest clients come from
// 127.0.0.1), on shm:// another process (a child of the test).

// hostileHost is the address the tcp:// hostile peer's connections come
// from: a peer of its own, as the server counts peers.
var hostileHost = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}

// dialFromHostileHost opens a TCP connection to the tcp:// server address
// a from hostileHost.
func dialFromHostileHost(t *testing.T, a string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: hostileHost, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", strings.TrimPrefix(a, "tcp://"))
	if err != nil {
		t.Fatalf("dial from %v: %v", hostileHost.IP, err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc.(*net.TCPConn)
}

// mpaConnect makes an iWARP connection from hostileHost to the tcp://
// server a as simply as RFC 5044 allows (revision 1: no RTR to send),
// naming the kv identity id, and reports whether the server
// accepted it. The connection stays open, and silent, until the test
// ends.
func mpaConnect(t *testing.T, a string, id []byte) bool {
	t.Helper()
	nc := dialFromHostileHost(t, a)
	pd := encodeHello(0, id)
	f := make(wire.Frame, wire.FrameHeaderLen+len(pd))
	f.SetHeader(wire.KeyReq, 0, wire.Revision1, len(pd))
	copy(f[wire.FrameHeaderLen:], pd)
	nc.SetDeadline(time.Now().Add(20 * time.Second)) // a hang guard
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(f); err != nil {
		t.Fatal(err)
	}
	rep := make(wire.Frame, wire.FrameHeaderLen+wire.MaxPrivateData)
	if _, err := io.ReadFull(nc, rep[:wire.FrameHeaderLen]); err != nil {
		t.Fatalf("no MPA Reply: %v", err)
	}
	if _, err := io.ReadFull(nc, rep[wire.FrameHeaderLen:wire.FrameHeaderLen+rep.PrivateDataLen()]); err != nil {
		t.Fatalf("the MPA Reply's private data: %v", err)
	}
	return rep.Flags()&wire.FlagReject == 0
}

// The child process's parts, run by TestMain when GOVERBS_KV_TEST_HOSTILE
// is set: "clients ADDR" dials clients until the server refuses one,
// "silent ADDR N" opens N connections to the shm:// address and says
// nothing on them. Either prints what it holds and keeps it until its
// standard input closes.
func hostileChild(spec string) int {
	f := strings.Fields(spec)
	switch {
	case len(f) == 2 && f[0] == "clients":
		var held []*Client
		var err error
		for len(held) < maxClients {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			var c *Client
			c, err = Dial(ctx, f[1])
			cancel()
			if err != nil {
				break
			}
			held = append(held, c)
		}
		fmt.Printf("held %d: %v\n", len(held), err)
		io.Copy(io.Discard, os.Stdin)
		for _, c := range held {
			c.Close()
		}
		return 0
	case len(f) == 3 && f[0] == "silent":
		n, _ := strconv.Atoi(f[2])
		var held []net.Conn
		for range n {
			nc, err := net.Dial("unixpacket", strings.TrimPrefix(f[1], "shm://"))
			if err != nil {
				break
			}
			held = append(held, nc)
		}
		fmt.Printf("held %d\n", len(held))
		io.Copy(io.Discard, os.Stdin)
		for _, nc := range held {
			nc.Close()
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "GOVERBS_KV_TEST_HOSTILE: %q is not a hostile part\n", spec)
	return 2
}

// startHostileChild runs spec in a child process and returns the line it
// printed; the child ends with the test.
func startHostileChild(t *testing.T, spec string) string {
	t.Helper()
	_, line, err := startChild(t, "GOVERBS_KV_TEST_HOSTILE="+spec)
	if err != nil {
		t.Fatalf("hostile child: %q, %v", line, err)
	}
	return strings.TrimSpace(line)
}

// honestRoundTrip dials a as an honest client, from this process and
// 127.0.0.1, and stores and reads back a value. The timeout is a hang
// guard, far beyond what a Dial takes.
func honestRoundTrip(t *testing.T, a string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, a)
	if err != nil {
		t.Fatalf("an honest client could not connect: %v", err)
	}
	defer c.Close()
	if err := c.Put([]byte("honest"), []byte("value")); err != nil {
		t.Fatalf("the honest client's PUT: %v", err)
	}
	if v, err := c.Get([]byte("honest")); err != nil || string(v) != "value" {
		t.Fatalf("the honest client's GET: %q, %v", v, err)
	}
}

// TestOnePeerCannotTakeEveryClientSlot: a peer that dials clients until
// the server refuses one holds MaxClientsPerPeer of them, is told why it
// was refused, and leaves room for another peer's clients.
func TestOnePeerCannotTakeEveryClientSlot(t *testing.T) {
	cfg := small()
	cfg.RecvDepth = 2
	t.Run("iwarp", func(t *testing.T) {
		a := addrs()["iwarp"]()
		startServer(t, a, cfg)
		held := 0
		for mpaConnect(t, a, nil) {
			if held++; held > maxClients {
				t.Fatalf("the server took more than %d clients of one peer", maxClients)
			}
		}
		if held != maxClients/4 {
			t.Errorf("one peer holds %d clients, want the default MaxClientsPerPeer, %d", held, maxClients/4)
		}
		for range 3 {
			honestRoundTrip(t, a)
		}
	})
	t.Run("shm", func(t *testing.T) {
		a := addrs()["shm"]()
		startServer(t, a, cfg)
		line := startHostileChild(t, "clients "+a)
		want := fmt.Sprintf("held %d: ", maxClients/4)
		if !strings.HasPrefix(line, want) || !strings.Contains(line, errPeerClients.Error()) {
			t.Errorf("the hostile process says %q; want %q and a refusal naming the limit (%q)", line, want, errPeerClients)
		}
		for range 3 {
			honestRoundTrip(t, a)
		}
	})
}

// TestHalfOpenConnectionsHoldUpNoDial: 400 connections of one peer that
// say nothing (and, on tcp://, more that stop halfway through their
// handshake) leave an honest client's Dial to succeed. The hostile
// connections stay open throughout.
func TestHalfOpenConnectionsHoldUpNoDial(t *testing.T) {
	const silent = 400
	t.Run("iwarp", func(t *testing.T) {
		a := addrs()["iwarp"]()
		startServer(t, a, small())
		// Handshakes stalled after the server's MPA Reply (the
		// initiator asks for an RTR it never sends), then connections
		// that send nothing at all.
		for range 2 * maxPeerHandshakes {
			nc := dialFromHostileHost(t, a)
			pd := encodeHello(0, nil)
			f := make(wire.Frame, wire.FrameHeaderLen+wire.V2Len+len(pd))
			f.SetHeader(wire.KeyReq, wire.FlagEnhanced, wire.Revision2, wire.V2Len+len(pd))
			wire.V2(f[wire.FrameHeaderLen:]).Set(4, 4, true, wire.RTRWrite)
			copy(f[wire.FrameHeaderLen+wire.V2Len:], pd)
			nc.Write(f) // the listener may have closed it already: one peer's share is taken

		}
		for range silent {
			dialFromHostileHost(t, a)
		}
		for range 3 {
			honestRoundTrip(t, a)
		}
	})
	t.Run("shm", func(t *testing.T) {
		a := addrs()["shm"]()
		startServer(t, a, small())
		if line := startHostileChild(t, fmt.Sprintf("silent %s %d", a, silent)); line != fmt.Sprintf("held %d", silent) {
			t.Fatalf("the hostile process says %q, want it to hold %d connections", line, silent)
		}
		for range 3 {
			honestRoundTrip(t, a)
		}
	})
}
