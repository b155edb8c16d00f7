package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// The demo's sizes. The client registers one buffer: the server's message
// lands at its start, the value read lands at readOffset, and every other
// byte keeps the fill pattern so that a stray write would be seen.
const (
	clientBufLen = 4096
	readOffset   = 64
	maxValueLen  = clientBufLen - 2*readOffset
	fillByte     = 0xEE
	defaultValue = "Hello from the server's memory: these bytes came over with one RDMA Read."
)

// valueMsg is the one message the server sends: where the value lives and
// how to check it. On the wire it is msgLen bytes, big-endian:
//
//	offset 0   magic "GVRD"
//	offset 4   rkey of the value's region
//	offset 8   virtual address of the value
//	offset 16  length of the value in bytes
//	offset 20  CRC-32C (Castagnoli) of the value
type valueMsg struct {
	RKey uint32
	Addr uint64
	Len  uint32
	CRC  uint32
}

const (
	msgLen   = 24
	msgMagic = 0x47565244 // "GVRD"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (m valueMsg) encode(b []byte) {
	binary.BigEndian.PutUint32(b[0:], msgMagic)
	binary.BigEndian.PutUint32(b[4:], m.RKey)
	binary.BigEndian.PutUint64(b[8:], m.Addr)
	binary.BigEndian.PutUint32(b[16:], m.Len)
	binary.BigEndian.PutUint32(b[20:], m.CRC)
}

func decodeValueMsg(b []byte) (valueMsg, error) {
	if len(b) != msgLen {
		return valueMsg{}, fmt.Errorf("message is %d bytes, want %d", len(b), msgLen)
	}
	if m := binary.BigEndian.Uint32(b); m != msgMagic {
		return valueMsg{}, fmt.Errorf("message has magic %#08x, want %#08x: the peer is not a goverbs demo server", m, msgMagic)
	}
	return valueMsg{
		RKey: binary.BigEndian.Uint32(b[4:]),
		Addr: binary.BigEndian.Uint64(b[8:]),
		Len:  binary.BigEndian.Uint32(b[16:]),
		CRC:  binary.BigEndian.Uint32(b[20:]),
	}, nil
}

// demoConfig is what the demo's flags set.
type demoConfig struct {
	device  string
	addr    string
	value   string
	timeout time.Duration
}

func runDemo(ctx context.Context, e *env, args []string) error {
	cfg := demoConfig{}
	fs := newFlagSet("demo", "", `Demo walks through one RDMA Read as section 4.4 of the seed document
describes it: a server and a client each open the device and register
memory (the server a value region peers may read, the client a local
buffer), connect a queue pair through cm, exchange the value's address,
rkey and length in one Send/Recv message, and then the client reads the
value with one RDMA Read and polls its completion queue for the result.
The server's CPU takes no part in the read.

Both sides run in this process, as two goroutines. Each step is printed
with the time it took.`, e)
	fs.String(&cfg.device, "device", "d", defaultDevice, "the RDMA device both sides open (with --addr, the one that serves it)")
	fs.String(&cfg.addr, "addr", "", "", "the cm address the server listens on: shm://@name, shm:///path.sock or\ntcp://host:port (default: one that suits the device's provider, e.g.\nshm://@goverbs-demo-PID)")
	fs.String(&cfg.value, "value", "", defaultValue, "the value the server serves and the client reads")
	fs.Duration(&cfg.timeout, "timeout", "", 10*time.Second, "give up if the demo takes longer than this")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if n := len(cfg.value); n == 0 || n > maxValueLen {
		return usageError("--value is %d bytes; give 1 to %d", n, maxValueLen)
	}
	if cfg.timeout <= 0 {
		return usageError("--timeout must be positive, got %v", cfg.timeout)
	}
	if dev, err := cm.Device(cfg.addr); err == nil {
		// The address names the provider; the device is the one that
		// serves it unless -d says otherwise, and then they must agree.
		// (An address no provider serves fails when the server listens.)
		switch {
		case !fs.isSet("device"):
			cfg.device = dev
		case dev != cfg.device:
			return usageError("--addr %s is served by device %s, not -d %s: leave out -d, or give an address of %s", cfg.addr, dev, cfg.device, cfg.device)
		}
	}
	info, err := findDevice(cfg.device)
	if err != nil {
		return err
	}
	if cfg.addr == "" {
		if cfg.addr, err = defaultAddr(info.Transport, "goverbs-demo"); err != nil {
			return err
		}
	}
	return demo(ctx, e.stdout, cfg)
}

// defaultAddr returns a listen address called name (made unique to this
// process where the address space is the host's) for a device of the
// transport.
func defaultAddr(transport, name string) (string, error) {
	switch transport {
	case "loop":
		return "loop://" + name, nil
	case "shm":
		return fmt.Sprintf("shm://@%s-%d", name, os.Getpid()), nil
	case "iwarp":
		return "tcp://127.0.0.1:0", nil
	}
	return "", fmt.Errorf("no default cm address for transport %q: give one with --addr", transport)
}

// demo runs the server and the client and reports the first failure.
func demo(ctx context.Context, w io.Writer, cfg demoConfig) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	log := &demoLog{w: w}
	log.printf("goverbs demo: one RDMA Read, step by step (seed document, section 4.4)\n")
	log.printf("device %s, server address %s, value of %d bytes\n\n", cfg.device, cfg.addr, len(cfg.value))

	start := time.Now()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		if err == nil {
			return
		}
		errOnce.Do(func() {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w (gave up after --timeout %v)", err, cfg.timeout)
			}
			firstErr = err
		})
		cancel() // the other side stops waiting
	}
	listening := make(chan string, 1)
	srv := &side{name: "server", log: log}
	cli := &side{name: "client", log: log}
	wg.Add(2)
	go func() {
		defer wg.Done()
		fail(srv.serve(ctx, cfg, listening))
	}()
	var readTime time.Duration
	go func() {
		defer wg.Done()
		var err error
		readTime, err = cli.read(ctx, cfg, listening)
		fail(err)
	}()
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	log.printf("\nok: the client read %d bytes of the server's memory with one RDMA Read, %s from post to completion; whole demo %s\n",
		len(cfg.value), fmtDur(readTime), fmtDur(time.Since(start)))
	return nil
}

// demoLog serialises the two sides' output, one whole line at a time.
type demoLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *demoLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}

// side is one end of the demo: it numbers and times its steps, and keeps
// what it created so that it can tear it down in order.
type side struct {
	name string
	log  *demoLog
	n    int
	undo []func() error // in creation order
}

// step runs f as the side's next step and prints what it did and how long
// it took, or returns its error with the step's name.
func (s *side) step(what string, f func() (string, error)) error {
	s.n++
	start := time.Now()
	detail, err := f()
	d := time.Since(start)
	if err != nil {
		return fmt.Errorf("%s, step %d (%s): %w", s.name, s.n, what, err)
	}
	if detail != "" {
		what += ": " + detail
	}
	s.log.printf("%-6s %2d. %s ... %s\n", s.name, s.n, what, fmtDur(d))
	return nil
}

// created records how to destroy an object the side made.
func (s *side) created(destroy func() error) { s.undo = append(s.undo, destroy) }

// teardown destroys what the side created, newest first, and returns the
// first error.
func (s *side) teardown() error {
	var first error
	for i := len(s.undo) - 1; i >= 0; i-- {
		if err := s.undo[i](); err != nil && first == nil {
			first = err
		}
	}
	s.undo = nil
	return first
}

// open does the steps both sides share: open the device, allocate a PD.
func (s *side) open(cfg demoConfig) (*verbs.Context, *verbs.PD, error) {
	var dev *verbs.Context
	var pd *verbs.PD
	err := s.step("open device "+cfg.device, func() (string, error) {
		var err error
		if dev, err = verbs.Open(cfg.device); err != nil {
			return "", err
		}
		s.created(dev.Close)
		return fmt.Sprintf("provider %s, transport %s", dev.Device().Provider, dev.QueryDevice().Transport), nil
	})
	if err != nil {
		return nil, nil, err
	}
	err = s.step("allocate a protection domain", func() (string, error) {
		var err error
		if pd, err = dev.AllocPD(); err != nil {
			return "", err
		}
		s.created(pd.Dealloc)
		return "", nil
	})
	return dev, pd, err
}

// queues creates the side's CQ and its QP.
func (s *side) queues(dev *verbs.Context, pd *verbs.PD) (*verbs.CQ, *verbs.QP, error) {
	var cq *verbs.CQ
	var qp *verbs.QP
	err := s.step("create a completion queue and a queue pair", func() (string, error) {
		var err error
		if cq, err = dev.CreateCQ(16); err != nil {
			return "", err
		}
		s.created(cq.Destroy)
		// An endpoint's QP is in Init: it takes receives before it is
		// connected, which every provider needs (tcp0 has no RNR retry).
		ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return "", err
		}
		qp = ep.QP()
		s.created(ep.Destroy)
		return fmt.Sprintf("CQ of 16 entries, RC QP %d in state %v, ready for receives", qp.Num(), qp.State()), nil
	})
	return cq, qp, err
}

// connected describes a freshly connected QP.
func connected(qp *verbs.QP) string {
	a, err := qp.Query()
	if err != nil {
		return fmt.Sprintf("QP %d connected (query failed: %v)", qp.Num(), err)
	}
	return fmt.Sprintf("QP %d connected to peer QP %d, state %v", qp.Num(), a.DestQPNum, a.State)
}

// waitOne waits, sleeping, for one completion on cq and checks that it is
// a successful one of opcode op.
func waitOne(ctx context.Context, cq *verbs.CQ, op verbs.WCOpcode) (verbs.WorkCompletion, error) {
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		return verbs.WorkCompletion{}, fmt.Errorf("waiting for the %v completion: %w", op, err)
	}
	return wc[0], checkWC(wc[0], op)
}

func checkWC(wc verbs.WorkCompletion, op verbs.WCOpcode) error {
	if wc.Status != verbs.WCSuccess {
		return fmt.Errorf("the %v work request completed with status %q (vendor error %#x)", op, wc.Status, wc.VendorErr)
	}
	if wc.Opcode != op {
		return fmt.Errorf("got a %v completion, want %v", wc.Opcode, op)
	}
	return nil
}

// serve is the server: it registers the value, accepts one connection,
// tells the client where the value is, and waits for the client to hang
// up. It posts nothing for the read itself.
func (s *side) serve(ctx context.Context, cfg demoConfig, listening chan<- string) (err error) {
	defer func() {
		if err != nil {
			s.teardown()
		}
	}()
	dev, pd, err := s.open(cfg)
	if err != nil {
		return err
	}
	var value, msg *verbs.MR
	err = s.step("register memory: the value region", func() (string, error) {
		var err error
		if value, err = pd.AllocMR(len(cfg.value), verbs.AccessRemoteRead); err != nil {
			return "", err
		}
		s.created(value.Dereg)
		copy(value.Bytes(), cfg.value)
		return fmt.Sprintf("%d bytes at %#x, lkey %#x, rkey %#x, access %v",
			value.Len(), value.Addr(), value.LKey(), value.RKey(), value.Access()), nil
	})
	if err != nil {
		return err
	}
	err = s.step("register memory: the message buffer", func() (string, error) {
		var err error
		// Local read access is implied; a Send only reads its buffer.
		if msg, err = pd.RegMR(make([]byte, msgLen), 0); err != nil {
			return "", err
		}
		s.created(msg.Dereg)
		return fmt.Sprintf("%d bytes at %#x, lkey %#x, local access only", msg.Len(), msg.Addr(), msg.LKey()), nil
	})
	if err != nil {
		return err
	}
	cq, qp, err := s.queues(dev, pd)
	if err != nil {
		return err
	}
	var l *cm.Listener
	err = s.step("listen on "+cfg.addr, func() (string, error) {
		var err error
		if l, err = cm.Listen(cfg.addr); err != nil {
			return "", err
		}
		listening <- l.Addr()
		return "listening at " + l.Addr(), nil
	})
	if err != nil {
		return err
	}
	defer l.Close()
	var conn *cm.Conn
	err = s.step("accept the client's connection", func() (string, error) {
		req, err := l.Accept(ctx)
		if err != nil {
			return "", err
		}
		if conn, err = req.Accept(qp, nil); err != nil {
			return "", err
		}
		s.created(func() error { return closeConn(conn) })
		return connected(qp), nil
	})
	if err != nil {
		return err
	}
	err = s.step("send the value's address, rkey and length (Send/Recv)", func() (string, error) {
		m := valueMsg{RKey: value.RKey(), Addr: value.Addr(), Len: uint32(value.Len()),
			CRC: crc32.Checksum(value.Bytes(), castagnoli)}
		m.encode(msg.Bytes())
		wr := []verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{msg.SGE(0, msgLen)}}}
		if _, err := qp.PostSend(wr); err != nil {
			return "", err
		}
		if _, err := waitOne(ctx, cq, verbs.WCSend); err != nil {
			return "", err
		}
		return fmt.Sprintf("%d-byte message, addr %#x, rkey %#x, length %d, CRC-32C %08x; send completed",
			msgLen, m.Addr, m.RKey, m.Len, m.CRC), nil
	})
	if err != nil {
		return err
	}
	err = s.step("wait while the client reads, until it disconnects", func() (string, error) {
		select {
		case <-conn.Done():
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if n := cq.Poll(make([]verbs.WorkCompletion, 4)); n != 0 {
			return "", fmt.Errorf("%d unexpected completions on the server's CQ", n)
		}
		return "no work request posted and no completion here: the read was one-sided", nil
	})
	if err != nil {
		return err
	}
	return s.step("tear down: connection, QP, CQ, regions, PD, device", s.teardownStep)
}

func (s *side) teardownStep() (string, error) { return "", s.teardown() }

// closeConn disconnects; a connection the peer has already closed needs
// no more.
func closeConn(c *cm.Conn) error {
	select {
	case <-c.Done():
		c.Close()
		return nil
	default:
		return c.Close()
	}
}

// read is the client: it connects, learns where the value is, reads it
// with one RDMA Read and checks it. It returns the time from posting the
// read to its completion.
func (s *side) read(ctx context.Context, cfg demoConfig, listening <-chan string) (readTime time.Duration, err error) {
	defer func() {
		if err != nil {
			s.teardown()
		}
	}()
	dev, pd, err := s.open(cfg)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, clientBufLen)
	var mr *verbs.MR
	err = s.step("register memory: a local buffer", func() (string, error) {
		var err error
		if mr, err = pd.RegMR(buf, verbs.AccessLocalWrite); err != nil {
			return "", err
		}
		s.created(mr.Dereg)
		for i := range buf {
			buf[i] = fillByte
		}
		return fmt.Sprintf("%d bytes at %#x, lkey %#x, access %v", mr.Len(), mr.Addr(), mr.LKey(), mr.Access()), nil
	})
	if err != nil {
		return 0, err
	}
	cq, qp, err := s.queues(dev, pd)
	if err != nil {
		return 0, err
	}
	err = s.step("post a receive for the server's message", func() (string, error) {
		wr := []verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, readOffset)}}}
		if _, err := qp.PostRecv(wr); err != nil {
			return "", err
		}
		return fmt.Sprintf("%d bytes at %#x", readOffset, mr.Addr()), nil
	})
	if err != nil {
		return 0, err
	}
	var conn *cm.Conn
	err = s.step("connect to the server", func() (string, error) {
		var addr string
		select {
		case addr = <-listening:
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for the server to listen: %w", ctx.Err())
		}
		var err error
		// The receive posted before is there for the server's first
		// Send, which may come the moment the connection is made.
		if conn, err = cm.Dial(ctx, addr, qp, nil); err != nil {
			return "", err
		}
		s.created(func() error { return closeConn(conn) })
		return "dialled " + addr + ", " + connected(qp), nil
	})
	if err != nil {
		return 0, err
	}
	var m valueMsg
	err = s.step("receive the value's address, rkey and length", func() (string, error) {
		wc, err := waitOne(ctx, cq, verbs.WCRecv)
		if err != nil {
			return "", err
		}
		b, err := verbs.Received(&wc, buf[:readOffset]) // the receive posted above
		if err != nil {
			return "", err
		}
		if m, err = decodeValueMsg(b); err != nil {
			return "", err
		}
		if m.Len == 0 || m.Len > clientBufLen-2*readOffset {
			return "", fmt.Errorf("the value is %d bytes; this client reads 1 to %d", m.Len, clientBufLen-2*readOffset)
		}
		return fmt.Sprintf("addr %#x, rkey %#x, length %d (slept on the CQ's completion channel)", m.Addr, m.RKey, m.Len), nil
	})
	if err != nil {
		return 0, err
	}
	var posted time.Time
	err = s.step("post an RDMA Read of the value", func() (string, error) {
		sge := mr.SGE(readOffset, int(m.Len))
		wr := []verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{sge}, RemoteAddr: m.Addr, RKey: m.RKey}}
		posted = time.Now()
		if _, err := qp.PostSend(wr); err != nil {
			return "", err
		}
		return fmt.Sprintf("remote %#x rkey %#x -> local %#x lkey %#x, %d bytes", m.Addr, m.RKey, sge.Addr, sge.LKey, m.Len), nil
	})
	if err != nil {
		return 0, err
	}
	err = s.step("poll the completion queue", func() (string, error) {
		wc := make([]verbs.WorkCompletion, 1)
		polls := 0
		for {
			polls++
			if cq.Poll(wc) > 0 {
				break
			}
			if err := cq.Err(); err != nil {
				return "", err
			}
			if polls%1024 == 0 && ctx.Err() != nil {
				return "", fmt.Errorf("no completion after %d polls: %w", polls, ctx.Err())
			}
		}
		readTime = time.Since(posted)
		if err := checkWC(wc[0], verbs.WCRDMARead); err != nil {
			return "", err
		}
		if wc[0].ByteLen != m.Len {
			return "", fmt.Errorf("the read completed with %d bytes, want %d", wc[0].ByteLen, m.Len)
		}
		return fmt.Sprintf("%v completion, status %s, %d bytes, after %d %s", wc[0].Opcode, wc[0].Status, wc[0].ByteLen, polls, plural(polls, "poll")), nil
	})
	if err != nil {
		return 0, err
	}
	got := buf[readOffset : readOffset+int(m.Len)]
	err = s.step("check the bytes", func() (string, error) {
		if c := crc32.Checksum(got, castagnoli); c != m.CRC {
			return "", fmt.Errorf("the bytes read have CRC-32C %08x, the server announced %08x", c, m.CRC)
		}
		if string(got) != cfg.value {
			return "", fmt.Errorf("read %q, the server serves %q", got, cfg.value)
		}
		for i, b := range buf {
			if i >= msgLen && (i < readOffset || i >= readOffset+len(got)) && b != fillByte {
				return "", fmt.Errorf("byte %d of the local buffer, outside the read's target, changed from %#x to %#x", i, fillByte, b)
			}
		}
		return fmt.Sprintf("CRC-32C %08x matches, the bytes around the target are untouched", m.CRC), nil
	})
	if err != nil {
		return 0, err
	}
	s.log.printf("%-6s     read bytes: %q\n", s.name, got)
	err = s.step("disconnect", func() (string, error) {
		return "", conn.Close()
	})
	if err != nil {
		return 0, err
	}
	return readTime, s.step("tear down: QP, CQ, region, PD, device", s.teardownStep)
}

// fmtDur prints a duration in the unit that suits it: 12µs, 1.25ms, 2.5s.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// plural returns word, with an s unless n is 1.
func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
