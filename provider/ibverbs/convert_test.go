package ibverbs

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestSendWRConversion checks that each opcode's fields land where
// struct ibv_send_wr has them: the rkey of RDMA opcodes in wr.rdma, that
// of atomics in wr.atomic, immediate data in network byte order.
func TestSendWRConversion(t *testing.T) {
	sg := []driver.SGE{{Addr: 0x1000, Length: 8, LKey: 7}, {Addr: 0x2000, Length: 8, LKey: 7}}
	var c ibvSendWR
	toIBVSend(&c, &driver.SendWR{WRID: 9, SGList: sg, Opcode: driver.OpRDMAWriteWithImm,
		Flags: driver.SendSignaled | driver.SendSolicited, Imm: 0x11223344, RemoteAddr: 0xabc, RKey: 0x55})
	if c.wrID != 9 || c.numSGE != 2 || c.opcode != 1 || c.sendFlags != 6 || c.remoteAddr != 0xabc {
		t.Fatalf("Write with immediate: %+v", c)
	}
	if uint32(c.compareAdd) != 0x55 || c.atomicRKey != 0 {
		t.Fatalf("wr.rdma.rkey = %#x (atomic rkey %#x), want 0x55", uint32(c.compareAdd), c.atomicRKey)
	}
	if b := (*[4]byte)(unsafe.Pointer(&c.immData)); b[0] != 0x11 || b[3] != 0x44 {
		t.Fatalf("imm_data bytes %x, want 11223344 in network order", *b)
	}
	toIBVSend(&c, &driver.SendWR{WRID: 10, SGList: sg[:1], Opcode: driver.OpAtomicCmpAndSwp,
		RemoteAddr: 0x8, RKey: 0x66, CompareAdd: 1, Swap: 2})
	if c.opcode != 5 || c.compareAdd != 1 || c.swap != 2 || c.atomicRKey != 0x66 || c.immData != 0 {
		t.Fatalf("CmpAndSwp: %+v", c)
	}
	toIBVSend(&c, &driver.SendWR{Opcode: driver.OpSend})
	if c.sgList != 0 || c.numSGE != 0 || c.compareAdd != 0 || c.swap != 0 {
		t.Fatalf("Send without SGEs: %+v", c)
	}
}

// TestCompletionConversion checks struct ibv_wc's conversion: status,
// opcode, immediate data in host order, the invalidated rkey.
func TestCompletionConversion(t *testing.T) {
	var w driver.WorkCompletion
	c := ibvWC{wrID: 3, status: uint32(driver.WCRemAccessErr), opcode: 129, vendorErr: 0x99, byteLen: 40,
		qpNum: 17, srcQP: 18, wcFlags: ibvWCWithImm}
	*(*[4]byte)(unsafe.Pointer(&c.immData)) = [4]byte{0xde, 0xad, 0xbe, 0xef}
	fromIBV(&w, &c)
	want := driver.WorkCompletion{WRID: 3, Status: driver.WCRemAccessErr, Opcode: driver.WCRecvRDMAWithImm,
		Flags: driver.WCWithImm, VendorErr: 0x99, ByteLen: 40, Imm: 0xdeadbeef, QPNum: 17, SrcQP: 18}
	if w != want {
		t.Fatalf("got %+v, want %+v", w, want)
	}
	c = ibvWC{opcode: 128, wcFlags: ibvWCWithInv, immData: 0x1234}
	fromIBV(&w, &c)
	if w.Flags != driver.WCWithInv || w.InvalidatedRKey != 0x1234 || w.Imm != 0 {
		t.Fatalf("with invalidate: %+v", w)
	}
}

// TestSockaddr checks the struct sockaddr_in and sockaddr_in6 the cm
// passes to librdmacm.
func TestSockaddr(t *testing.T) {
	b := sockaddr(&net.TCPAddr{IP: net.IPv4(10, 77, 0, 2), Port: 7174})
	if b[0] != syscall.AF_INET || b[1] != 0 || b[2] != 0x1c || b[3] != 0x06 || b[4] != 10 || b[7] != 2 {
		t.Fatalf("sockaddr_in % x", b[:16])
	}
	b = sockaddr(&net.TCPAddr{Port: 80})
	if b[0] != syscall.AF_INET || b[2] != 0 || b[3] != 80 || b[4]|b[5]|b[6]|b[7] != 0 {
		t.Fatalf("wildcard sockaddr_in % x", b[:16])
	}
	b = sockaddr(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1})
	if b[0] != syscall.AF_INET6 || b[3] != 1 || b[8] != 0xfe || b[9] != 0x80 || b[23] != 1 {
		t.Fatalf("sockaddr_in6 % x", b[:28])
	}
}

// TestErrnoMapping checks that errors from the libraries wrap the driver
// sentinel callers test for, and the errno itself.
func TestErrnoMapping(t *testing.T) {
	for _, c := range []struct {
		errno syscall.Errno
		want  error
	}{
		{syscall.EINVAL, driver.ErrInvalidArg},
		{syscall.ENOMEM, driver.ErrNoResources},
		{syscall.EBUSY, driver.ErrBusy},
		{syscall.EOPNOTSUPP, driver.ErrUnsupported},
		{syscall.ENODEV, driver.ErrNoDevice},
		{syscall.ECONNREFUSED, driver.ErrRefused},
	} {
		err := errnoErr("op", c.errno)
		if !errors.Is(err, c.want) || !errors.Is(err, c.errno) {
			t.Errorf("%v: %v does not wrap %v and the errno", c.errno, err, c.want)
		}
		if msg := err.Error(); strings.Count(msg, c.errno.Error()) != 1 {
			t.Errorf("%v: %q does not say the errno's text once", c.errno, msg)
		}
	}
	if err := postErr("post_send", int32(syscall.ENOMEM)); !errors.Is(err, driver.ErrQueueFull) {
		t.Errorf("a post's ENOMEM: %v, want ErrQueueFull", err)
	}
	if err := postErr("post_send", int32(syscall.EINVAL)); !errors.Is(err, driver.ErrInvalidArg) {
		t.Errorf("a post's EINVAL: %v, want ErrInvalidArg", err)
	}
}

// TestRawModifyRecorded checks that a transition made with the attributes
// rdma_init_qp_attr gave is recorded field by field as the mask names
// them, and that fields the mask leaves out keep their value.
func TestRawModifyRecorded(t *testing.T) {
	q := &qp{}
	q.attr.Timeout, q.attr.RQPSN = 9, 77
	a := &ibvQPAttr{qpState: uint32(driver.QPSRTR), qpAccessFlags: uint32(driver.AccessRemoteRead),
		pathMTU: uint32(driver.MTU1024), destQPNum: 0x1234, rqPSN: 55, maxDestRdAtomic: 4,
		minRNRTimer: 12, timeout: 14}
	q.fromIBVAttr(a, ibvQPState|ibvQPAccessFlags|ibvQPPathMTU|ibvQPDestQPN|ibvQPMaxDestRdAtomic|ibvQPMinRNRTimer)
	want := driver.QPAttr{State: driver.QPSRTR, AccessFlags: driver.AccessRemoteRead, PathMTU: driver.MTU1024,
		DestQPNum: 0x1234, MaxDestRdAtomic: 4, MinRNRTimer: 12, Timeout: 9, RQPSN: 77}
	if q.attr != want {
		t.Errorf("recorded %+v, want %+v", q.attr, want)
	}
	if q.state.Load() != uint32(driver.QPSRTR) || q.destQPN.Load() != 0x1234 {
		t.Errorf("state %d, dest QPN %#x: want %d, 0x1234", q.state.Load(), q.destQPN.Load(), driver.QPSRTR)
	}
}
