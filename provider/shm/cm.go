package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/acceptq"
	"github.com/goverbs/goverbs/internal/listenwait"
	"github.com/goverbs/goverbs/internal/peerguard"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Connection setup over a Unix socket: the dialler sends a request with
// its QP's shared segments (block, receive CQ, key table, SRQ), the
// listener answers with its own, and the dialler confirms it is in RTS
// (ready to use) before the listener moves to RTS — so neither side ever
// sends to a peer that cannot yet receive.

func (*provider) Schemes() []string { return []string{"shm"} }

func (*provider) MaxPrivateData() int { return deviceAttr.MaxPrivateData }

// hello is the handshake message, a []byte view:
//
//	0  magic u32    4 version u16    6 type u8    7 flags u8 (1: SRQ)
//	8  pid u32      12 qpn u32       16 rq entries u32   20 rq SGEs u32
//	24 cq entries u32   28 srq entries u32   32 srq SGEs u32
//	36 responder resources, initiator depth, retry count, RNR retry (u8 each)
//	40 min RNR timer u8, 3 reserved     44 private data length u16
//	46 grant epoch word's index u16     48 private data
//
// Its descriptors travel with it: the memfds of the QP block (header,
// receive ring, receive completion ring), of the receive CQ (its header:
// arming and futex word), of the key table, of the page of grant epoch
// words (epoch.go), then of the SRQ; last, a socket connected to the
// receive CQ's notification socket, made for this peer, which it
// notifies the CQ through (event.go).
// The pid field is informational: the receiver takes the sender's PID from
// the kernel (SO_PEERCRED), which also holds across PID namespaces.
type hello []byte

const (
	helloMagic   = 0x48535647 // "GVSH"
	helloVersion = 5          // 2: receive completions in the QP's block; 3: 128-byte completion slots, small Sends inline; 4: a notifier socket; 5: grant epochs
	helloHeader  = 48
	helloMax     = helloHeader + 256
)

func (h hello) magic() uint32      { return binary.LittleEndian.Uint32(h[0:]) }
func (h hello) version() uint16    { return binary.LittleEndian.Uint16(h[4:]) }
func (h hello) typ() uint8         { return h[6] }
func (h hello) srq() bool          { return h[7]&1 != 0 }
func (h hello) pid() uint32        { return binary.LittleEndian.Uint32(h[8:]) }
func (h hello) qpn() uint32        { return binary.LittleEndian.Uint32(h[12:]) }
func (h hello) rqEntries() uint32  { return binary.LittleEndian.Uint32(h[16:]) }
func (h hello) rqSGEs() uint32     { return binary.LittleEndian.Uint32(h[20:]) }
func (h hello) cqEntries() uint32  { return binary.LittleEndian.Uint32(h[24:]) }
func (h hello) srqEntries() uint32 { return binary.LittleEndian.Uint32(h[28:]) }
func (h hello) srqSGEs() uint32    { return binary.LittleEndian.Uint32(h[32:]) }
func (h hello) privLen() int       { return int(binary.LittleEndian.Uint16(h[44:])) }
func (h hello) epochIndex() int    { return int(binary.LittleEndian.Uint16(h[46:])) }
func (h hello) private() []byte    { return h[helloHeader : helloHeader+h.privLen()] }

func (h hello) param() driver.ConnParam {
	return driver.ConnParam{
		PrivateData:        append([]byte(nil), h.private()...),
		ResponderResources: h[36], InitiatorDepth: h[37], RetryCount: h[38], RNRRetryCount: h[39],
		MinRNRTimer: driver.RNRTimer(h[40] & 31), QPNum: h.qpn(),
	}
}

// valid checks the fixed part and the private data length against the
// message length.
func (h hello) valid() bool {
	return len(h) >= helloHeader && h.magic() == helloMagic && h.version() == helloVersion &&
		h.privLen() <= deviceAttr.MaxPrivateData && len(h) == helloHeader+h.privLen()
}

// makeHello builds a handshake message for q, whose connection's grant
// epoch word is epoch, and returns it with the fds to send (helloFDs,
// then the peer's notifier), which the caller closes once the hello is
// sent.
func makeHello(typ uint8, q *qp, p driver.ConnParam, epoch *epochSlot) (hello, []int, error) {
	h := make(hello, helloHeader+len(p.PrivateData))
	binary.LittleEndian.PutUint32(h[0:], helloMagic)
	binary.LittleEndian.PutUint16(h[4:], helloVersion)
	h[6] = typ
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], q.num)
	binary.LittleEndian.PutUint32(h[16:], uint32(q.rqN))
	binary.LittleEndian.PutUint32(h[20:], q.cap.MaxRecvSGE)
	binary.LittleEndian.PutUint32(h[24:], uint32(q.recvCQ.n))
	h[36], h[37], h[38], h[39], h[40] = p.ResponderResources, p.InitiatorDepth, p.RetryCount, p.RNRRetryCount, uint8(p.MinRNRTimer)
	binary.LittleEndian.PutUint16(h[44:], uint16(len(p.PrivateData)))
	binary.LittleEndian.PutUint16(h[46:], uint16(epoch.idx))
	copy(h[helloHeader:], p.PrivateData)
	if q.srq != nil {
		h[7] |= 1
		binary.LittleEndian.PutUint32(h[28:], uint32(q.srq.n))
		binary.LittleEndian.PutUint32(h[32:], q.srq.maxSGE)
	}
	fds, err := q.helloFDs(epoch)
	if err != nil {
		return nil, nil, err
	}
	peer, err := q.recvCQ.event.peerSocket()
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	return h, append(fds, peer), nil
}

// helloFDs returns duplicates of the descriptors a handshake hands the
// peer: the QP's block, its receive CQ's segment, its grant table
// (read-only), the page of epoch words (read-only) and its SRQ's segment, if
// it has one. The block and the grant table are read under q.mu, as a
// Reset swaps them, so that they belong together; duplicated, none of
// them is closed by a Reset before it is sent. A QP destroyed (under
// q.mu, before any of them is closed) has none to send, nor has a
// connection that ended, freeing its epoch page: ErrClosed. The caller
// closes them.
func (q *qp) helloFDs(epoch *epochSlot) ([]int, error) {
	// Held meanwhile, so that a Destroy or Reset that ends the
	// connection does not free the page (and close its descriptor).
	if !epoch.hold() {
		return nil, driver.ErrClosed
	}
	defer epoch.release()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return nil, driver.ErrClosed
	}
	fds := make([]int, 0, 6)
	var err error
	take := func(d int, e error) {
		if err = e; e == nil {
			fds = append(fds, d)
		}
	}
	dup := func(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }
	for _, fd := range []int{q.block.fd, q.recvCQ.seg.fd, q.grantsRO} {
		if take(dup(fd)); err != nil {
			break
		}
	}
	if err == nil {
		take(epoch.page.seg.readOnlyFD())
	}
	if err == nil && q.srq != nil {
		take(dup(q.srq.seg.fd))
	}
	if err != nil {
		closeFDs(fds)
		return nil, fmt.Errorf("shm: duplicate a descriptor for the handshake: %w", err)
	}
	return fds, nil
}

// readHello reads a handshake message (or a rejection) and its fds,
// until deadline (the zero time: none); recheck, if not nil, runs once
// the deadline is set, before the read.
func readHello(sock *net.UnixConn, deadline time.Time, recheck func()) (hello, []int, error) {
	sock.SetReadDeadline(deadline)
	defer sock.SetReadDeadline(time.Time{})
	if recheck != nil {
		recheck()
	}
	buf := make([]byte, helloMax+1)
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, flags, _, err := sock.ReadMsgUnix(buf, oob)
	if errors.Is(err, unix.ECONNRESET) {
		// A peer that closed with our message unread (a listener that
		// rejects at once) is reported once, ahead of what it sent
		// before closing: read that.
		n, oobn, flags, _, err = sock.ReadMsgUnix(buf, oob)
	}
	fds := parseFDs(oob[:oobn])
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	if flags&unix.MSG_CTRUNC != 0 {
		// The kernel drops the descriptors it cannot install.
		closeFDs(fds)
		return nil, nil, fmt.Errorf("%w: descriptors of the handshake were dropped: this process may be at its limit of open files (ulimit -n)", errHandshake)
	}
	h := hello(buf[:n])
	if !h.valid() {
		closeFDs(fds)
		return nil, nil, errHandshake
	}
	return h, fds, nil
}

// attach maps the peer's segments named by h and fds and makes the
// connection object for q. The fds are consumed.
func attach(q *qp, sock *net.UnixConn, h hello, fds []int) (*conn, error) {
	want := 5
	if h.srq() {
		want = 6
	}
	if len(fds) != want {
		closeFDs(fds)
		return nil, fmt.Errorf("%w: %d descriptors, expected %d", errHandshake, len(fds), want)
	}
	// The last is the notifier of the peer's receive CQ: checked, and
	// held by the connection, once there is one.
	event := fds[want-1]
	fds = fds[:want-1]
	if err := checkPeerNotifier(event); err != nil {
		closeFDs(fds)
		unix.Close(event)
		return nil, fmt.Errorf("%w: %v", errHandshake, err)
	}
	// The PID process_vm_readv/writev aim at is the kernel's word for who
	// is at the other end of the socket (SO_PEERCRED), never the one the
	// hello claims: a peer that named another process — this one, say —
	// would have this process write wherever its key table pointed.
	pid, err := peerPID(sock)
	if err != nil {
		closeFDs(fds)
		unix.Close(event)
		return nil, fmt.Errorf("%w: the peer's credentials: %v", errHandshake, err)
	}
	c := &conn{q: q, sock: sock, pid: pid, remote: h.param(),
		segs: map[uint32]*segment{}, segRW: map[uint32]bool{},
		segNote: make(chan struct{}, 1), keyAck: make(chan [2]uint32, 1), invAck: make(chan [2]uint32, 1), events: make(chan ctrl, 16), done: make(chan struct{}), gone: make(chan struct{}), revokeAck: make(chan uint32, 1), hot: new(connHot)}
	c.hot.hold.Store(holdUnsettled)
	fail := func(err error) (*conn, error) {
		for _, s := range []*segment{c.peerBlock, c.cqSeg, c.keySeg, c.epochSeg, c.srqSeg} {
			if s != nil {
				s.close()
			}
		}
		unix.Close(event)
		return nil, fmt.Errorf("%w: %v", errHandshake, err)
	}
	rqN, rqSGE := int(h.rqEntries()), int(h.rqSGEs())
	if rqN <= 0 || rqN > deviceAttr.MaxQPWR*2 || rqSGE > maxSGE {
		closeFDs(fds)
		return fail(errors.New("receive queue size out of range"))
	}
	cqN, srqN := int(h.cqEntries()), 0
	if h.srq() {
		srqN = int(h.srqEntries())
	}
	if cqN <= 0 || cqN > deviceAttr.MaxCQE*2 || srqN < 0 || srqN > deviceAttr.MaxSRQWR*2 {
		closeFDs(fds)
		return fail(errors.New("CQ or SRQ size out of range"))
	}
	pad := blockPad(c.remote.QPNum)
	if c.peerBlock, err = mapPeerSegment(fds[0], pad+blockSize(rqN, rqSGE, cqN), true); err != nil {
		closeFDs(fds[1:])
		return fail(err)
	}
	// A size that is not a power of two gives no ring (nil), which must
	// not be dereferenced: a peer chooses these numbers.
	rq := viewRecvRing(c.peerBlock.mem[pad:], rqN, rqSGE)
	if rq == nil {
		closeFDs(fds[1:])
		return fail(errors.New("receive queue size is not a power of two"))
	}
	c.peerHdr, c.peerRecv = rq.h, rq
	c.peerGen = rq.h.gen.Load()
	if c.peerCQ = viewCQRing(c.peerBlock.mem[pad+recvCQOffset(rqN, rqSGE):], cqN); c.peerCQ == nil {
		closeFDs(fds[1:])
		return fail(errors.New("CQ or SRQ size is not a power of two"))
	}
	if c.cqSeg, err = mapPeerSegment(fds[1], cqSegSize, true); err != nil {
		closeFDs(fds[2:])
		return fail(err)
	}
	c.peerNotify = notifyRing(c.cqSeg.mem)
	c.peerNotify.notifier = notifier{fd: event}
	c.peerBells, c.peerBell = viewDoorbells(c.cqSeg.mem), bellOf(c.remote.QPNum)
	if c.keySeg, err = mapPeerSegment(fds[2], maxKeys*keySlotSize, false); err != nil {
		closeFDs(fds[3:])
		return fail(err)
	}
	c.keys = viewKeyTable(c.keySeg.mem, maxKeys, grantRotation(c.remote.QPNum))
	idx := h.epochIndex()
	if idx >= epochWords {
		closeFDs(fds[3:])
		return fail(errors.New("grant epoch word out of its page"))
	}
	if c.epochSeg, err = mapPeerSegment(fds[3], epochPageSize, false); err != nil {
		closeFDs(fds[4:])
		return fail(err)
	}
	c.hot.epoch = epochWord(c.epochSeg.mem, idx)
	if h.srq() {
		srqN, srqSGE := int(h.srqEntries()), int(h.srqSGEs())
		if srqN <= 0 || srqN > deviceAttr.MaxSRQWR*2 || srqSGE > maxSGE {
			closeFDs(fds[4:])
			return fail(errors.New("SRQ size out of range"))
		}
		if c.srqSeg, err = mapPeerSegment(fds[4], ringSize(srqN, recvEntrySize(srqSGE)), true); err != nil {
			return fail(err)
		}
		if c.peerRecv = viewRecvRing(c.srqSeg.mem, srqN, srqSGE); c.peerRecv == nil {
			return fail(errors.New("SRQ size is not a power of two"))
		}
		c.peerSRQ = true
	}
	if c.peerRecv == nil {
		return fail(errors.New("receive queue size is not a power of two"))
	}
	return c, nil
}

// peerPID returns the PID of the process at the other end of sock, as
// the kernel recorded it when the connection was made (SO_PEERCRED).
func peerPID(sock *net.UnixConn) (int, error) {
	cred, err := peerCred(sock)
	if err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}

// peerCred returns the credentials of the process at the other end of
// sock, as the kernel recorded them when the connection was made
// (SO_PEERCRED).
func peerCred(sock *net.UnixConn) (*unix.Ucred, error) {
	raw, err := sock.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, cerr
	}
	return cred, nil
}

// sockAddr turns the address after shm:// into a Unix socket address:
// "/path" or "@abstract".
func sockAddr(addr string) (*net.UnixAddr, error) {
	if addr == "" || (!strings.HasPrefix(addr, "/") && !strings.HasPrefix(addr, "@")) {
		return nil, fmt.Errorf("%w: shm address %q: use shm:///path/to.sock or shm://@name", driver.ErrInvalidArg, addr)
	}
	return &net.UnixAddr{Name: addr, Net: "unixpacket"}, nil
}

// listener accepts connections and reads their requests concurrently
// (acceptq).
type listener struct {
	l    *net.UnixListener
	addr string
	q    *acceptq.Queue[*net.UnixConn, *request]
}

func (p *provider) Listen(addr string) (driver.Listener, error) {
	return p.ListenConfig(addr, driver.ListenConfig{})
}

// ListenConfig implements driver.ConfigListener. The listener accepts
// only processes of its own user, or of a user in cfg.TrustUIDs or with a
// primary group in cfg.TrustGIDs, as the kernel reports them
// (SO_PEERCRED); others are rejected as soon as they are accepted, before
// their request is read and without taking a handshake slot. A
// user whose connections asked for keys they were not granted
// cfg.Strikes times is refused for a back-off period (cfg.Backoff,
// doubling up to cfg.MaxBackoff; see peerguard for the defaults).
func (*provider) ListenConfig(addr string, cfg driver.ListenConfig) (driver.Listener, error) {
	ua, err := sockAddr(addr)
	if err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unixpacket", ua)
	if err != nil && strings.HasPrefix(addr, "/") && errors.Is(err, unix.EADDRINUSE) {
		// A socket file a dead listener left behind: take it over if
		// nobody answers on it.
		if c, derr := net.DialUnix("unixpacket", nil, ua); derr == nil {
			c.Close()
		} else {
			os.Remove(addr)
			l, err = net.ListenUnix("unixpacket", ua)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	tr := trust{uid: uint32(os.Getuid()), uids: slices.Clone(cfg.TrustUIDs), gids: slices.Clone(cfg.TrustGIDs)}
	g := peerguard.New(peerguard.Config{Strikes: cfg.Strikes, Base: cfg.Backoff, Max: cfg.MaxBackoff})
	// screen turns away, as soon as they are accepted and before they
	// take a handshake slot or anything of their request is read, the
	// processes of users not trusted or in back-off.
	screen := func(sock *net.UnixConn) bool {
		cred, err := peerCred(sock)
		if err != nil {
			return false
		}
		if _, refused := g.Refused(uidPeerID(cred)); refused || !tr.trusts(cred) {
			sock.Write(rejectHello(nil)) // a fresh socket's buffer is empty: this does not block
			return false
		}
		return true
	}
	shake := func(sock *net.UnixConn) (*request, bool) {
		cred, err := peerCred(sock)
		if err != nil {
			return nil, false
		}
		r, ok := readRequest(sock)
		if !ok {
			return nil, false
		}
		r.guard, r.peerID = g, uidPeerID(cred)
		return r, true
	}
	q := acceptq.New(l.AcceptUnix, l.Close, shake, (*request).discard).Screen(screen).PerPeer(unixPeer)
	return &listener{l: l, addr: addr, q: q}, nil
}

// uidPeerID names a requester's user to the listener's peerguard.
func uidPeerID(cred *unix.Ucred) string { return strconv.FormatUint(uint64(cred.Uid), 10) }

// trust says whose processes a listener accepts: its own user's, and
// those of the users and primary groups named.
type trust struct {
	uid        uint32
	uids, gids []uint32
}

func (t trust) trusts(c *unix.Ucred) bool {
	return c.Uid == t.uid || slices.Contains(t.uids, c.Uid) || slices.Contains(t.gids, c.Gid)
}

func (l *listener) Addr() string { return l.addr }
func (l *listener) Close() error { return l.q.Close() }

func (l *listener) Accept(ctx context.Context) (driver.ConnRequest, error) {
	return soft.Accepted(l.q.Accept(ctx))
}

// unixPeer names the process at the other end of sock, as the kernel
// recorded it when the connection was made (SO_PEERCRED); "" if it
// cannot be told.
func unixPeer(sock *net.UnixConn) string {
	cred, err := peerCred(sock)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("shm uid %d pid %d", cred.Uid, cred.Pid)
}

// readRequest reads the request a connection opens with; false for one
// that is not a goverbs peer, a broken one, or one silent for
// listenwait.Timeout().
func readRequest(sock *net.UnixConn) (*request, bool) {
	h, fds, err := readHello(sock, time.Now().Add(listenwait.Timeout()), nil)
	if err != nil || h.typ() != msgReq {
		closeFDs(fds)
		return nil, false
	}
	return &request{sock: sock, hello: h, fds: fds}, true
}

// discard disposes of a request nobody took.
func (r *request) discard() {
	closeFDs(r.fds)
	r.sock.Close()
}

type request struct {
	sock     *net.UnixConn
	hello    hello
	fds      []int
	answered soft.Answer
	guard    *peerguard.Guard // the listener's
	peerID   string           // the requester's user id
}

func (r *request) Param() driver.ConnParam { return r.hello.param() }

// Peer names the requester's process (driver.PeerNamer).
func (r *request) Peer() string { return unixPeer(r.sock) }

func (r *request) Reject(privateData []byte) error {
	return r.answered.Reject(func() error {
		closeFDs(r.fds)
		_, err := r.sock.Write(rejectHello(privateData))
		r.sock.Close()
		return err
	})
}

// rejectHello is the message that rejects a request.
func rejectHello(privateData []byte) hello {
	h := make(hello, helloHeader+len(privateData))
	binary.LittleEndian.PutUint32(h[0:], helloMagic)
	binary.LittleEndian.PutUint16(h[4:], helloVersion)
	h[6] = msgRej
	binary.LittleEndian.PutUint16(h[44:], uint16(len(privateData)))
	copy(h[helloHeader:], privateData)
	return h
}

func (r *request) Accept(dq driver.QP, p driver.ConnParam) (driver.Conn, error) {
	return soft.Accept(&r.answered, dq, func(q *qp) (driver.Conn, error) { return r.accept(q, p) })
}

func (r *request) accept(q *qp, p driver.ConnParam) (driver.Conn, error) {
	c, err := attach(q, r.sock, r.hello, r.fds)
	if err != nil {
		r.sock.Close()
		return nil, err
	}
	c.guard, c.peerID = r.guard, r.peerID
	p.QPNum = q.num
	remote := r.hello.param()
	if c.epochOwn, err = q.ctx.epochs.alloc(c.pid); err != nil {
		r.sock.Close()
		c.close()
		return nil, err
	}
	fail := func(err error) (driver.Conn, error) {
		c.q.mu.Lock()
		if q.pending == c {
			q.pending = nil
		}
		if q.conn == c {
			q.setConn(nil)
			q.toErr()
		}
		c.q.mu.Unlock()
		r.sock.Close()
		c.close()
		return nil, err
	}
	if err := q.setPending(c); err != nil {
		return fail(err)
	}
	if err := soft.ConnectRTR(q, p, remote); err != nil {
		return fail(err)
	}
	h, fds, err := makeHello(msgRep, q, p, c.epochOwn)
	if err != nil {
		return fail(err)
	}
	_, _, err = r.sock.WriteMsgUnix(h, unix.UnixRights(fds...), nil)
	closeFDs(fds)
	if err != nil {
		return fail(err)
	}
	// A dialler that never confirms holds the accepting goroutine no
	// longer than a silent connection holds the listener.
	rtu, extra, err := readHello(r.sock, time.Now().Add(listenwait.Timeout()), nil)
	closeFDs(extra)
	if err != nil || rtu.typ() != msgRTU {
		return fail(fmt.Errorf("%w: the dialler did not confirm", driver.ErrDisconnected))
	}
	if err := soft.FinishAccept(q, p, remote); err != nil {
		return fail(err)
	}
	c.start()
	return c, nil
}

// setPending readies q to be connected by c.
func (q *qp) setPending(c *conn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return driver.ErrClosed
	}
	if q.attr.State != driver.QPSReset && q.attr.State != driver.QPSInit {
		return fmt.Errorf("%w: connecting needs a QP in Reset or Init, this one is %v", driver.ErrInvalidState, q.attr.State)
	}
	q.pending = c
	q.grantTo(c)
	return nil
}

func (*provider) Dial(ctx context.Context, addr string, dq driver.QP, p driver.ConnParam) (driver.Conn, error) {
	q, err := soft.Own[*qp](dq)
	if err != nil {
		return nil, err
	}
	ua, err := sockAddr(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", ua.String())
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%w: nothing listens at shm://%s", driver.ErrRefused, addr)
		}
		return nil, err
	}
	sock := nc.(*net.UnixConn)
	// The end of ctx interrupts the handshake's reads and writes; once
	// it is over (done), it no longer touches the socket, which the
	// connection's reader then uses. readHello's own deadline could undo
	// a cancellation that came just before it, so it is checked again
	// after each (cancelled).
	var cancelMu sync.Mutex
	done := false
	cancelled := func() {
		cancelMu.Lock()
		if !done {
			sock.SetDeadline(time.Now())
		}
		cancelMu.Unlock()
	}
	stop := context.AfterFunc(ctx, cancelled)
	defer stop()
	p.QPNum = q.num
	pid, err := peerPID(sock)
	if err != nil {
		sock.Close()
		return nil, fmt.Errorf("%w: the listener's credentials: %v", errHandshake, err)
	}
	epoch, err := q.ctx.epochs.alloc(pid)
	if err != nil {
		sock.Close()
		return nil, err
	}
	handed := false // epoch: the connection's once attach made it
	defer func() {
		if !handed {
			epoch.release()
		}
	}()
	h, fds, err := makeHello(msgReq, q, p, epoch)
	if err != nil {
		sock.Close()
		return nil, err
	}
	_, _, err = sock.WriteMsgUnix(h, unix.UnixRights(fds...), nil)
	closeFDs(fds)
	if err != nil {
		// A listener that turns this user away answers and closes at
		// once, perhaps before the request is sent: report its answer,
		// already queued (the listener has closed its end, so the read
		// does not wait; the deadline only bounds it).
		rep, rfds, rerr := readHello(sock, time.Now().Add(listenwait.Default), nil)
		closeFDs(rfds)
		sock.Close()
		if rerr == nil && rep.typ() == msgRej {
			return nil, &driver.RejectError{PrivateData: append([]byte(nil), rep.private()...)}
		}
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	rep, rfds, err := readHello(sock, deadline, func() {
		if ctx.Err() != nil {
			cancelled()
		}
	})
	if err != nil {
		sock.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if rep.typ() == msgRej {
		closeFDs(rfds)
		sock.Close()
		return nil, &driver.RejectError{PrivateData: append([]byte(nil), rep.private()...)}
	}
	if rep.typ() != msgRep {
		closeFDs(rfds)
		sock.Close()
		return nil, errHandshake
	}
	c, err := attach(q, sock, rep, rfds)
	if err != nil {
		sock.Close()
		return nil, err
	}
	c.epochOwn, handed = epoch, true
	fail := func(err error) (driver.Conn, error) {
		q.mu.Lock()
		if q.pending == c {
			q.pending = nil
		}
		if q.conn == c {
			q.setConn(nil)
			q.toErr()
		}
		q.mu.Unlock()
		c.close()
		return nil, err
	}
	if err := q.setPending(c); err != nil {
		return fail(err)
	}
	if err := soft.ConnectRC(q, p, rep.param()); err != nil {
		return fail(err)
	}
	rtu := make(hello, helloHeader)
	binary.LittleEndian.PutUint32(rtu[0:], helloMagic)
	binary.LittleEndian.PutUint16(rtu[4:], helloVersion)
	rtu[6] = msgRTU
	if _, err := sock.Write(rtu); err != nil {
		return fail(err)
	}
	cancelMu.Lock()
	done = true
	cancelMu.Unlock()
	sock.SetDeadline(time.Time{}) // a cancellation that came meanwhile is past
	c.start()
	return c, nil
}
