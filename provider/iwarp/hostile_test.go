package iwarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A hostile peer: a raw TCP client that does the MPA handshake by hand
// with a goverbs endpoint (the victim) and then sends what it likes.

// victim is a goverbs endpoint with QPs accepting connections: conn is
// the first one's, more the others'.
type victim struct {
	e        *verbstest.Local
	l        *cm.Listener
	accepted chan error
	conn     *cm.Conn
	mu       sync.Mutex
	more     []*cm.Conn // guarded by mu
}

// newVictim makes the endpoint and starts accepting one connection with
// ird Read and atomic responder resources.
func newVictim(t testing.TB, ird uint8) *victim { return newVictimN(t, ird, 1) }

// newVictimN is newVictim with n QPs, accepting a connection each, in
// order; each dialHostile takes the next. It accepts until the test
// ends, however long the test takes to dial.
func newVictimN(t testing.TB, ird uint8, n int) *victim {
	t.Helper()
	opts := verbstest.PairOptions{QPs: n}.Defaults()
	e, err := verbstest.NewLocal("tcp0", opts, false)
	if err != nil {
		t.Fatalf("victim endpoint: %v", err)
	}
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		e.Close()
		t.Fatalf("listen: %v", err)
	}
	v := &victim{e: e, l: l, accepted: make(chan error, n)}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		l.Close()
		<-stopped // and conn and more are set for good
		if v.conn != nil {
			v.conn.Close()
		}
		v.mu.Lock()
		more := v.more
		v.mu.Unlock()
		for _, c := range more {
			c.Close()
		}
		e.Close()
	})
	go func() {
		defer close(stopped)
		for i := range n {
			req, err := l.Accept(ctx)
			var c *cm.Conn
			if err == nil {
				c, err = req.Accept(e.QPs[i], &cm.Param{ResponderResources: ird})
			}
			if i == 0 {
				v.conn = c
			} else if c != nil {
				v.mu.Lock()
				v.more = append(v.more, c)
				v.mu.Unlock()
			}
			v.accepted <- err
			if err != nil {
				return
			}
		}
	}()
	return v
}

// hostile is the raw end of the connection.
type hostile struct {
	t   testing.TB
	nc  net.Conn
	crc bool
	ird int // the victim's IRD
	ext bool
	msn [wire.NumQN]uint32
}

// dialHostile connects to the victim with an MPA v2 request (peer-to-peer
// with an RTR Write, offering RFC 7306 if ext, CRC if crc) and, unless
// noRTR, sends the RTR.
func dialHostile(t testing.TB, v *victim, crc, ext, noRTR bool) *hostile {
	t.Helper()
	flags := byte(wire.FlagEnhanced)
	if crc {
		flags |= wire.FlagCRC
	}
	if ext {
		flags |= wire.FlagExtOffer
	}
	v2 := make(wire.V2, wire.V2Len)
	v2.Set(4, 4, true, wire.RTRWrite)
	nc, repFlags, pd := mpaConnect(t, v, flags, wire.Revision2, v2)
	h := &hostile{t: t, nc: nc, crc: repFlags&wire.FlagCRC != 0, ird: wire.V2(pd).IRD(),
		ext: repFlags&wire.FlagExtAccept != 0, msn: [wire.NumQN]uint32{1, 1, 1, 1}}
	if !noRTR {
		var rtr [wire.TaggedLen]byte
		wire.Hdr(rtr[:]).SetTagged(wire.OpWrite, true, 1, wire.RTRQPNTag|0x999, 0)
		h.send(h.fpdu(rtr[:], nil))
		if err := <-v.accepted; err != nil {
			t.Fatalf("victim accept: %v", err)
		}
	}
	return h
}

// mpaConnect dials the victim as a raw client, sends an MPA Request with
// flags, revision rev and private data pd, and reads the Reply, which
// must accept the connection: it returns the connection (closed when the
// test ends), the Reply's flags and its private data.
func mpaConnect(t testing.TB, v *victim, flags, rev byte, pd []byte) (net.Conn, byte, []byte) {
	t.Helper()
	nc, err := net.Dial("tcp", v.l.Addr()[len("tcp://"):])
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	req := make(wire.Frame, wire.FrameHeaderLen+len(pd))
	req.SetHeader(wire.KeyReq, flags, rev, len(pd))
	copy(req[wire.FrameHeaderLen:], pd)
	if _, err := nc.Write(req); err != nil {
		t.Fatalf("send MPA request: %v", err)
	}
	rep := make([]byte, wire.FrameHeaderLen)
	if _, err := io.ReadFull(nc, rep); err != nil {
		t.Fatalf("read MPA reply: %v", err)
	}
	n, err := wire.ValidateFrameHeader(rep)
	if err != nil || !wire.Frame(rep).IsReply() || wire.Frame(rep).Flags()&wire.FlagReject != 0 {
		t.Fatalf("MPA reply %x: %v", rep, err)
	}
	rpd := make([]byte, n)
	if _, err := io.ReadFull(nc, rpd); err != nil {
		t.Fatalf("read MPA reply private data: %v", err)
	}
	return nc, wire.Frame(rep).Flags(), rpd
}

// fpdu frames headers and payload: length field (already in hdr), pad
// and CRC.
func (h *hostile) fpdu(hdr, payload []byte) []byte {
	b := append(append([]byte(nil), hdr...), payload...)
	b = append(b, make([]byte, wire.Pad(len(b)-2))...)
	var crc [4]byte
	if h.crc {
		wire.PutCRC(crc[:], crc32.Checksum(b, wire.Castagnoli))
	}
	return append(b, crc[:]...)
}

func (h *hostile) send(b []byte) {
	h.t.Helper()
	if _, err := h.nc.Write(b); err != nil {
		h.t.Fatalf("hostile write: %v", err)
	}
}

// untagged returns untagged headers of op on queue qn with the next MSN.
func (h *hostile) untagged(op wire.Opcode, qn uint32, payload int) []byte {
	b := make([]byte, wire.HeaderLen(op))
	wire.Hdr(b).SetUntagged(op, true, 0, qn, h.msn[qn], 0, payload)
	h.msn[qn]++
	return b
}

// write returns the FPDU of an RDMA Write of payload at stag:to.
func (h *hostile) write(stag uint32, to uint64, payload []byte) []byte {
	var b [wire.TaggedLen]byte
	wire.Hdr(b[:]).SetTagged(wire.OpWrite, true, stag, to, len(payload))
	return h.fpdu(b[:], payload)
}

// readRequest returns the FPDU of an RDMA Read Request.
func (h *hostile) readRequest(size, stag uint32, to uint64) []byte {
	b := make([]byte, wire.ReadRequestLen)
	wire.ReadRequest(b).Set(h.msn[wire.QNRead], 0x5151, 0, size, stag, to)
	h.msn[wire.QNRead]++
	return h.fpdu(b, nil)
}

// readFPDU reads the next FPDU the victim sends, and checks its CRC when
// CRCs are in use.
func (h *hostile) readFPDU() []byte {
	h.t.Helper()
	var l [wire.LenFieldLen]byte
	if _, err := io.ReadFull(h.nc, l[:]); err != nil {
		h.t.Fatalf("read: %v", err)
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	b := make([]byte, wire.FPDULen(n))
	copy(b, l[:])
	if _, err := io.ReadFull(h.nc, b[len(l):]); err != nil {
		h.t.Fatalf("read: %v", err)
	}
	if h.crc {
		if got, want := wire.CRC(b[len(b)-wire.CRCLen:]), crc32.Checksum(b[:len(b)-wire.CRCLen], wire.Castagnoli); got != want {
			h.t.Fatalf("victim FPDU with CRC %#x, want %#x", got, want)
		}
	}
	return b
}

// expectTerminate reads FPDUs from the victim until a Terminate and
// checks its error; it returns the Terminate.
func (h *hostile) expectTerminate(layer wire.Layer, etype, ecode uint8) wire.Terminate {
	h.t.Helper()
	for {
		b := h.readFPDU()
		n := wire.Hdr(b).ULPDULen()
		if n < wire.TaggedLen-2 || wire.Hdr(b).Opcode() != wire.OpTerminate {
			continue
		}
		if n < wire.TerminateLen-2 {
			h.t.Fatalf("Terminate of %d bytes", n)
		}
		term := wire.Terminate(b[:2+n])
		if term.Layer() != layer || term.EType() != etype || term.ECode() != ecode {
			h.t.Fatalf("Terminate reports %v, want layer %d type %d code %#x", term, layer, etype, ecode)
		}
		if wire.Hdr(term).QN() != wire.QNTerminate || wire.Hdr(term).MSN() != 1 {
			h.t.Fatalf("Terminate on queue %d with MSN %d", wire.Hdr(term).QN(), wire.Hdr(term).MSN())
		}
		return term
	}
}

// pour writes stream to the peer while it reads and drops what the peer
// sends (which may answer while the stream is still going in), closes
// its writing half, and waits for the peer, who, to end the stream.
func (h *hostile) pour(stream []byte, who string) {
	h.t.Helper()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		io.Copy(io.Discard, h.nc)
	}()
	h.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	h.nc.Write(stream)
	h.nc.(*net.TCPConn).CloseWrite()
	select {
	case <-readDone:
	case <-time.After(10 * time.Second):
		h.t.Fatalf("the %s did not end the stream within 10s of its end", who)
	}
}

// newRegion registers a region of size bytes with access at e, with
// canaries around it (verbstest.Local.NewRegion).
func newRegion(t testing.TB, e *verbstest.Local, size int, access verbs.AccessFlags) verbstest.Region {
	t.Helper()
	r, err := e.NewRegion(size, access)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// expectVictimError waits for the victim's QP to reach the error state.
func expectVictimError(t testing.TB, v *victim) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if s, err := v.e.QPState(0); err == nil && s == verbs.QPSErr {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			s, _ := v.e.QPState(0)
			t.Fatalf("the victim's QP is in %v, want ERR within 10s", s)
		}
	}
}

// guarded is a region of the victim with its content at the start.
type guarded struct {
	r    verbstest.Region
	snap []byte
}

func guard(t testing.TB, v *victim, size int, access verbs.AccessFlags) guarded {
	t.Helper()
	r, err := v.e.NewRegion(size, access)
	if err != nil {
		t.Fatalf("victim region: %v", err)
	}
	data := bytes.Repeat([]byte{0x5a}, size)
	if err := v.e.WriteRegion(r.ID, 0, data); err != nil {
		t.Fatal(err)
	}
	return guarded{r: r, snap: data}
}

// intact checks that the region's canaries are intact and its bytes
// outside [from, to) unchanged.
func (g guarded) intact(t testing.TB, v *victim, from, to int) {
	t.Helper()
	ok, err := v.e.CanariesIntact(g.r.ID)
	if err != nil || !ok {
		t.Fatalf("canaries around the victim's region: intact %v, %v", ok, err)
	}
	b, err := v.e.ReadRegion(g.r.ID, 0, g.r.Len)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		if (i < from || i >= to) && b[i] != g.snap[i] {
			t.Fatalf("byte %d of the victim's region changed from %#x to %#x", i, g.snap[i], b[i])
		}
	}
}

// TestHostilePeer sends the victim each kind of bad input and checks the
// outcome: a Terminate with the error RFC 5040/5041/5044 prescribe, the
// victim's QP in the error state, no byte outside registered regions (or
// inside, but outside what a legitimate part of the input named)
// changed, and no goroutine left behind (TestMain runs goleak).
func TestHostilePeer(t *testing.T) {
	type tc struct {
		name  string
		crc   bool
		ext   bool
		noRTR bool
		ird   uint8
		// run sends the bad input and returns the range of the target
		// region it may legitimately have changed.
		run func(t *testing.T, h *hostile, v *victim, g guarded) (from, to int)
		// recv, if not 0, is the status the receive the bad input
		// took completes with.
		recv  verbs.WCStatus
		layer wire.Layer
		etype uint8
		ecode uint8
	}
	payload := bytes.Repeat([]byte{0xee}, 32)
	cases := []tc{
		{name: "ForgedSTag", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.write(g.r.RKey^0xdead0000, g.r.Addr, payload))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPTaggedError, ecode: wire.DDPInvalidSTag},
		{name: "OffsetPastEnd", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.write(g.r.RKey, g.r.Addr+uint64(g.r.Len)-8, payload))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPTaggedError, ecode: wire.DDPBaseBounds},
		{name: "OffsetBelowStart", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.write(g.r.RKey, g.r.Addr-8, payload))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPTaggedError, ecode: wire.DDPBaseBounds},
		{name: "OffsetWraps", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.write(g.r.RKey, ^uint64(0)-4, payload))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPTaggedError, ecode: wire.DDPBaseBounds},
		{name: "ReadForgedSTag", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.readRequest(16, g.r.RKey+1, g.r.Addr))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteProtect, ecode: wire.RDMAPInvalidSTag},
		{name: "ReadOversize", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.readRequest(0xffffffff, g.r.RKey, g.r.Addr))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteProtect, ecode: wire.RDMAPBaseBounds},
		{name: "SendTooLong", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 8)}}}); n != 1 {
				t.Fatalf("post receive: %v", err)
			}
			h.send(h.fpdu(h.untagged(wire.OpSend, wire.QNSend, len(payload)), payload))
			return 0, 8
		}, recv: verbs.WCLocLenErr, layer: wire.LayerDDP, etype: wire.DDPUntaggedError, ecode: wire.DDPTooLong},
		{name: "SendNoReceive", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.fpdu(h.untagged(wire.OpSend, wire.QNSend, len(payload)), payload))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPUntaggedError, ecode: wire.DDPNoBuffer},
		{name: "SendBadMSN", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.msn[wire.QNSend] = 7
			h.send(h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 0), nil))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPUntaggedError, ecode: wire.DDPInvalidMSN},
		{name: "SendBadQN", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			b := h.untagged(wire.OpSend, wire.QNSend, 0)
			binary.BigEndian.PutUint32(b[8:], 9) // QN 9
			h.send(h.fpdu(b, nil))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPUntaggedError, ecode: wire.DDPInvalidQN},
		{name: "UnknownOpcode", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			b := h.untagged(wire.OpSend, wire.QNSend, 0)
			b[3] = b[3]&^0xf | 0xd
			h.send(h.fpdu(b, nil))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteOperation, ecode: wire.RDMAPUnexpectedOpcode},
		{name: "ExtensionNotNegotiated", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			b := make([]byte, wire.ImmDataLen)
			wire.ImmData(b).Set(false, 1, 7, 0)
			h.send(h.fpdu(b, nil))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteOperation, ecode: wire.RDMAPUnexpectedOpcode},
		{name: "ULPDUShorterThanHeaders", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			var b [wire.TaggedLen]byte
			wire.Hdr(b[:]).SetTagged(wire.OpWrite, true, g.r.RKey, g.r.Addr, 0)
			binary.BigEndian.PutUint16(b[:], 3)
			h.send(h.fpdu(b[:], nil))
			return 0, 0
		}, layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPLengthMismatch},
		{name: "TruncatedFrame", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			f := h.write(g.r.RKey, g.r.Addr, payload)
			h.send(f[:wire.TaggedLen+10])
			h.nc.(*net.TCPConn).CloseWrite()
			return 0, 10
		}, layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPConnectionLost},
		{name: "BadCRC", crc: true, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			f := h.write(g.r.RKey, g.r.Addr, payload)
			f[len(f)-1] ^= 0xff
			h.send(f)
			return 0, len(payload)
		}, layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPCRCError},
		{name: "SendBadCRC", crc: true, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			// A small Send arrives whole in one read: the receiver's
			// short road (rxStagedSend) checks its CRC before it takes
			// the receive.
			if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 64)}}}); n != 1 {
				t.Fatalf("post receive: %v", err)
			}
			f := h.fpdu(h.untagged(wire.OpSend, wire.QNSend, len(payload)), payload)
			f[len(f)-1] ^= 0xff
			h.send(f)
			return 0, len(payload)
		}, recv: verbs.WCWRFlushErr, layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPCRCError},
		{name: "MoreReadsThanIRD", ird: 1, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			// The first response (the whole region) cannot leave the
			// victim while this side does not read, so the second
			// request finds the IRD of 1 in use.
			if h.ird != 1 {
				t.Fatalf("victim offered IRD %d, want 1", h.ird)
			}
			h.send(append(h.readRequest(uint32(g.r.Len), g.r.RKey, g.r.Addr), h.readRequest(8, g.r.RKey, g.r.Addr)...))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteOperation, ecode: wire.RDMAPCatastrophicLocal},
		{name: "UnsolicitedReadResponse", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			var b [wire.TaggedLen]byte
			wire.Hdr(b[:]).SetTagged(wire.OpReadResponse, true, g.r.RKey, g.r.Addr, len(payload))
			h.send(h.fpdu(b[:], payload))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPTaggedError, ecode: wire.DDPInvalidSTag},
		{name: "WrongRTR", noRTR: true, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			h.send(h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 0), nil))
			return 0, 0
		}, layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPNoMatchingRTR},
		{name: "ReadRequestNotLast", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			f := h.readRequest(16, g.r.RKey, g.r.Addr)
			f[2] &^= 0x40 // the DDP Last flag
			h.send(h.fpdu(f[:wire.ReadRequestLen], nil))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteOperation, ecode: wire.RDMAPCatastrophicLocal},
		{name: "ReadRequestOffset", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			f := h.readRequest(16, g.r.RKey, g.r.Addr)
			binary.BigEndian.PutUint32(f[16:], 28) // the DDP message offset
			h.send(h.fpdu(f[:wire.ReadRequestLen], nil))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPUntaggedError, ecode: wire.DDPInvalidMO},
		{name: "AtomicRequestOffset", ext: true, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			b := make([]byte, wire.AtomicReqLen)
			wire.AtomicRequest(b).Set(h.msn[wire.QNAtomic], wire.AtomicFetchAdd, 1, g.r.RKey, g.r.Addr, 1, 0, 0, 0)
			binary.BigEndian.PutUint32(b[16:], 8) // the DDP message offset
			h.send(h.fpdu(b, nil))
			return 0, 0
		}, layer: wire.LayerDDP, etype: wire.DDPUntaggedError, ecode: wire.DDPInvalidMO},
		{name: "AtomicMisaligned", ext: true, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			b := make([]byte, wire.AtomicReqLen)
			wire.AtomicRequest(b).Set(h.msn[wire.QNAtomic], wire.AtomicFetchAdd, 1, g.r.RKey, g.r.Addr+3, 1, 0, 0, 0)
			h.send(h.fpdu(b, nil))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteOperation, ecode: wire.RDMAPUnspecified},
		{name: "AtomicForgedSTag", ext: true, run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			b := make([]byte, wire.AtomicReqLen)
			wire.AtomicRequest(b).Set(h.msn[wire.QNAtomic], wire.AtomicFetchAdd, 1, g.r.RKey^0x100, g.r.Addr, 1, 0, 0, 0)
			h.send(h.fpdu(b, nil))
			return 0, 0
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteProtect, ecode: wire.RDMAPInvalidSTag},
		{name: "InvalidateForgedSTag", run: func(t *testing.T, h *hostile, v *victim, g guarded) (int, int) {
			if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 8)}}}); n != 1 {
				t.Fatalf("post receive: %v", err)
			}
			b := h.untagged(wire.OpSendInv, wire.QNSend, 0)
			binary.BigEndian.PutUint32(b[4:], g.r.RKey^0x77000000)
			h.send(h.fpdu(b, nil))
			return 0, 8
		}, layer: wire.LayerRDMAP, etype: wire.RDMAPRemoteOperation, ecode: wire.RDMAPCannotInvalidate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ird := c.ird
			if ird == 0 {
				ird = 4
			}
			v := newVictim(t, ird)
			size := 4096
			if c.name == "MoreReadsThanIRD" {
				size = 32 << 20
			}
			g := guard(t, v, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
			h := dialHostile(t, v, c.crc, c.ext, c.noRTR)
			if c.ext && !h.ext {
				t.Fatal("the victim did not accept the RFC 7306 extensions")
			}
			from, to := c.run(t, h, v, g)
			h.expectTerminate(c.layer, c.etype, c.ecode)
			expectVictimError(t, v)
			g.intact(t, v, from, to)
			if c.recv != 0 {
				wc, err := v.e.Completions(verbstest.RecvCQ, 1, 10*time.Second)
				if err != nil || len(wc) != 1 || wc[0].WRID != 5 || wc[0].Status != c.recv {
					t.Fatalf("the receive completes with %+v (%v), want WRID 5 with %v", wc, err, c.recv)
				}
			}
			h.nc.Close()
			if c.noRTR {
				// Accept does not wait for the RTR; the connection ends
				// with the Terminate.
				if err := <-v.accepted; err == nil {
					select {
					case <-v.conn.Done():
					case <-time.After(10 * time.Second):
						t.Fatal("the victim's connection goes on after a first FPDU that was not the RTR")
					}
				}
			}
		})
	}
}

// TestTerminateNamesOffender checks that a Terminate carries the headers
// of the segment it terminates, so that the peer can tell which WR
// failed.
func TestTerminateNamesOffender(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	forged := g.r.RKey ^ 0x00ab0000
	h.send(h.write(forged, 0x1234, []byte("x")))
	term := h.expectTerminate(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag)
	th := term.Terminated()
	if th == nil || !th.Tagged() || th.STag() != forged || th.TO() != 0x1234 || th.Opcode() != wire.OpWrite {
		t.Fatalf("Terminate %x does not carry the Write's headers", []byte(term))
	}
	expectVictimError(t, v)
}

// TestMarkersRefused checks that a request for MPA markers is refused
// with a Reply that has the Reject flag, and that the listener keeps
// serving.
func TestMarkersRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	nc, done := acceptRaw(t, ctx, nil)
	req := make(wire.Frame, wire.FrameHeaderLen)
	req.SetHeader(wire.KeyReq, wire.FlagMarkers, wire.Revision1, 0)
	nc.Write(req)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	rep := make([]byte, wire.FrameHeaderLen)
	if _, err := io.ReadFull(nc, rep); err != nil {
		t.Fatalf("read reply: %v", err)
	}
	if !wire.Frame(rep).IsReply() || wire.Frame(rep).Flags()&wire.FlagReject == 0 || wire.Frame(rep).Flags()&wire.FlagMarkers != 0 {
		t.Fatalf("reply to a request for markers: %x, want a Reply with R set and M clear", rep)
	}
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept returned %v, want it to keep waiting until its context ends", err)
	}
}

// TestPollBudget: a poller receives at most a bounded number of FPDUs per
// poll, so that a peer that keeps sending cannot hold an application's
// CQ.Poll; what is left waits for the next poll or the receive goroutine.
// The test holds the connection's receiving itself (the receive goroutine
// stands aside) and drains 200 zero-length RDMA Writes as polls would.
func TestPollBudget(t *testing.T) {
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, true, false)
	qp := v.e.QPs[0].Driver()
	// The RTR first, received the usual way.
	deadline := time.Now().Add(10 * time.Second)
	for iwarp.FramesReceived(qp) == 0 && time.Now().Before(deadline) {
		v.e.RecvCQ.Poll(make([]verbs.WorkCompletion, 1))
	}
	const n = 200
	release := iwarp.HoldReceive(qp)
	defer release()
	h.send(bytes.Repeat(h.write(0, 0, nil), n))
	got, full := 0, 0
	for got < n && time.Now().Before(deadline) {
		k, err := iwarp.DrainHeld(qp, iwarp.PollBudget)
		if err != nil {
			t.Fatal(err)
		}
		if k > iwarp.PollBudget {
			t.Fatalf("one poll received %d FPDUs, more than its budget of %d", k, iwarp.PollBudget)
		}
		if k == iwarp.PollBudget {
			full++
		}
		got += k
	}
	if got != n || full < n/iwarp.PollBudget {
		t.Fatalf("received %d of %d FPDUs, %d polls with a full budget", got, n, full)
	}
}

// TestAcceptDoesNotWaitForRTR: in peer-to-peer mode Accept returns once
// the MPA Reply is out, as rdma_accept does, not once the initiator's RTR
// has come: an initiator that never sends it does not hold a server that
// accepts one request after another, and its connection ends when the
// RTR is overdue (the QP in the error state), while the next one, accepted
// meanwhile, stays up.
func TestAcceptDoesNotWaitForRTR(t *testing.T) {
	defer iwarp.SetRTRTimeout(300 * time.Millisecond)()
	v := newVictimN(t, 4, 2)
	dialHostile(t, v, false, false, true) // never sends its RTR
	if err := <-v.accepted; err != nil {
		t.Fatalf("Accept of the initiator that sends no RTR: %v", err)
	}
	dialHostile(t, v, false, false, false) // accepted while the first RTR is awaited
	select {
	case <-v.conn.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection whose RTR never came is still up")
	}
	expectVictimError(t, v)
	v.mu.Lock()
	second := v.more[0]
	v.mu.Unlock()
	// Past the second connection's own deadline, it is still up.
	select {
	case <-second.Done():
		t.Fatal("the connection that sent its RTR ended too")
	case <-time.After(2 * 300 * time.Millisecond):
	}
}

// TestAtomicWithResultDeregistered: an atomic whose result buffer is
// deregistered before its response arrives completes with a local
// protection error, and the QP moves to the error state; it used to
// stay outstanding for good, and no later WR could complete.
func TestAtomicWithResultDeregistered(t *testing.T) {
	v := newVictim(t, 4)
	res := newRegion(t, v.e, 64, verbs.AccessLocalWrite)
	h := dialHostile(t, v, false, true, false)
	if !h.ext {
		t.Fatal("the victim did not accept the RFC 7306 extensions")
	}
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 77, Opcode: verbs.OpAtomicFetchAndAdd, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{res.SGE(0, 8)}, RemoteAddr: 0x1000, RKey: 0x4242, CompareAdd: 1}}); n != 1 {
		t.Fatalf("post the atomic: %v", err)
	}
	var req wire.AtomicRequest
	for req == nil {
		if b := h.readFPDU(); !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpAtomicRequest {
			req = wire.AtomicRequest(b)
		}
	}
	if err := v.e.DeregRegion(res.ID); err != nil {
		t.Fatal(err)
	}
	resp := make([]byte, wire.AtomicRespLen)
	wire.AtomicResponse(resp).Set(h.msn[wire.QNAtomic], req.ID(), 41)
	h.msn[wire.QNAtomic]++
	h.send(h.fpdu(resp, nil))
	wcs, err := v.e.Completions(verbstest.SendCQ, 1, 10*time.Second)
	if len(wcs) == 0 {
		t.Fatalf("the atomic never completed: %v", err)
	}
	if wcs[0].WRID != 77 || wcs[0].Status != verbs.WCLocProtErr {
		t.Fatalf("the atomic completed %+v, want a local protection error", wcs[0])
	}
	expectVictimError(t, v)
}

// TestMessagesNotInterleaved: DDP sends a stream's messages each whole
// before the next (RFC 5041 5.3; siw ends a stream that interleaves two
// tagged messages). A Read Response owed while a large Write is going out
// follows the Write's last segment, and a Write posted while a large Read
// Response is going out follows the response's last segment.
func TestMessagesNotInterleaved(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 6<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	src := newRegion(t, v.e, 16<<20, verbs.AccessLocalWrite)
	// open says which tagged message has begun and not ended; next
	// checks that an FPDU of op begins none inside another.
	open := map[wire.Opcode]bool{}
	bytes := map[wire.Opcode]int{}
	next := func() wire.Hdr {
		t.Helper()
		hd := wire.Hdr(h.readFPDU())
		if !hd.Tagged() {
			return hd
		}
		op := hd.Opcode()
		for o, on := range open {
			if on && o != op {
				t.Fatalf("a %v segment (%d bytes) inside an unfinished %v", op, hd.PayloadLen(), o)
			}
		}
		open[op] = !hd.Last()
		bytes[op] += hd.PayloadLen()
		return hd
	}
	// A 16 MiB Write, more than the socket holds while this side reads
	// nothing; once it has begun, a Read Request of 5 MiB.
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite,
		SGList: []verbs.SGE{src.SGE(0, 16<<20)}, RemoteAddr: 0, RKey: 0x4343}}); n != 1 {
		t.Fatalf("post the Write: %v", err)
	}
	for next().Opcode() != wire.OpWrite {
	}
	h.send(h.readRequest(5<<20, g.r.RKey, g.r.Addr))
	for bytes[wire.OpReadResponse] == 0 {
		next()
	}
	if bytes[wire.OpWrite] != 16<<20 {
		t.Fatalf("the Read Response began after %d bytes of the 16 MiB Write", bytes[wire.OpWrite])
	}
	// The response has begun: a Write posted now waits for its end.
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMAWrite,
		SGList: []verbs.SGE{src.SGE(0, 100)}, RemoteAddr: 0, RKey: 0x4444}}); n != 1 {
		t.Fatalf("post the second Write: %v", err)
	}
	for bytes[wire.OpWrite] < 16<<20+100 {
		next()
	}
	if bytes[wire.OpReadResponse] != 5<<20 {
		t.Fatalf("the second Write went out after %d bytes of the 5 MiB Read Response", bytes[wire.OpReadResponse])
	}
}

// TestResponsesBetweenQueuedWrites: with the send queue holding several
// large Writes, a Read Response owed goes out between two of them, not
// after them all: messages go out whole, but a queue kept full of Writes
// must not hold the responses back (the peer would take that for a peer
// that answers nothing).
func TestResponsesBetweenQueuedWrites(t *testing.T) {
	const size, writes = 3<<20 + 1000, 6
	v := newVictim(t, 4)
	g := guard(t, v, 1<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	src := newRegion(t, v.e, size, verbs.AccessLocalWrite)
	wrs := make([]verbs.SendWR, writes)
	for i := range wrs {
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{src.SGE(0, size)}, RemoteAddr: 0, RKey: 0x4343}
	}
	if n, err := v.e.PostSend(0, wrs); n != writes {
		t.Fatalf("post the Writes: %v", err)
	}
	writeBytes := 0
	for {
		hd := wire.Hdr(h.readFPDU())
		if !hd.Tagged() {
			continue
		}
		if hd.Opcode() == wire.OpReadResponse {
			break
		}
		if writeBytes == 0 {
			// The first Write has begun: now the Read Request.
			h.send(h.readRequest(1<<20, g.r.RKey, g.r.Addr))
		}
		writeBytes += hd.PayloadLen()
	}
	if writeBytes%size != 0 || writeBytes >= writes*size {
		t.Fatalf("the Read Response began after %d bytes of the Writes (%d of %d bytes each): want it between two of them, before the last", writeBytes, writes, size)
	}
}
