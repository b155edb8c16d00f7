package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// The ping command speaks the protocol of librdmacm's rping, so that
// either end may be rping itself (for instance on a Linux host with
// siw): the client sends the address, rkey and length of its source
// buffer; the server reads it with an RDMA Read and answers "go ahead";
// the client sends its sink buffer; the server writes the data back with
// an RDMA Write and answers "go ahead" again; the client compares. Each
// message is 16 bytes: address (8), rkey (4), length (4), big-endian.

const (
	pingInfoLen    = 16
	pingMinSize    = 26 // rping's RPING_MIN_BUFSIZE: sizeof(stringify(INT_MAX)) + sizeof("rdma-ping-%d: ")
	pingMaxSize    = 64*1024 - 1
	pingDefaultRun = 64
	pingPort       = 7174
)

// pingConfig is what the ping flags set.
type pingConfig struct {
	server   bool
	client   bool
	addr     string
	port     int
	count    int
	size     int
	verbose  bool
	validate bool
	crc      bool
	timeout  time.Duration
	url      string // the cm address: addr, or rping's -a host -p port as tcp://host:port
	device   string // -d: a kernel RDMA device reached through librdmacm (rdma://), or tcp0
}

func runPing(ctx context.Context, e *env, args []string) error {
	cfg := pingConfig{}
	fs := newFlagSet("ping", "", `Ping runs the ping-pong of librdmacm's rping, over iWARP (tcp://) so
that either side may be rping on a host with an iWARP device (Linux siw),
or over any other provider's address: the client advertises its buffer,
the server pulls it with an RDMA Read and pushes it back into the
client's sink with an RDMA Write, and the client checks that the data
came back intact. Each ping's data follows rping's pattern
("rdma-ping-N: ABC..."), which the server checks too.

  goverbs ping -s -a tcp://0.0.0.0:7174                 serve (until the client disconnects)
  goverbs ping -c -a tcp://10.77.0.2:7174 -C 100 -S 64  ping a server 100 times
  goverbs ping -c -a 10.77.0.2 -p 7174 -C 100 -S 64     the same, in rping's form
  goverbs ping -s -a shm://@ping                        serve over shared memory, on this host`, e)
	fs.Bool(&cfg.server, "server", "s", "run the server side")
	fs.Bool(&cfg.client, "client", "c", "run the client side")
	fs.String(&cfg.addr, "addr", "a", "", "the address to listen on (-s; default tcp://:7174, every interface) or to\nconnect to (-c): tcp://host:port, shm://@name or shm:///path.sock; or, as rping\ntakes it, a host, with the port in -p")
	pingInt(fs, &cfg.port, "port", "p", pingPort, "the TCP port of an address given as a host (rping's form)")
	fs.String(&cfg.device, "device", "d", "", "the device, when an address given as a host should not go to tcp0: a\nkernel RDMA device (rxe0, siw0, mlx5_0, ...) reached through librdmacm, as rping uses")
	pingInt(fs, &cfg.count, "count", "C", 0, "pings to run (client: 0 runs until interrupted; server: the\nnumber the client must complete, 0 for any)")
	pingInt(fs, &cfg.size, "size", "S", pingDefaultRun, fmt.Sprintf("bytes of ping data (%d to %d)", pingMinSize, pingMaxSize))
	fs.Bool(&cfg.verbose, "verbose", "v", "print each ping's data, as rping -v does")
	fs.Bool(&cfg.validate, "validate", "V", "check each ping's data (always on; accepted for rping's -V)")
	fs.Bool(&cfg.crc, "crc", "", "ask for MPA CRC32c (the peer may ask for it either way)")
	fs.Duration(&cfg.timeout, "timeout", "", 30*time.Second, "give up when a step waits longer than this")
	if err := fs.parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usageError("unexpected arguments %q", fs.Args())
	case cfg.server == cfg.client:
		return usageError("give exactly one of -s (server) and -c (client)")
	case cfg.client && cfg.addr == "":
		return usageError("the client needs the server's address: -a tcp://host:port (or rping's -a host -p port)")
	case cfg.size < pingMinSize || cfg.size > pingMaxSize:
		return usageError("-S %d: the size must be %d to %d", cfg.size, pingMinSize, pingMaxSize)
	case cfg.count < 0:
		return usageError("-C %d: the count must not be negative", cfg.count)
	case cfg.port <= 0 || cfg.port > 65535:
		return usageError("-p %d: not a TCP port", cfg.port)
	case cfg.timeout <= 0:
		return usageError("--timeout must be positive, got %v", cfg.timeout)
	}
	var err error
	if cfg.url, err = pingURL(cfg.addr, cfg.port, fs.isSet("port"), cfg.device); err != nil {
		return err
	}
	if cfg.crc {
		iwarp.SetCRC(true)
	}
	p, err := newPinger(cfg)
	if err != nil {
		return err
	}
	defer p.close()
	if cfg.server {
		return p.serve(ctx, e.stdout)
	}
	return p.ping(ctx, e.stdout)
}

// pingURL returns the cm address ping listens on or dials: addr when it
// is one (tcp://host:port, shm://@name, ...; a tcp:// address without a
// port takes port), else rping's form, host addr and TCP port port. A
// port given with -p beside a cm address is refused, so that no flag is
// silently ignored. A host with -d naming a kernel device (not tcp0) is
// an rdma:// address, which librdmacm resolves.
func pingURL(addr string, port int, portSet bool, device string) (string, error) {
	if !strings.Contains(addr, "://") {
		scheme := "tcp://"
		if device != "" && device != iwarp.DeviceName {
			scheme = "rdma://" // a kernel device, through librdmacm
		}
		return scheme + net.JoinHostPort(addr, strconv.Itoa(port)), nil
	}
	if portSet {
		return "", usageError("-p %d beside -a %s: give the port in the address (tcp://host:port), or the host alone with -p", port, addr)
	}
	if host, ok := strings.CutPrefix(addr, "tcp://"); ok {
		if _, _, err := net.SplitHostPort(host); err != nil {
			return "tcp://" + net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(port)), nil
		}
	}
	return addr, nil
}

// pingInt defines an int flag of fs.
func pingInt(fs *flagSet, p *int, long, short string, value int, usage string) {
	fs.IntVar(p, long, value, usage)
	fs.alias(long, short)
}

// pinger holds one side's verbs objects: rping's four buffers, one CQ
// for sends and receives, and the QP.
type pinger struct {
	cfg    pingConfig
	ctx    *verbs.Context
	pd     *verbs.PD
	cq     *verbs.CQ
	ep     *cm.Endpoint
	qp     *verbs.QP
	conn   *cm.Conn
	recv   *verbs.MR // the 16-byte message received
	send   *verbs.MR // the 16-byte message sent
	rdma   *verbs.MR // the sink: the server's Read target and the client's Write target
	start  *verbs.MR // the client's source
	wc     []verbs.WorkCompletion
	closed []func()
}

func newPinger(cfg pingConfig) (*pinger, error) {
	p := &pinger{cfg: cfg, wc: make([]verbs.WorkCompletion, 8)}
	var err error
	fail := func(what string, err error) (*pinger, error) {
		p.close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	dev := cfg.device
	if dev == "" {
		var err error
		if dev, err = cm.Device(cfg.url); err != nil {
			return fail("address "+cfg.url, err)
		}
	}
	if p.ctx, err = verbs.Open(dev); err != nil {
		return fail("open device "+dev, err)
	}
	p.closed = append(p.closed, func() { p.ctx.Close() })
	if p.pd, err = p.ctx.AllocPD(); err != nil {
		return fail("allocate a PD", err)
	}
	if p.cq, err = p.ctx.CreateCQ(64); err != nil {
		return fail("create a CQ", err)
	}
	// An endpoint's QP takes receives before it is connected, as rping's
	// does (rdma_create_qp leaves it in Init).
	if p.ep, err = cm.NewEndpoint(p.pd, verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail("create a QP", err)
	}
	p.qp = p.ep.QP()
	remote := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	if p.recv, err = p.pd.AllocMR(pingInfoLen, verbs.AccessLocalWrite); err != nil {
		return fail("register the receive buffer", err)
	}
	if p.send, err = p.pd.AllocMR(pingInfoLen, 0); err != nil {
		return fail("register the send buffer", err)
	}
	if p.rdma, err = p.pd.AllocMR(cfg.size, remote); err != nil {
		return fail("register the RDMA buffer", err)
	}
	if cfg.client {
		if p.start, err = p.pd.AllocMR(cfg.size, remote); err != nil {
			return fail("register the source buffer", err)
		}
	}
	return p, nil
}

// close tears everything down: the connection, then the device.
func (p *pinger) close() {
	if p.conn != nil {
		p.conn.Close()
	}
	for i := len(p.closed) - 1; i >= 0; i-- {
		p.closed[i]()
	}
}

// postRecv posts the receive of the next 16-byte message.
func (p *pinger) postRecv() error {
	_, err := p.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{p.recv.SGE(0, pingInfoLen)}}})
	return err
}

// sendInfo sends the address, rkey and length of n bytes of mr (or
// zeros, the server's "go ahead", when mr is nil).
func (p *pinger) sendInfo(mr *verbs.MR, n int) error {
	b := p.send.Bytes()
	clear(b)
	if mr != nil {
		binary.BigEndian.PutUint64(b[0:], mr.Addr())
		binary.BigEndian.PutUint32(b[8:], mr.RKey())
		binary.BigEndian.PutUint32(b[12:], uint32(n))
	}
	_, err := p.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{p.send.SGE(0, pingInfoLen)}}})
	return err
}

// errDisconnected says the peer went away while a completion was awaited.
var errDisconnected = errors.New("the peer disconnected")

// await waits for the completion of the operation op (a receive is
// reposted at once, as rping does); send completions met on the way are
// checked and dropped.
func (p *pinger) await(ctx context.Context, op verbs.WCOpcode) (verbs.WorkCompletion, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	defer cancel()
	for {
		n, err := p.cq.Wait(ctx, p.wc)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return verbs.WorkCompletion{}, fmt.Errorf("no %v completion within %v: is the peer running?", op, p.cfg.timeout)
			}
			return verbs.WorkCompletion{}, err
		}
		var found *verbs.WorkCompletion
		for i := range p.wc[:n] {
			wc := &p.wc[i]
			switch {
			case wc.Status == verbs.WCWRFlushErr:
				return *wc, errDisconnected
			case wc.Status != verbs.WCSuccess:
				return *wc, fmt.Errorf("%v completion (WR %d) failed: %v", wc.Opcode, wc.WRID, wc.Status)
			case wc.Opcode == verbs.WCRecv:
				if wc.ByteLen != pingInfoLen {
					return *wc, fmt.Errorf("received %d bytes, an rping message is %d", wc.ByteLen, pingInfoLen)
				}
				if err := p.postRecv(); err != nil {
					return *wc, fmt.Errorf("post receive: %w", err)
				}
			}
			if wc.Opcode == op && found == nil {
				found = wc
			}
		}
		if found != nil {
			if n > 1 {
				// rping's exchange is strictly alternating: nothing else
				// but send completions can be in this batch.
				for i := range p.wc[:n] {
					if &p.wc[i] != found && p.wc[i].Opcode != verbs.WCSend {
						return p.wc[i], fmt.Errorf("unexpected %v completion while waiting for %v", p.wc[i].Opcode, op)
					}
				}
			}
			return *found, nil
		}
	}
}

// pingData fills b with rping's data for ping number n: "rdma-ping-n: "
// then the letters from A (advancing one a ping) to z, wrapping, and a
// final NUL.
func pingData(b []byte, n int) {
	prefix := "rdma-ping-" + strconv.Itoa(n) + ": "
	i := copy(b, prefix)
	c := byte(65 + n%58)
	for ; i < len(b); i++ {
		b[i] = c
		if c++; c > 122 {
			c = 65
		}
	}
	if len(b) > 0 {
		b[len(b)-1] = 0
	}
}

// ping runs the client: connect, then ping count times (forever when
// count is 0).
func (p *pinger) ping(ctx context.Context, w io.Writer) error {
	if err := p.postRecv(); err != nil {
		return fmt.Errorf("post receive: %w", err)
	}
	addr := p.cfg.url
	dctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	conn, err := p.ep.Dial(dctx, addr, &cm.Param{ResponderResources: 1, InitiatorDepth: 1})
	cancel()
	if err != nil {
		return err
	}
	p.conn = conn
	want := make([]byte, p.cfg.size)
	started := time.Now()
	i := 0
	for ; p.cfg.count == 0 || i < p.cfg.count; i++ {
		if ctx.Err() != nil {
			break
		}
		pingData(p.start.Bytes(), i)
		clear(p.rdma.Bytes())
		if err := p.sendInfo(p.start, p.cfg.size); err != nil {
			return fmt.Errorf("ping %d: send the source buffer: %w", i, err)
		}
		if _, err := p.await(ctx, verbs.WCRecv); err != nil {
			return fmt.Errorf("ping %d: waiting for the server's Read: %w", i, err)
		}
		if err := p.sendInfo(p.rdma, p.cfg.size); err != nil {
			return fmt.Errorf("ping %d: send the sink buffer: %w", i, err)
		}
		if _, err := p.await(ctx, verbs.WCRecv); err != nil {
			return fmt.Errorf("ping %d: waiting for the server's Write: %w", i, err)
		}
		pingData(want, i)
		if got := p.rdma.Bytes(); !bytes.Equal(got, want) {
			return fmt.Errorf("ping %d: data mismatch: sent %q, got back %q", i, want, got)
		}
		if p.cfg.verbose {
			fmt.Fprintf(w, "ping data: %s\n", cString(p.rdma.Bytes()))
		}
	}
	elapsed := time.Since(started)
	fmt.Fprintf(w, "goverbs ping: %d pings of %d bytes to %s, data verified, %s per ping\n",
		i, p.cfg.size, addr, perPing(elapsed, i))
	return nil
}

// serve runs the server: accept one connection and answer pings until
// the client disconnects.
func (p *pinger) serve(ctx context.Context, w io.Writer) error {
	l, err := cm.Listen(p.cfg.url)
	if err != nil {
		return err
	}
	defer l.Close()
	req, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	if err := p.postRecv(); err != nil {
		req.Reject(nil)
		return fmt.Errorf("post receive: %w", err)
	}
	conn, err := p.ep.Accept(req, &cm.Param{ResponderResources: 1, InitiatorDepth: 1})
	if err != nil {
		return err
	}
	p.conn = conn
	want := make([]byte, p.cfg.size)
	started := time.Now()
	i := 0
	for ; ; i++ {
		_, err := p.await(ctx, verbs.WCRecv)
		if errors.Is(err, errDisconnected) {
			break
		}
		if err != nil {
			return fmt.Errorf("ping %d: waiting for the client's source buffer: %w", i, err)
		}
		info := p.recv.Bytes()
		raddr, rkey, rlen := binary.BigEndian.Uint64(info), binary.BigEndian.Uint32(info[8:]), binary.BigEndian.Uint32(info[12:])
		if int(rlen) > p.cfg.size || rlen < pingMinSize {
			return fmt.Errorf("ping %d: the client's buffer is %d bytes, not %d to -S %d", i, rlen, pingMinSize, p.cfg.size)
		}
		clear(p.rdma.Bytes())
		if _, err := p.qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{p.rdma.SGE(0, int(rlen))}, RemoteAddr: raddr, RKey: rkey}}); err != nil {
			return fmt.Errorf("ping %d: post the RDMA Read: %w", i, err)
		}
		if _, err := p.await(ctx, verbs.WCRDMARead); err != nil {
			return fmt.Errorf("ping %d: RDMA Read of the client's data: %w", i, err)
		}
		got := p.rdma.Bytes()[:rlen]
		pingData(want[:rlen], i)
		if !bytes.Equal(got, want[:rlen]) {
			return fmt.Errorf("ping %d: the client's data is not rping's: got %q, want %q", i, got, want[:rlen])
		}
		if p.cfg.verbose {
			fmt.Fprintf(w, "server ping data: %s\n", cString(got))
		}
		if err := p.sendInfo(nil, 0); err != nil {
			return fmt.Errorf("ping %d: send go-ahead: %w", i, err)
		}
		if _, err := p.await(ctx, verbs.WCRecv); err != nil {
			return fmt.Errorf("ping %d: waiting for the client's sink buffer: %w", i, err)
		}
		raddr, rkey = binary.BigEndian.Uint64(info), binary.BigEndian.Uint32(info[8:])
		n := len(cString(got)) + 1 // rping writes strlen+1 bytes
		if _, err := p.qp.PostSend([]verbs.SendWR{{WRID: 4, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{p.rdma.SGE(0, n)}, RemoteAddr: raddr, RKey: rkey}}); err != nil {
			return fmt.Errorf("ping %d: post the RDMA Write: %w", i, err)
		}
		if _, err := p.await(ctx, verbs.WCRDMAWrite); err != nil {
			return fmt.Errorf("ping %d: RDMA Write of the data back: %w", i, err)
		}
		if err := p.sendInfo(nil, 0); err != nil {
			return fmt.Errorf("ping %d: send go-ahead: %w", i, err)
		}
	}
	fmt.Fprintf(w, "goverbs ping: served %d pings of %d bytes on %s, data verified, %s per ping\n",
		i, p.cfg.size, l.Addr(), perPing(time.Since(started), i))
	if p.cfg.count > 0 && i < p.cfg.count {
		return fmt.Errorf("the client disconnected after %d pings, -C asked for %d", i, p.cfg.count)
	}
	return nil
}

// cString returns b up to its first NUL.
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

func perPing(d time.Duration, n int) string {
	if n == 0 {
		return "-"
	}
	return fmtDur(d / time.Duration(n))
}
