package rsock

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Limits and defaults of Config.
const (
	// MinRingSize and MaxRingSize bound Config.RingSize.
	MinRingSize = 4 << 10
	MaxRingSize = 8 << 20
	// DefaultRingSize is the receive ring of a zero Config, except on
	// iWARP devices.
	DefaultRingSize = 256 << 10
	// DefaultRingSizeIWARP is the receive ring of a zero Config on iWARP
	// devices (tcp0). There the peer's bytes come through a socket whose
	// system calls, not copies, set a stream's pace: a ring that holds
	// two 1 MiB Writes lets the writer send the next while the reader
	// copies out the last, as the kernel's TCP buffers let a TCP writer
	// go on; over a ring of 256 KiB the writer waits for credits four
	// times a MiB. The price is memory, 4 MiB registered at each end of
	// a connection between two zero Configs.
	DefaultRingSizeIWARP = 2 << 20
	// DefaultMaxConns bounds a zero Config's listener.
	DefaultMaxConns = 4096
	// DefaultSpin is how long a zero Config's blocked Read or Write polls
	// before it parks.
	DefaultSpin = 20 * time.Microsecond
	// DefaultZeroCopyMin is the least Write a zero Config sends without
	// copying it, except on iWARP devices.
	DefaultZeroCopyMin = 64 << 10
	// DefaultZeroCopyMinIWARP is the least Write a zero Config sends
	// without copying it on iWARP devices (tcp0). There a zero-copy Write
	// returns only once the peer has confirmed its last RDMA Write, a
	// round trip that costs more than the copy of a smaller Write.
	DefaultZeroCopyMinIWARP = 256 << 10
)

// ctrlRecvs is how many receives each side posts for control messages:
// the number of messages its peer may have in flight.
const ctrlRecvs = 32

// Config configures connections. The zero Config uses the defaults.
type Config struct {
	// RingSize is the receive ring each side of a connection advertises,
	// in bytes (MinRingSize to MaxRingSize; 0: DefaultRingSize, and
	// DefaultRingSizeIWARP on iWARP devices). A side registers its own
	// ring and a staging copy of its peer's, so a
	// connection between two sides of the same RingSize holds about
	// 2×RingSize of registered memory at each end (Conn.RegisteredBytes).
	RingSize int
	// MaxConns bounds how many connections a listener keeps open at once;
	// further requests are rejected, and the dialler's Dial fails with
	// cm.ErrRejected (0: DefaultMaxConns).
	MaxConns int
	// Spin is how long a Read or Write that must wait polls for the peer
	// before it parks its goroutine (0: DefaultSpin; negative: never).
	// Spinning saves a wake-up on request/response traffic at the cost
	// of CPU while it lasts. A connection whose recent waits (of Reads,
	// or of Writes) lasted on average more than Spin and less than 10×Spin
	// polls up to twice that average instead: a peer that takes a little
	// longer than Spin to answer, as an RPC server does, is still caught
	// without a wake-up, and an idle connection spins Spin and parks.
	// (On iWARP devices, tcp0, where each poll is a system call, 4×Spin
	// at most.)
	Spin time.Duration
	// ZeroCopyMin is the least Write, in bytes, that is not copied: the
	// device reads the caller's buffer, registered while that Write
	// lasts and kept registered, for the next Write of the same buffer,
	// until a Write of another or Close (0: DefaultZeroCopyMin, and
	// DefaultZeroCopyMinIWARP on iWARP devices; negative: every Write is
	// copied). Smaller Writes are copied into a staging buffer, from
	// which the device reads them after Write returned.
	ZeroCopyMin int

	noImm bool // tests: notify by Send even where the device has immediate data
	// tests: the QP's send queue holds this many work requests, fewer
	// than the connection plans for, so that the device takes a post in
	// part (0: as many as it plans for)
	qpSendWR int
}

// ringSize is the receive ring over a device of the transport.
func (cfg *Config) ringSize(transport string) (int, error) {
	s := cfg.RingSize
	switch {
	case s == 0 && transport == "iwarp":
		s = DefaultRingSizeIWARP
	case s == 0:
		s = DefaultRingSize
	}
	if s < MinRingSize || s > MaxRingSize {
		return 0, fmt.Errorf("rsock: ring size %d outside %d to %d", s, MinRingSize, MaxRingSize)
	}
	return s, nil
}

func (cfg *Config) spin() time.Duration {
	switch {
	case cfg.Spin == 0:
		return DefaultSpin
	case cfg.Spin < 0:
		return 0
	}
	return cfg.Spin
}

// zeroCopyMin is the least Write sent without a copy over a device of
// the transport, 0 for none.
func (cfg *Config) zeroCopyMin(transport string) int {
	switch {
	case cfg.ZeroCopyMin == 0 && transport == "iwarp":
		return DefaultZeroCopyMinIWARP
	case cfg.ZeroCopyMin == 0:
		return DefaultZeroCopyMin
	case cfg.ZeroCopyMin < 0:
		return 0
	}
	return cfg.ZeroCopyMin
}

// Listen listens on addr (loop://name, shm:///path.sock, shm://@name,
// tcp://host:port) with the default Config.
func Listen(addr string) (net.Listener, error) { return (&Config{}).Listen(addr) }

// Dial connects to the listener at addr with the default Config. Its
// signature is that of a context dialer (grpc.WithContextDialer).
func Dial(ctx context.Context, addr string) (net.Conn, error) {
	return (&Config{}).Dial(ctx, addr)
}

// Listener accepts rsock connections. It implements net.Listener.
type Listener struct {
	cfg    Config
	l      *cm.Listener
	addr   Addr
	dev    string
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	live   int // connections accepted and not yet closed
	closed bool
}

// Listen listens on addr with cfg.
func (cfg *Config) Listen(addr string) (net.Listener, error) {
	if _, err := cfg.ringSize(""); err != nil {
		return nil, err
	}
	dev, err := cm.Device(addr)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "rsock", Err: err}
	}
	l, err := cm.Listen(addr)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "rsock", Err: err}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Listener{cfg: *cfg, l: l, addr: Addr{l.Addr()}, dev: dev, ctx: ctx, cancel: cancel}, nil
}

// Addr returns the address the listener serves.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops listening; a blocked Accept returns net.ErrClosed.
// Connections already accepted stay open.
func (l *Listener) Close() error {
	l.mu.Lock()
	closed := l.closed
	l.closed = true
	l.mu.Unlock()
	if closed {
		return &net.OpError{Op: "close", Net: "rsock", Addr: l.addr, Err: net.ErrClosed}
	}
	l.cancel()
	return l.l.Close()
}

// rejectBusy is the private data of a rejection for MaxConns.
var rejectBusy = []byte("rsock: listener at MaxConns")

// Accept waits for the next connection. Requests that are not rsock's or
// come beyond MaxConns are rejected without ending Accept.
func (l *Listener) Accept() (net.Conn, error) {
	maxConns := l.cfg.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	for {
		r, err := l.l.Accept(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil {
				err = net.ErrClosed
			}
			return nil, &net.OpError{Op: "accept", Net: "rsock", Addr: l.addr, Err: err}
		}
		h, err := parseHello(r.PrivateData())
		if err != nil {
			r.Reject(nil)
			continue
		}
		l.mu.Lock()
		full := l.live >= maxConns
		if !full {
			l.live++
		}
		l.mu.Unlock()
		if full {
			r.Reject(rejectBusy)
			continue
		}
		c, err := newConn(l.dev, &l.cfg, h)
		if err != nil {
			c = nil
		} else {
			err = c.connect(func(p *cm.Param) (*cm.Conn, error) { return r.Accept(c.qp, p) })
		}
		if err != nil {
			l.done()
			if c == nil {
				// This side is out of resources: the requester's Dial
				// fails with a rejection that says so.
				msg := []byte("rsock: listener: " + err.Error())
				r.Reject(msg[:min(len(msg), 56)])
			}
			// Otherwise the requester sees the broken connection. The
			// listener goes on.
			continue
		}
		c.laddr, c.raddr = l.addr, Addr{fmt.Sprintf("%s?qp=%d", scheme(l.addr.URL), c.qp.Num())}
		c.onClose = l.done
		return c, nil
	}
}

func (l *Listener) done() {
	l.mu.Lock()
	l.live--
	l.mu.Unlock()
}

func scheme(url string) string {
	s, _, _ := strings.Cut(url, "://")
	return s + "://"
}

// Dial connects to the listener at addr with cfg.
func (cfg *Config) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if _, err := cfg.ringSize(""); err != nil {
		return nil, err
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "rsock", Addr: Addr{addr}, Err: err}
	}
	dev, err := cm.Device(addr)
	if err != nil {
		return nil, opErr(err)
	}
	c, err := newConn(dev, cfg, nil)
	if err != nil {
		return nil, opErr(err)
	}
	if err := c.connect(func(p *cm.Param) (*cm.Conn, error) { return cm.Dial(ctx, addr, c.qp, p) }); err != nil {
		return nil, opErr(err)
	}
	c.laddr, c.raddr = Addr{fmt.Sprintf("%s?qp=%d", scheme(addr), c.qp.Num())}, Addr{addr}
	return c, nil
}

// newConn creates a connection's queues and memory on device dev. peer is
// the peer's hello when it is known (Accept), nil when it comes with the
// reply (Dial).
func newConn(dev string, cfg *Config, peer hello) (_ *Conn, err error) {
	d, err := openDevice(dev)
	if err != nil {
		return nil, err
	}
	size, err := cfg.ringSize(d.attr.Transport)
	if err != nil {
		d.release()
		return nil, err
	}
	c := &Conn{dev: d, spin: cfg.spin(), zcMin: cfg.zeroCopyMin(d.attr.Transport), recvs: ctrlRecvs, sqDepth: 2*signalEvery + 8,
		closing: make(chan struct{}), rwake: make(chan struct{}, 1), wwake: make(chan struct{}, 1)}
	c.acceptImm = notifiesByImm(&d.attr) && !cfg.noImm
	// A side whose peer sends control messages as Sends takes a small
	// data message inside its Send: one frame, where an RDMA Write and
	// its Send are two.
	// Such a side also sends them, to a peer that takes them: its send
	// buffer, which the device copies at post time (SendInline), holds a
	// control message and the bytes of an inline data message.
	c.acceptInline = !c.acceptImm
	c.recvSlot, c.sendInline = ctrlLen, ctrlLen
	if c.acceptInline {
		c.recvSlot = inlineSlot
		c.sendInline = max(ctrlLen, min(inlineSlot, d.attr.MaxInlineData))
	}
	c.spinGrowth = spinGrowth
	if d.attr.Transport == "iwarp" {
		// A poll reads the socket: a long spin is a stream of system
		// calls, which takes the processor from the application's own
		// goroutines (gRPC's calls over tcp0 slow by a third at 10×).
		// Some growth still catches a peer that was itself parked, so
		// that a ping-pong does not settle into both sides parking.
		c.spinGrowth = iwarpSpinGrowth
		c.segment = iwarpSegment
		// Its wake-ups come through the network poller, which a
		// spinning wait holds off: spinning waits poll for it (park.go).
		c.helpable = true
	}
	c.rdl.init()
	c.wdl.init()
	c.rctx.dl, c.wctx.dl = &c.rdl, &c.wdl
	defer func() {
		if err != nil {
			c.destroy()
		}
	}()
	if c.pd, err = d.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if c.cq, err = d.ctx.CreateCQ(c.recvs + c.sqDepth + 1); err != nil {
		return nil, err
	}
	sendWR := c.sqDepth
	if cfg.qpSendWR > 0 {
		sendWR = cfg.qpSendWR
	}
	if c.qp, err = c.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq, Cap: verbs.QPCap{
		MaxSendWR: uint32(sendWR), MaxRecvWR: uint32(c.recvs), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(c.sendInline)}}); err != nil {
		return nil, err
	}
	if err = c.qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteWrite},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		return nil, err
	}
	if c.ring, err = c.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	c.ringBuf = c.ring.Bytes()
	// Local-only memory is the process's own: on shm0 it needs no
	// shared segment (and no file descriptor).
	if c.ctl, err = c.pd.RegMR(make([]byte, c.recvs*c.recvSlot+c.sendInline), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	c.sendBuf = c.ctl.Bytes()[c.recvs*c.recvSlot:]
	c.mu.Lock()
	for i := range c.recvs {
		c.postRecv(uint64(i))
	}
	err = c.err
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if peer != nil {
		if err = c.setPeer(peer); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// setPeer takes the peer's ring and notification mode from its hello and
// allocates the staging memory to match.
func (c *Conn) setPeer(h hello) (err error) {
	c.peerAddr, c.peerKey, c.peerSize = h.ringAddr(), h.ringKey(), uint64(h.ringSize())
	c.peerRecvs = int(h.recvs())
	c.credits = c.peerRecvs
	c.useImm = h.flags()&flagAcceptsImm != 0 && notifiesByImm(&c.dev.attr)
	c.maxList = listMax
	if !c.useImm {
		c.maxList = min(listMax, len(c.sendBuf)/ctrlLen)
	}
	if !c.useImm && h.flags()&flagAcceptsInline != 0 {
		c.inlineMax = c.sendInline - ctrlLen
	}
	if c.stageMR, err = c.pd.RegMR(make([]byte, c.peerSize), verbs.AccessLocalWrite); err != nil {
		return err
	}
	c.stage = c.stageMR.Bytes()
	return nil
}

// notifiesByImm reports whether a device's connections carry control
// messages as immediate data. Not on iWARP (tcp0): there an RDMA Write
// with immediate is two frames, the Write and the immediate data, like a
// Write and a Send, and a control message without data is two frames
// where a Send is one; rsocket uses Sends there too.
func notifiesByImm(attr *verbs.DeviceAttr) bool {
	return attr.Has(verbs.CapImmData) && attr.Transport != "iwarp"
}

func (c *Conn) hello(b []byte) hello {
	var flags uint8
	if c.acceptImm {
		flags |= flagAcceptsImm
	}
	if c.acceptInline {
		flags |= flagAcceptsInline
	}
	return putHello(b, c.ring.Addr(), c.ring.RKey(), uint32(c.ring.Len()), uint32(c.recvs), flags)
}

// connect runs the connection setup (Dial or Accept) with this side's
// hello and, for a dialler, takes the peer's from the reply. On failure
// it releases the connection's resources.
func (c *Conn) connect(setup func(*cm.Param) (*cm.Conn, error)) error {
	var buf [helloLen]byte
	cmc, err := setup(&cm.Param{PrivateData: c.hello(buf[:])})
	if err != nil {
		c.destroy()
		return err
	}
	c.cmc = cmc
	if c.stageMR == nil {
		h, err := parseHello(cmc.PrivateData())
		if err == nil {
			err = c.setPeer(h)
		}
		if err != nil {
			c.cmc.Close()
			c.destroy()
			return err
		}
	}
	return nil
}

// destroy releases what newConn and setPeer created.
func (c *Conn) destroy() {
	if c.qp != nil {
		c.qp.Destroy()
	}
	if c.cq != nil {
		c.cq.Destroy()
	}
	c.dropZeroCopy()
	for _, m := range []*verbs.MR{c.ring, c.ctl, c.stageMR} {
		if m != nil {
			m.Dereg()
		}
	}
	if c.pd != nil {
		c.pd.Dealloc()
	}
	c.rdl.stop()
	c.wdl.stop()
	c.dev.release()
}
