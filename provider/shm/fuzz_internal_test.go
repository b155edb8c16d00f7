package shm

import (
	"encoding/binary"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A hostile peer on the control socket: malformed handshakes (any bytes,
// any number of descriptors of any kind, sizes that lie) and malformed
// runtime control messages. The victim never panics, never hangs, and
// never keeps a descriptor it was sent.

// openFDs counts this process's open descriptors of memfds (the
// provider's and those a hostile peer sends), datagram sockets (the CQs'
// notification sockets and notifiers, and those a peer sends) and pipes
// (which a hostile peer sends too). Other sockets are left out: the
// harness closes its listeners in the background.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && (strings.HasPrefix(l, "/memfd:goverbs") || strings.HasPrefix(l, "pipe:")) {
			n++
		}
		if fd, err := strconv.Atoi(e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err == nil && typ == unix.SOCK_DGRAM {
				n++
			}
		}
	}
	return n
}

// Kinds of descriptor a hostile peer sends.
const (
	fdSmall     = iota // a sealed memfd of one page
	fdMedium           // a sealed memfd of 64 KiB
	fdKeys             // a sealed memfd the size of a key table
	fdLarge            // a sealed memfd of 8 MiB
	fdUnsealed         // a memfd that can shrink under its mapper
	fdWriteSeal        // a sealed memfd that cannot be mapped writable
	fdReadOnly         // a sealed memfd opened read-only
	fdPipe             // not a memfd at all
	fdEvent            // a Unix datagram socket, as a peer's CQ notifier
	fdKinds
)

// hostileFD makes a descriptor of kind k.
func hostileFD(t testing.TB, k int) int {
	t.Helper()
	if k == fdEvent {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		return p[0]
	}
	if k == fdPipe {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		return p[0]
	}
	size := map[int]int{fdSmall: pageSize, fdMedium: 64 << 10, fdLarge: 8 << 20}[k]
	if size == 0 {
		size = maxKeys * keySlotSize
	}
	fd, err := unix.MemfdCreate("goverbs-hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	seals := sealsRequired
	switch k {
	case fdUnsealed:
		seals = 0
	case fdWriteSeal:
		seals |= unix.F_SEAL_WRITE
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	if k == fdReadOnly {
		s := &segment{fd: fd}
		ro, err := s.readOnlyFD()
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		return ro
	}
	return fd
}

// hostileFDs makes one descriptor for each byte of kinds (at most 6).
func hostileFDs(t testing.TB, kinds []byte) []int {
	var fds []int
	for _, k := range kinds[:min(len(kinds), 6)] {
		fds = append(fds, hostileFD(t, int(k)%fdKinds))
	}
	return fds
}

// socketPair returns the victim's end, as the provider holds it, and the
// attacker's raw end of a SOCK_SEQPACKET pair.
func socketPair(t testing.TB) (*net.UnixConn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "victim")
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return nc.(*net.UnixConn), fds[1]
}

// validHello is a well-formed request as a peer with a QP of rqN
// receives of sges SGEs and a CQ of cqN entries would send.
func validHello(rqN, sges, cqN uint32, srq bool, private []byte) []byte {
	h := make([]byte, helloHeader+len(private))
	binary.LittleEndian.PutUint32(h[0:], helloMagic)
	binary.LittleEndian.PutUint16(h[4:], helloVersion)
	h[6] = msgReq
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], 0x123)
	binary.LittleEndian.PutUint32(h[16:], rqN)
	binary.LittleEndian.PutUint32(h[20:], sges)
	binary.LittleEndian.PutUint32(h[24:], cqN)
	if srq {
		h[7] = 1
		binary.LittleEndian.PutUint32(h[28:], 16)
		binary.LittleEndian.PutUint32(h[32:], 4)
	}
	h[36], h[37], h[38], h[39], h[40] = 16, 16, 7, 7, 12
	binary.LittleEndian.PutUint16(h[44:], uint16(len(private)))
	copy(h[helloHeader:], private)
	return h
}

// withEpochIndex sets the index of the grant epoch word in hello h.
func withEpochIndex(h []byte, idx int) []byte {
	binary.LittleEndian.PutUint16(h[46:], uint16(idx))
	return h
}

// victimQP is a QP for the handshake to attach to.
func victimQP(t testing.TB) *qp {
	t.Helper()
	_, pd, cq := openShm(t)
	q, err := smallQP(pd, cq)
	if err != nil {
		t.Fatal(err)
	}
	return driverQP(q)
}

// handshake has the attacker send msg with descriptors of kinds, and the
// victim read and attach it as Accept and Dial do. It returns the
// connection if the victim took the handshake (the caller closes it).
func handshake(t testing.TB, q *qp, msg, kinds []byte) (*conn, error) {
	t.Helper()
	sock, att := socketPair(t)
	defer unix.Close(att)
	fds := hostileFDs(t, kinds)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	err := unix.Sendmsg(att, msg, oob, nil, 0)
	closeFDs(fds)
	if err != nil {
		sock.Close()
		return nil, err // e.g. an empty message with descriptors
	}
	h, rfds, err := readHello(sock, time.Now().Add(callBound), nil)
	if err == nil {
		_ = h.param() // what Accept shows the application
		var c *conn
		if c, err = attach(q, sock, h, rfds); err == nil {
			return c, nil
		}
	}
	sock.Close()
	return nil, err
}

// FuzzHandshake feeds the connection handshake any bytes with any
// descriptors. Whatever it is sent, the victim neither panics nor keeps a
// descriptor, and a handshake it takes maps segments at least as large as
// the sizes it declares.
func FuzzHandshake(f *testing.F) {
	keys5 := []byte{fdMedium, fdMedium, fdKeys, fdSmall, fdEvent}
	for _, s := range []struct {
		msg   []byte
		kinds []byte
	}{
		{validHello(16, 4, 16, false, nil), keys5},                                                         // well formed
		{validHello(16, 4, 16, false, []byte("hello")), keys5},                                             // with private data
		{validHello(16, 4, 16, true, nil), []byte{fdMedium, fdMedium, fdKeys, fdSmall, fdMedium, fdEvent}}, // with an SRQ
		{validHello(16, 4, 16, false, nil), keys5[:4]},                                                     // too few descriptors
		{validHello(16, 4, 16, false, nil), append(keys5, fdSmall)},                                        // too many
		{validHello(16, 4, 16, false, nil), nil},                                                           // none
		{validHello(3, 4, 16, false, nil), keys5},                                                          // receive queue not a power of two
		{validHello(16, 4, 12, false, nil), keys5},                                                         // CQ not a power of two
		{validHello(16, 17, 16, false, nil), keys5},                                                        // too many SGEs
		{validHello(1<<20, 4, 16, false, nil), keys5},                                                      // queue larger than its segment
		{validHello(16, 4, 1<<20, false, nil), keys5},                                                      // CQ larger than its segment
		{validHello(16, 4, 16, false, nil), []byte{fdUnsealed, fdMedium, fdKeys, fdSmall, fdEvent}},        // unsealed
		{validHello(16, 4, 16, false, nil), []byte{fdWriteSeal, fdMedium, fdKeys, fdSmall, fdEvent}},       // cannot be mapped writable
		{validHello(16, 4, 16, false, nil), []byte{fdReadOnly, fdMedium, fdKeys, fdSmall, fdEvent}},        // read-only descriptor
		{validHello(16, 4, 16, false, nil), []byte{fdMedium, fdMedium, fdSmall, fdSmall, fdEvent}},         // key table too small
		{validHello(16, 4, 16, false, nil), []byte{fdPipe, fdMedium, fdKeys, fdSmall, fdEvent}},            // not a memfd
		{validHello(16, 4, 16, false, nil), []byte{fdMedium, fdMedium, fdKeys, fdSmall, fdPipe}},           // notifier not a datagram socket
		{validHello(16, 4, 16, false, nil), []byte{fdMedium, fdMedium, fdKeys, fdPipe, fdEvent}},           // epoch page not a memfd
		{validHello(16, 4, 16, false, nil), []byte{fdMedium, fdMedium, fdKeys, fdUnsealed, fdEvent}},       // epoch page unsealed
		{withEpochIndex(validHello(16, 4, 16, false, nil), epochWords), keys5},                             // epoch word beyond its page
		{withEpochIndex(validHello(16, 4, 16, false, nil), epochWords-1), keys5},                           // the page's last word
		{validHello(16, 4, 16, false, nil)[:helloHeader-1], keys5},                                         // truncated
		{append(validHello(16, 4, 16, false, nil), 0), keys5},                                              // private data length lies
		{validHello(16, 4, 16, false, make([]byte, 300)), keys5},                                           // private data too long
		{[]byte("GET / HTTP/1.1\r\n\r\n"), nil},                                                            // not a goverbs peer
		{[]byte{}, nil},
	} {
		f.Add(s.msg, s.kinds)
	}
	q := victimQP(f)
	f.Fuzz(func(t *testing.T, msg, kinds []byte) {
		before := openFDs(t)
		c, err := handshake(t, q, msg, kinds)
		if err == nil {
			h := hello(msg)
			rqN, cqN := int(h.rqEntries()), int(h.cqEntries())
			if len(c.peerBlock.mem) < blockPad(c.remote.QPNum)+blockSize(rqN, int(h.rqSGEs()), cqN) || len(c.cqSeg.mem) < headerSize ||
				len(c.keySeg.mem) < maxKeys*keySlotSize || len(c.epochSeg.mem) < epochPageSize || h.epochIndex() >= epochWords || c.peerRecv == nil || c.peerCQ == nil || c.pid != os.Getpid() {
				t.Fatalf("a handshake was taken with segments smaller than it declares, or no rings")
			}
			c.close()
		}
		if after := openFDs(t); after != before {
			t.Fatalf("%d descriptors open after the handshake, %d before (error %v)", after, before, err)
		}
	})
}

// TestHandshakeForgedPID: a peer that names another process in its
// hello — this one, here — is not believed: the PID used for
// process_vm_readv/writev is the one the kernel reports for the socket.
func TestHandshakeForgedPID(t *testing.T) {
	q := victimQP(t)
	msg := validHello(16, 4, 16, false, nil)
	binary.LittleEndian.PutUint32(msg[8:], 1) // init
	c, err := handshake(t, q, msg, []byte{fdMedium, fdMedium, fdKeys, fdSmall, fdEvent})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if c.pid != os.Getpid() {
		t.Fatalf("the connection aims process memory access at PID %d, the hello's claim; the socket's peer is %d", c.pid, os.Getpid())
	}
}

// ctrlMsg is a runtime control message a fuzz input describes.
type ctrlMsg struct {
	b     []byte
	kinds []byte
}

// parseCtrlInput splits a fuzz input into control messages: a length
// byte, that many bytes (a runtime message is 12), a descriptor-count
// byte and that many descriptor kinds.
func parseCtrlInput(data []byte) []ctrlMsg {
	var out []ctrlMsg
	for len(data) > 0 && len(out) < 64 {
		n := min(int(data[0])%24, len(data)-1)
		m := ctrlMsg{b: data[1 : 1+n]}
		data = data[1+n:]
		if len(data) > 0 {
			k := min(int(data[0])%4, len(data)-1)
			m.kinds = data[1 : 1+k]
			data = data[1+k:]
		}
		out = append(out, m)
	}
	return out
}

// ctrlSeed encodes runtime messages of type typ with arguments a, b and
// descriptors of kinds.
func ctrlSeed(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = append(out, m...)
	}
	return out
}

func ctrlBytes(typ uint8, a, b uint32, kinds ...byte) []byte {
	var m ctrl
	m.set(typ, a, b)
	out := append([]byte{byte(len(m))}, m[:]...)
	out = append(out, byte(len(kinds)))
	return append(out, kinds...)
}

// FuzzControlMessages sends a connected victim any runtime control
// messages, with any descriptors, from its peer's socket, and then has
// the victim use the connection: every call returns in bounded time,
// nothing panics, and once both ends are closed no descriptor is left.
func FuzzControlMessages(f *testing.F) {
	for _, s := range [][]byte{
		ctrlSeed(ctrlBytes(msgGetSeg, 1, 0), ctrlBytes(msgGetSeg, 1, 1), ctrlBytes(msgGetSeg, 1<<31, 1)),
		ctrlSeed(ctrlBytes(msgSeg, 1, 1, fdMedium), ctrlBytes(msgSeg, 2, 0, fdReadOnly), ctrlBytes(msgSeg, 3, 1, fdSmall, fdSmall)),
		ctrlSeed(ctrlBytes(msgSeg, 1, 1, fdUnsealed), ctrlBytes(msgSeg, 1, 1, fdWriteSeal), ctrlBytes(msgSeg, 1, 1, fdPipe)),
		ctrlSeed(ctrlBytes(msgSegGone, 1, 0), ctrlBytes(msgSegGone, 1, 0, fdSmall), ctrlBytes(msgSeg, 9, 0)),
		ctrlSeed(ctrlBytes(msgErr, uint32(driver.EventQPAccessErr), 0)),
		ctrlSeed(ctrlBytes(msgErr, 0xffffffff, 7, fdSmall)),
		ctrlSeed(ctrlBytes(msgDisc, 0, 0), ctrlBytes(msgGetSeg, 1, 0)),
		ctrlSeed(ctrlBytes(msgSRQLimit, 0, 0), ctrlBytes(msgOverrun, 0, 0)),
		ctrlSeed(ctrlBytes(msgRTU, 0, 0), ctrlBytes(msgReq, 0, 0), ctrlBytes(0, 0, 0), ctrlBytes(255, 1, 2)),
		ctrlSeed(ctrlBytes(msgGetKey, 0, 0), ctrlBytes(msgGetKey, 0xffffffff, 1), ctrlBytes(msgGetKey, 7, 0, fdSmall)),
		ctrlSeed(ctrlBytes(msgKey, 1, 1), ctrlBytes(msgKey, 0, 0, fdMedium), ctrlBytes(msgKey, 0xffffffff, 2)),
		{5, 'h', 'e', 'l', 'l', 'o', 1, fdMedium, 0, 0},
		{},
	} {
		f.Add(s)
	}
	h := localHarness()
	f.Fuzz(func(t *testing.T, data []byte) {
		before := openFDs(t)
		func() {
			p := h.NewPair(t, verbstest.PairOptions{})
			att := driverQP(p.B.(*verbstest.Local).QPs[0])
			att.mu.Lock()
			ac := att.conn
			att.mu.Unlock()
			target := newRegion(t, p.B, 4096, driverRemoteAll)
			rbuf := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
			postRecv(t, p.B, 0, recv(1, rbuf.SGE(0, 64)))
			local := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
			for _, m := range parseCtrlInput(data) {
				fds := hostileFDs(t, m.kinds)
				var oob []byte
				if len(fds) > 0 {
					oob = unix.UnixRights(fds...)
				}
				ac.wmu.Lock()
				ac.sock.WriteMsgUnix(m.b, oob, nil)
				ac.wmu.Unlock()
				closeFDs(fds)
			}
			wrs := []verbs.SendWR{
				rdma(1, verbs.OpRDMAWrite, local.SGE(0, 64), target, 0),
				rdma(2, verbs.OpRDMARead, local.SGE(64, 64), target, 64),
				atomicWR(3, verbs.OpAtomicFetchAndAdd, local.SGE(128, 8), target, 128, 1, 0),
				send(4, local.SGE(0, 32)),
			}
			timed(t, "PostSend", func() { p.A.PostSend(0, wrs) })
			timed(t, "Completions", func() { p.A.Completions(verbstest.SendCQ, 4, callBound/2) })
			expectCanaries(t, p.A, local)
			closeBounded(t, p)
		}()
		if after := openFDs(t); after != before {
			t.Fatalf("%d descriptors open after the pair closed, %d before", after, before)
		}
	})
}

// closeBounded closes both endpoints of p and fails if that hangs.
func closeBounded(t testing.TB, p *verbstest.Pair) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		p.A.Close()
		p.B.Close()
		close(done)
	}()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatal("closing the endpoints hangs")
	}
}

// TestHostileSegmentFlood: a peer that pushes segment after segment while
// the victim's requester is idle cannot make the victim hold their
// descriptors: at most maxArrivals are pending at a time, and the
// requester, once it runs, still reaches the peer's memory.
func TestHostileSegmentFlood(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	att := driverQP(p.B.(*verbstest.Local).QPs[0])
	att.mu.Lock()
	ac := att.conn
	att.mu.Unlock()
	vc := driverQP(p.A.QPs[0])
	target := newRegion(t, p.B, 4096, driverRemoteAll)
	fill(t, p.B, target, 0, pattern(4, 64))
	local := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)

	before := openFDs(t)
	fd := hostileFD(t, fdSmall)
	defer unix.Close(fd)
	const flood = 4 * maxArrivals
	var m ctrl
	for i := range flood {
		m.set(msgSeg, uint32(1<<20+i), 1)
		if _, _, err := ac.sock.WriteMsgUnix(m[:], unix.UnixRights(fd), nil); err != nil {
			t.Fatal(err)
		}
	}
	// The victim's reader handles messages in order: once it answers a
	// request sent after the flood, it has handled the flood.
	ac.sendCtrl(msgGetSeg, 1<<30, 0)
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for answered := false; !answered; {
		ac.arriveMu.Lock()
		for _, r := range ac.arrivals {
			answered = answered || r.id == 1<<30
		}
		ac.arriveMu.Unlock()
		if !answered {
			select {
			case <-ac.segNote:
			case <-timer.C:
				t.Fatal("the victim did not answer after the flood")
			}
		}
	}
	if held := openFDs(t) - before - 1; held > maxArrivals { // less the flood's own
		t.Fatalf("after a flood of %d segments the victim holds %d more descriptors, want at most %d", flood, held, maxArrivals)
	}
	vc.mu.Lock()
	vconn := vc.conn
	vc.mu.Unlock()
	vconn.arriveMu.Lock()
	pending := len(vconn.arrivals)
	vconn.arriveMu.Unlock()
	postSend(t, p.A, 0, rdma(1, verbs.OpRDMARead, local.SGE(0, 64), target, 0))
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 1, verbs.WCSuccess)
	if got := contents(t, p.A, local, 0, 64); string(got) != string(pattern(4, 64)) {
		t.Fatal("the RDMA Read after the flood returned wrong bytes")
	}
	vc.mu.Lock()
	mapped := len(vconn.segs)
	vc.mu.Unlock()
	if mapped > maxArrivals+8 {
		t.Fatalf("the requester maps %d of the peer's segments after the flood", mapped)
	}
	t.Logf("flood of %d segments: %d pending at the end, %d mapped after the next access", flood, pending, mapped)
}
