package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/listenwait"
	"github.com/goverbs/goverbs/verbs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	goleak.VerifyTestMain(m)
}

// pair runs a server and a client of srv's test against each other over
// tcp0 on loopback and returns their errors and outputs. cli gets the
// server's address.
func pair(t *testing.T, srv, cli config) (srvErr, cliErr error, srvOut, cliOut string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrs := make(chan string, 1)
	srv.bind, srv.port = "127.0.0.1", 0
	srv.ready = func(a string) { addrs <- a }
	var so, co bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, srv, &so) }()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("server: %v", err)
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	cli.server = host
	if cli.port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	cliErr = run(ctx, cli, &co)
	if cliErr != nil {
		// A client that gave up leaves the server waiting for it.
		cancel()
	}
	srvErr = <-done
	return srvErr, cliErr, so.String(), co.String()
}

// TestLatencyTests runs each test between two perftestpeers over tcp0:
// the whole exchange, both connections and every iteration, with both
// sides reporting success.
func TestLatencyTests(t *testing.T) {
	for _, tc := range []struct {
		test test
		size int
	}{{sendLat, 2}, {sendLat, 4096}, {writeLat, 2}, {writeLat, 1000}, {readLat, 64}} {
		t.Run(tc.test.String()+"/"+strconv.Itoa(tc.size), func(t *testing.T) {
			// More iterations than send_lat's receive depth, and than a
			// byte counts, so that receives are posted again and the
			// Writes' last byte wraps.
			cfg := config{test: tc.test, iters: 300, size: tc.size}
			srvErr, cliErr, so, co := pair(t, cfg, cfg)
			if srvErr != nil || cliErr != nil {
				t.Fatalf("server: %v\nclient: %v", srvErr, cliErr)
			}
			for who, out := range map[string]string{"server": so, "client": co} {
				if tc.test == readLat && who == "server" {
					if !strings.Contains(out, "served the client's Reads of 64 bytes: ok") {
						t.Errorf("%s's output:\n%s", who, out)
					}
					continue
				}
				want := tc.test.String() + " with perftest 6.06: 300 iterations of " + strconv.Itoa(tc.size) + " bytes: ok"
				if !strings.Contains(out, want) {
					t.Errorf("%s's output lacks %q:\n%s", who, want, out)
				}
			}
		})
	}
}

// TestVersionRefused: a peer that says it is a perftest whose exchange
// differs is refused by both sides before anything else is exchanged.
func TestVersionRefused(t *testing.T) {
	srvErr, cliErr, _, _ := pair(t, config{test: sendLat, iters: 10, size: 2},
		config{test: sendLat, iters: 10, size: 2, version: "6.25"})
	if srvErr == nil || !strings.Contains(srvErr.Error(), "the peer is perftest 6.25") {
		t.Errorf("server: %v, want a refusal of version 6.25", srvErr)
	}
	if cliErr == nil {
		t.Errorf("client: no error, want a failure of the exchange its peer refused")
	}
}

// TestSizeMismatch: a Send of another size than -size fails the run at
// the side that receives it.
func TestSizeMismatch(t *testing.T) {
	srvErr, cliErr, _, _ := pair(t, config{test: sendLat, iters: 10, size: 16},
		config{test: sendLat, iters: 10, size: 8})
	if srvErr == nil || !strings.Contains(srvErr.Error(), "message 1 of 10 has 8 bytes, want 16") {
		t.Errorf("server: %v, want a message of the wrong size", srvErr)
	}
	if cliErr == nil {
		t.Errorf("client: no error, want a failed run")
	}
}

// TestDestLayout: struct pingpong_dest as perftest lays it out on a
// 64-bit host, big-endian, and decoded back.
func TestDestLayout(t *testing.T) {
	d := dest{lid: 1, outReads: 2, qpn: 0x11, psn: 0xabcdef, rkey: 0x1234, vaddr: 0x7f0011223344, srqn: 5, gidIndex: -1}
	for i := range d.gid {
		d.gid[i] = byte(0xa0 + i)
	}
	want := []byte{
		0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0x11, 0, 0xab, 0xcd, 0xef, 0, 0, 0x12, 0x34, 0, 0, 0, 0,
		0, 0, 0x7f, 0, 0x11, 0x22, 0x33, 0x44,
		0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
		0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff,
	}
	b := d.encode()
	if !bytes.Equal(b, want) {
		t.Fatalf("encode:\n got %x\nwant %x", b, want)
	}
	// perftest leaves the padding and reads neither srqn nor gid_index.
	b[20], b[49], b[55] = 0x99, 0x99, 0x99
	got := decodeDest(b)
	if !got.same(d) || got.srqn != 0 || got.gidIndex != 0 {
		t.Errorf("decode: %+v, want %+v without srqn and gid_index", got, d)
	}
}

// TestCheckVersion: the versions whose exchange this program speaks, and
// what it refuses.
func TestCheckVersion(t *testing.T) {
	for _, tc := range []struct {
		in []byte
		ok bool
	}{
		{encodeVersion("6.06"), true},
		{encodeVersion("6.10"), true},
		{encodeVersion("6.05"), false},
		{encodeVersion("6.25"), false},
		{encodeVersion("x"), false},
		{bytes.Repeat([]byte{'6'}, versionLen), false},
	} {
		v, err := checkVersion(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("checkVersion(%q) = %q, %v; want ok %v", tc.in, v, err, tc.ok)
		}
	}
}

// TestParseTest: the test names the command takes.
func TestParseTest(t *testing.T) {
	for _, n := range testNames {
		if got, err := parseTest(n); err != nil || got.String() != n {
			t.Errorf("parseTest(%q) = %v, %v", n, got, err)
		}
	}
	if _, err := parseTest("atomic_lat"); err == nil {
		t.Error("parseTest(atomic_lat) succeeded")
	}
}

// fakeClient is a perftest client that says what a test gives it: it
// connects to the server at addr (tcp0) and sends msgs on the control
// connection, each answered by the server, the test's connection made
// after the first five. It returns when every message has been answered
// or one is not; the error is its own failure to connect.
func fakeClient(ctx context.Context, addr string, test test, msgs [][]byte) error {
	dev, err := verbs.Open("tcp0")
	if err != nil {
		return err
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Dealloc()
	c, err := newCtrl(pd)
	if err != nil {
		return err
	}
	defer c.close()
	if c.conn, err = c.ep.Dial(ctx, addr, &cm.Param{}); err != nil {
		return err
	}
	for i, m := range msgs {
		if i == 5 {
			d, err := newDataEP(pd, config{test: test, iters: 10, size: 2})
			if err != nil {
				return err
			}
			defer d.close()
			if d.conn, err = d.ep.Dial(ctx, addr, &cm.Param{}); err != nil {
				return err
			}
		}
		if err := c.send(ctx, m); err != nil {
			return nil
		}
		// The server's answers are as long as the client's messages.
		if _, err := c.recv(ctx, len(m)); err != nil {
			return nil
		}
	}
	return nil
}

// serveFake runs a perftestpeer server of test against fakeClient with
// msgs and returns the server's error.
func serveFake(t *testing.T, test test, msgs [][]byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrs := make(chan string, 1)
	cfg := config{test: test, iters: 10, size: 2, bind: "127.0.0.1", ready: func(a string) { addrs <- a }}
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, io.Discard) }()
	select {
	case a := <-addrs:
		if err := fakeClient(ctx, a, test, msgs); err != nil {
			cancel()
			t.Errorf("the fake client: %v", err)
		}
	case err := <-done:
		t.Fatalf("server: %v", err)
	}
	// The client has closed its connections: a server still waiting for
	// it sees them end.
	return <-done
}

// params are a perftest client's first messages, as perftest sends them.
func params() [][]byte {
	return [][]byte{encodeVersion("6.06"), be32(4096), be32(64), []byte("3\x00"), dest{}.encode()}
}

// TestPeerAreaChanged: a peer whose area is not the same in the four
// handshakes before the test is refused.
func TestPeerAreaChanged(t *testing.T) {
	msgs := append(params(), dest{}.encode())
	for i := range 4 {
		d := dest{qpn: 7, rkey: 0x1234, vaddr: 0x10000}
		if i == 2 {
			d.vaddr += 64
		}
		msgs = append(msgs, d.encode())
	}
	err := serveFake(t, writeLat, msgs)
	if err == nil || !strings.Contains(err.Error(), "handshake 3 of 4 before the test: the peer's area changed") {
		t.Errorf("server: %v, want a refusal of the changed area", err)
	}
}

// TestControlMessageSize: a control message of another size than
// perftest's is refused.
func TestControlMessageSize(t *testing.T) {
	for _, tc := range []struct {
		i    int
		msg  []byte
		want string
	}{
		{0, []byte("6.06\x00"), "the version exchange: the peer's control message has 5 bytes, want 16"},
		{3, []byte("3"), "the MTU exchange: the peer's control message has 1 bytes, want 2"},
		{4, make([]byte, destLen-8), "the handshake before the test's connection: the peer's control message has 48 bytes, want 56"},
	} {
		msgs := params()
		msgs[tc.i] = tc.msg
		err := serveFake(t, sendLat, msgs[:tc.i+1])
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("message %d of %d bytes: server: %v, want %q", tc.i, len(tc.msg), err, tc.want)
		}
	}
}

// TestWrappingArea: a peer's area that would wrap around the address
// space is refused before anything is written to it.
func TestWrappingArea(t *testing.T) {
	msgs := append(params(), dest{}.encode())
	for range 4 {
		msgs = append(msgs, dest{rkey: 1, vaddr: ^uint64(0)}.encode())
	}
	err := serveFake(t, writeLat, msgs)
	if err == nil || !strings.Contains(err.Error(), "wraps around the address space") {
		t.Errorf("server: %v, want a refusal of the wrapping area", err)
	}
}
