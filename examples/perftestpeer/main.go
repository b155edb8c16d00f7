// Command perftestpeer is the other side of perftest's latency tools run
// with -R (ib_send_lat -R, ib_write_lat -R, ib_read_lat -R), written with
// goverbs' public API only (cm and verbs): perftest may serve and this
// program connect, or the reverse. With -d naming a kernel RDMA device
// (rxe0, siw0, mlx5_0, ...), which the ibverbs provider reaches through
// rdma-core, it connects through librdmacm (rdma://) and its peer is
// perftest on any device the kernel routes the address to; over goverbs'
// iWARP device tcp0 (the default) its peer is another perftestpeer.
//
//	ib_send_lat -R -n 100                   perftest serves, in one shell
//	perftestpeer -d rxe0 -s HOST -n 100 send_lat
//
//	perftestpeer -d siw0 -b HOST -n 100 write_lat
//	ib_write_lat -R -n 100 HOST             perftest connects, in another
//
// What perftest exchanges with -R: it first connects one rdma_cm
// connection of its own, on the port, for its control messages, each a
// Send that the client sends first and the server answers: perftest's
// version (16 bytes of text), its buffer size and cache line size (4
// bytes each, big-endian), and its path MTU (2 bytes of text); then a
// handshake, a struct pingpong_dest of 56 bytes (LID, outstanding reads,
// QP number, PSN, rkey, the buffer's address, GID, SRQ number and GID
// index, big-endian). It then connects a second rdma_cm connection to
// the same port, for the test's QP, and makes five more handshakes: the
// last four carry the address and rkey of the area the peer writes into
// or reads from. Then the test runs on the second connection:
//
//   - send_lat: a Send ping-pong of -size bytes; the client sends first,
//     each side sends its next message once the peer's has arrived.
//   - write_lat: an RDMA Write ping-pong of -size bytes into the peer's
//     area, whose last byte carries the message's number; the server
//     writes first, each side writes its next once the last byte of its
//     own area shows the peer's.
//   - read_lat: the client reads -size bytes of the server's area with
//     RDMA Reads, one at a time; the server does nothing meanwhile.
//
// send_lat and read_lat end with one more handshake, when both sides are
// done. The exchange is that of perftest 6.06 to 6.10 (Debian's perftest
// 4.5-0.17 to 4.5-0.20); a peer that says it is another version is
// refused, since later versions exchange more.
//
// perftest checks no payload in its latency tests; this program checks
// what the protocol gives it: every completion must be a success, every
// control message and every received message exactly the size it must
// be, every handshake after the first two the same, every Write's last
// byte the next number, and the counts of messages exactly -n. The exit
// status is 0 only then.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	_ "github.com/goverbs/goverbs/provider/ibverbs" // rdma://, the kernel's devices
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// config is what the flags and the argument set.
type config struct {
	test    test
	device  string // -d: the device
	server  string // -s: connect to this server
	bind    string // -b: serve on this address
	port    int
	iters   int
	size    int
	timeout time.Duration
	version string            // the version this side says it is: protocolVersion
	ready   func(addr string) // called once the server listens (tests)
}

func main() {
	var cfg config
	flag.StringVar(&cfg.device, "d", iwarp.DeviceName, "the `device`: tcp0, or a kernel RDMA device reached through librdmacm (rxe0, siw0, ...)")
	flag.StringVar(&cfg.server, "s", "", "connect to the perftest server at this address (client)")
	flag.StringVar(&cfg.bind, "b", "", "serve on this address (server; 0.0.0.0 for all)")
	flag.IntVar(&cfg.port, "p", 18515, "the port (perftest's -p)")
	flag.IntVar(&cfg.iters, "n", 1000, "iterations (perftest's -n; the peer must be given the same)")
	flag.IntVar(&cfg.size, "size", 2, "bytes in each message (perftest's -s; the peer must be given the same)")
	flag.DurationVar(&cfg.timeout, "timeout", time.Minute, "give up when the whole run takes longer than this")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: perftestpeer (-s server | -b bind_address) [-d device] [-p port] [-n iterations] [-size bytes] [-timeout d] send_lat|write_lat|read_lat")
		flag.PrintDefaults()
	}
	flag.Parse()
	var err error
	if flag.NArg() == 1 {
		cfg.test, err = parseTest(flag.Arg(0))
	}
	if flag.NArg() != 1 || err != nil || (cfg.server == "") == (cfg.bind == "") || cfg.iters < 1 || cfg.iters > maxIters || cfg.size < 1 || cfg.size > maxSize {
		if err != nil {
			fmt.Fprintln(os.Stderr, "perftestpeer:", err)
		}
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "perftestpeer:", err)
		os.Exit(1)
	}
}

// Limits of the flags: write_lat's last byte counts modulo 256, so any
// count works, but a run is a test, not a soak; perftest's own maximum
// message is 8 MiB.
const (
	maxIters = 1 << 24
	maxSize  = 8 << 20
)

// test is one of perftest's latency tests.
type test int

const (
	sendLat test = iota
	writeLat
	readLat
)

var testNames = [...]string{sendLat: "send_lat", writeLat: "write_lat", readLat: "read_lat"}

func (t test) String() string { return testNames[t] }

func parseTest(s string) (test, error) {
	for i, n := range testNames {
		if n == s {
			return test(i), nil
		}
	}
	return 0, fmt.Errorf("unknown test %q: send_lat, write_lat or read_lat", s)
}

// access is what the peer may do to this side's area.
func (t test) access() verbs.AccessFlags {
	switch t {
	case writeLat:
		return verbs.AccessRemoteWrite
	case readLat:
		return verbs.AccessRemoteRead
	}
	return 0
}

// closingHandshake says whether the test ends with a handshake (ib_send_lat
// and ib_read_lat do, ib_write_lat does not).
func (t test) closingHandshake() bool { return t != writeLat }

// url is the cm address of host and cfg.port on cfg.device: tcp:// for
// tcp0, rdma:// (librdmacm, which picks the kernel device the address
// routes to) for a kernel device.
func (cfg config) url(host string) string {
	scheme := "tcp://"
	if cfg.device != iwarp.DeviceName {
		scheme = "rdma://"
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(cfg.port))
}

// run is the server (cfg.bind) or the client (cfg.server) of one test
// until ctx ends.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.device == "" {
		cfg.device = iwarp.DeviceName
	}
	if cfg.version == "" {
		cfg.version = protocolVersion
	}
	dev, err := verbs.Open(cfg.device)
	if err != nil {
		return fmt.Errorf("open %s: %w", cfg.device, err)
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	s := &session{cfg: cfg, client: cfg.server != "", pd: pd, out: out}
	defer s.close()
	if err := s.run(ctx); err != nil {
		return err
	}
	return nil
}
