package driver

import (
	"fmt"
	"time"
)

// AccessFlags are the rights granted on a memory region (and, for a QP, the
// remote operations its responder accepts). They mirror enum ibv_access_flags.
type AccessFlags uint32

// Access flags. Remote write and remote atomic imply local write, exactly as
// in ibverbs: registering with them but without AccessLocalWrite is refused.
const (
	AccessLocalWrite   AccessFlags = 1 << 0 // the local HCA may write the region (receives, Read results)
	AccessRemoteWrite  AccessFlags = 1 << 1 // peers may RDMA Write into the region
	AccessRemoteRead   AccessFlags = 1 << 2 // peers may RDMA Read from the region
	AccessRemoteAtomic AccessFlags = 1 << 3 // peers may run atomics on the region
	AccessMWBind       AccessFlags = 1 << 4 // memory windows may be bound to the region
)

// RemoteAccess is the union of the remote access rights.
const RemoteAccess = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic

func (a AccessFlags) String() string {
	return bitNames(uint32(a), []string{"LocalWrite", "RemoteWrite", "RemoteRead", "RemoteAtomic", "MWBind"}, "0")
}

// bitNames joins the names of the bits set in v with "|", bit i named
// names[i]; bits without a name are shown in hex, and zero as zero.
func bitNames(v uint32, names []string, zero string) string {
	s := ""
	for i, n := range names {
		if v&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if rest := v &^ (1<<len(names) - 1); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", rest)
	}
	if s == "" {
		return zero
	}
	return s
}

// Opcode is the operation of a send work request (enum ibv_wr_opcode).
type Opcode uint8

// Send work request opcodes. OpLocalInv, OpBindMW and OpSendWithInv are
// the memory window operations; a device without CapMemoryWindows
// refuses them at post time.
const (
	OpRDMAWrite Opcode = iota
	OpRDMAWriteWithImm
	OpSend
	OpSendWithImm
	OpRDMARead
	OpAtomicCmpAndSwp
	OpAtomicFetchAndAdd
	OpLocalInv
	OpBindMW
	OpSendWithInv
	numOpcodes
)

var opcodeNames = [...]string{
	OpRDMAWrite:         "RDMA_WRITE",
	OpRDMAWriteWithImm:  "RDMA_WRITE_WITH_IMM",
	OpSend:              "SEND",
	OpSendWithImm:       "SEND_WITH_IMM",
	OpRDMARead:          "RDMA_READ",
	OpAtomicCmpAndSwp:   "ATOMIC_CMP_AND_SWP",
	OpAtomicFetchAndAdd: "ATOMIC_FETCH_AND_ADD",
	OpLocalInv:          "LOCAL_INV",
	OpBindMW:            "BIND_MW",
	OpSendWithInv:       "SEND_WITH_INV",
}

func (o Opcode) String() string {
	if o < numOpcodes {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Valid reports whether o is a defined opcode.
func (o Opcode) Valid() bool { return o < numOpcodes }

// IsAtomic reports whether o is one of the 8-byte atomic operations.
func (o Opcode) IsAtomic() bool { return o == OpAtomicCmpAndSwp || o == OpAtomicFetchAndAdd }

// IsSend reports whether o consumes a receive at the responder with a
// message (Send in any of its forms).
func (o Opcode) IsSend() bool { return o == OpSend || o == OpSendWithImm || o == OpSendWithInv }

// HasImm reports whether o carries immediate data.
func (o Opcode) HasImm() bool { return o == OpSendWithImm || o == OpRDMAWriteWithImm }

// ReadsLocal reports whether o reads the local scatter/gather list (as
// opposed to writing results into it).
func (o Opcode) ReadsLocal() bool {
	return o == OpRDMAWrite || o == OpRDMAWriteWithImm || o.IsSend()
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	// SendFence makes the WR wait until every prior RDMA Read and atomic on
	// the same QP has completed.
	SendFence SendFlags = 1 << 0
	// SendSignaled asks for a completion even when the QP was created
	// without SigAll.
	SendSignaled SendFlags = 1 << 1
	// SendSolicited sets the solicited event indication on a Send or a
	// Write with immediate.
	SendSolicited SendFlags = 1 << 2
	// SendInline copies the payload at post time: the buffers may be reused
	// as soon as PostSend returns, and their lkeys are not checked.
	SendInline SendFlags = 1 << 3
)

// SGE is one element of a scatter/gather list: Length bytes at virtual
// address Addr inside the memory region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request (struct ibv_send_wr). Fields that do not
// apply to the opcode are ignored.
type SendWR struct {
	WRID   uint64
	SGList []SGE
	Opcode Opcode
	Flags  SendFlags
	// Imm is the immediate data of OpSendWithImm and OpRDMAWriteWithImm,
	// a number: it crosses the wire in network byte order, and the
	// receiver's WorkCompletion.Imm is the same number (a C peer reads it
	// as ntohl(wc.imm_data), and its htonl(x) arrives here as x).
	Imm uint32
	// InvalidateRKey is the rkey invalidated by OpSendWithInv (at the
	// peer) and OpLocalInv (locally): a type 2 memory window's.
	InvalidateRKey uint32
	// Bind is the binding OpBindMW makes.
	Bind MWBind
	// RemoteAddr and RKey name the remote memory of RDMA and atomic
	// operations.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the value compared by OpAtomicCmpAndSwp, or added by
	// OpAtomicFetchAndAdd; Swap is the value swapped in on a match.
	CompareAdd uint64
	Swap       uint64
}

// MWType is the type of a memory window (enum ibv_mw_type).
type MWType uint8

// Memory window types.
const (
	// MWType1 windows are bound with QP.BindMW (or an OpBindMW work
	// request) on any QP of their PD, and may be rebound while bound; an
	// access through them is taken on any QP of the PD.
	MWType1 MWType = 1
	// MWType2 windows are bound by an OpBindMW work request to the QP it
	// is posted on, only while unbound, and are unbound by OpLocalInv or
	// a peer's OpSendWithInv; an access through them is taken only on
	// that QP.
	MWType2 MWType = 2
)

func (t MWType) String() string {
	switch t {
	case MWType1:
		return "type 1"
	case MWType2:
		return "type 2"
	}
	return fmt.Sprintf("MWType(%d)", uint8(t))
}

// MWBind is the binding an OpBindMW work request makes (struct
// ibv_mw_bind_info, with the window): Length bytes at Addr of the region
// whose lkey is LKey, granting Access through the window MW (or, if MW
// is nil, the window whose current rkey is RKey). The region must have
// been registered with AccessMWBind, and with AccessLocalWrite for a
// window granting AccessRemoteWrite or AccessRemoteAtomic; the window's
// rights need not be the region's own (a region without remote rights is
// reached through its windows alone). A zero Length unbinds a type 1
// window; a type 2 window refuses it. The bind gives the window a new
// rkey, read with MW.RKey once the bind has completed; binds of one
// window posted back to back execute in order, each on the key the one
// before gave.
type MWBind struct {
	// MW is the window to bind; nil names it by RKey.
	MW     MW
	RKey   uint32
	LKey   uint32
	Addr   uint64
	Length uint64
	Access AccessFlags
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	WRID   uint64
	SGList []SGE
}

// SGListLen returns the total length of a scatter/gather list.
func SGListLen(sg []SGE) uint64 {
	var n uint64
	for i := range sg {
		n += uint64(sg[i].Length)
	}
	return n
}

// WCStatus is the status of a work completion (enum ibv_wc_status); the
// numeric values are those of ibverbs.
type WCStatus uint8

// Completion statuses, with ibverbs' meanings.
const (
	WCSuccess        WCStatus = iota // the operation completed successfully
	WCLocLenErr                      // local length error: a receive buffer was too small or a message too long
	WCLocQPOpErr                     // local QP operation error: an internal consistency error or a malformed WR
	WCLocEECOpErr                    // local EE context operation error (unused on RC)
	WCLocProtErr                     // local protection error: a bad lkey or an address outside the region
	WCWRFlushErr                     // work request flushed because the QP is in the error state
	WCMWBindErr                      // memory window bind error
	WCBadRespErr                     // bad response from the responder
	WCLocAccessErr                   // local access error
	WCRemInvReqErr                   // remote invalid request: the responder found the request invalid (too long for its buffer, misaligned atomic, unsupported op)
	WCRemAccessErr                   // remote access error: bad rkey, out of bounds, or missing rights
	WCRemOpErr                       // remote operation error: the responder failed to complete the operation
	WCRetryExcErr                    // transport retry counter exceeded: the peer is unreachable or gone
	WCRNRRetryExcErr                 // RNR retry counter exceeded: the peer posted no receive in time
	WCLocRDDViolErr                  // local RDD violation (unused on RC)
	WCRemInvRDReqErr                 // remote invalid RD request (unused on RC)
	WCRemAbortErr                    // remote aborted
	WCInvEECNErr                     // invalid EE context number (unused on RC)
	WCInvEECStateErr                 // invalid EE context state (unused on RC)
	WCFatalErr                       // fatal error
	WCRespTimeoutErr                 // response timeout
	WCGeneralErr                     // general error
	numWCStatus
)

var wcStatusNames = [...]string{
	WCSuccess:        "success",
	WCLocLenErr:      "local length error",
	WCLocQPOpErr:     "local QP operation error",
	WCLocEECOpErr:    "local EE context operation error",
	WCLocProtErr:     "local protection error",
	WCWRFlushErr:     "Work Request Flushed Error",
	WCMWBindErr:      "memory management operation error",
	WCBadRespErr:     "bad response error",
	WCLocAccessErr:   "local access error",
	WCRemInvReqErr:   "remote invalid request error",
	WCRemAccessErr:   "remote access error",
	WCRemOpErr:       "remote operation error",
	WCRetryExcErr:    "transport retry counter exceeded",
	WCRNRRetryExcErr: "RNR retry counter exceeded",
	WCLocRDDViolErr:  "local RDD violation error",
	WCRemInvRDReqErr: "remote invalid RD request",
	WCRemAbortErr:    "aborted error",
	WCInvEECNErr:     "invalid EE context number",
	WCInvEECStateErr: "invalid EE context state",
	WCFatalErr:       "fatal error",
	WCRespTimeoutErr: "response timeout error",
	WCGeneralErr:     "general error",
}

// String returns the status as ibv_wc_status_str(3) words it.
func (s WCStatus) String() string {
	if s < numWCStatus {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// WCOpcode is the kind of operation a completion reports (enum ibv_wc_opcode).
type WCOpcode uint8

// Completion opcodes. Receive-side opcodes have the high bit set, as in ibverbs.
const (
	WCSend WCOpcode = iota
	WCRDMAWrite
	WCRDMARead
	WCCompSwap
	WCFetchAdd
	WCBindMW
	WCLocalInv
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// CompletionOpcode returns the completion opcode a requester reports for a
// send work request of opcode o.
func (o Opcode) CompletionOpcode() WCOpcode {
	switch o {
	case OpRDMAWrite, OpRDMAWriteWithImm:
		return WCRDMAWrite
	case OpRDMARead:
		return WCRDMARead
	case OpAtomicCmpAndSwp:
		return WCCompSwap
	case OpAtomicFetchAndAdd:
		return WCFetchAdd
	case OpLocalInv:
		return WCLocalInv
	case OpBindMW:
		return WCBindMW
	}
	return WCSend
}

// WCFlags qualify a completion (enum ibv_wc_flags).
type WCFlags uint8

// Completion flags.
const (
	WCWithImm   WCFlags = 1 << 1 // Imm is valid
	WCWithInv   WCFlags = 1 << 3 // InvalidatedRKey is valid
	WCSolicited WCFlags = 1 << 4 // the message carried the solicited event indication
)

// WorkCompletion reports the outcome of a work request (struct ibv_wc).
// On an error status only WRID, Status, QPNum and VendorErr are meaningful.
type WorkCompletion struct {
	WRID            uint64
	Status          WCStatus
	Opcode          WCOpcode
	Flags           WCFlags
	VendorErr       uint32
	ByteLen         uint32 // bytes received (receives) or read (RDMA Read)
	Imm             uint32 // immediate data when Flags has WCWithImm: the sender's SendWR.Imm, whatever either host's byte order
	InvalidatedRKey uint32 // when Flags has WCWithInv
	QPNum           uint32 // the local QP the work request was posted to
	SrcQP           uint32 // the remote QP (receives)
}

// QPType is the transport service of a queue pair. Only RC is implemented.
type QPType uint8

// QP types.
const (
	QPTypeRC QPType = 2 // reliable connected (IBV_QPT_RC)
)

// QPState is the state of a queue pair (enum ibv_qp_state).
type QPState uint8

// QP states.
const (
	QPSReset QPState = iota
	QPSInit
	QPSRTR
	QPSRTS
	QPSSQD
	QPSSQE
	QPSErr
	numQPStates
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if s < numQPStates {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// MTU is a path MTU (enum ibv_mtu).
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (0 for an invalid value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// RNRTimer is the encoded minimum RNR NAK timer of InfiniBand (5 bits):
// how long a requester waits before retrying a Send that found no posted
// receive. 0 means 655.36 ms; 1 through 31 run from 0.01 ms to 491.52 ms.
type RNRTimer uint8

var rnrTimerMicros = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
	122880, 163840, 245760, 327680, 491520,
}

// Duration returns the delay the encoded timer stands for.
func (t RNRTimer) Duration() time.Duration {
	return time.Duration(rnrTimerMicros[t&31]) * time.Microsecond
}

// RNRRetryInfinite as RNRRetry retries a receiver-not-ready condition forever.
const RNRRetryInfinite = 7

// QPCap are the capacities of a queue pair (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPAttrMask says which fields of a QPAttr a Modify sets (enum ibv_qp_attr_mask).
type QPAttrMask uint32

// QP attribute mask bits.
const (
	QPAttrState QPAttrMask = 1 << iota
	QPAttrCurState
	QPAttrAccessFlags
	QPAttrPort
	QPAttrPathMTU
	QPAttrDestQPN
	QPAttrRQPSN
	QPAttrSQPSN
	QPAttrMaxQPRdAtomic
	QPAttrMaxDestRdAtomic
	QPAttrMinRNRTimer
	QPAttrTimeout
	QPAttrRetryCnt
	QPAttrRNRRetry
	QPAttrCap
	numQPAttrs = iota
)

var qpAttrNames = [numQPAttrs]string{
	"QPAttrState", "QPAttrCurState", "QPAttrAccessFlags", "QPAttrPort", "QPAttrPathMTU",
	"QPAttrDestQPN", "QPAttrRQPSN", "QPAttrSQPSN", "QPAttrMaxQPRdAtomic", "QPAttrMaxDestRdAtomic",
	"QPAttrMinRNRTimer", "QPAttrTimeout", "QPAttrRetryCnt", "QPAttrRNRRetry", "QPAttrCap",
}

// String names the bits of m as the constants that set them, joined by
// "|" (QPAttrPort|QPAttrAccessFlags); unknown bits are shown in hex.
func (m QPAttrMask) String() string { return bitNames(uint32(m), qpAttrNames[:], "0") }

// QPAttr are the modifiable attributes of a queue pair (struct ibv_qp_attr).
type QPAttr struct {
	State    QPState
	CurState QPState
	// AccessFlags are the remote operations the QP's responder accepts
	// (AccessRemoteWrite, AccessRemoteRead, AccessRemoteAtomic).
	AccessFlags AccessFlags
	Port        uint8
	PathMTU     MTU
	// DestQPNum names the remote QP. Providers whose connections are made
	// by cm fill it in; loop uses it to find the peer.
	DestQPNum uint32
	RQPSN     uint32
	SQPSN     uint32
	// MaxRdAtomic is the number of RDMA Reads and atomics this QP may have
	// outstanding as a requester (ORD); MaxDestRdAtomic the number it
	// accepts as a responder (IRD).
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	MinRNRTimer     RNRTimer
	// Timeout is the encoded local ACK timeout (4.096 µs × 2^Timeout).
	Timeout  uint8
	RetryCnt uint8
	// RNRRetry is how many times a Send that met no posted receive is
	// retried; RNRRetryInfinite retries forever.
	RNRRetry uint8
	Cap      QPCap
}

// AtomicCap says how RDMA atomics are atomic (enum ibv_atomic_cap).
type AtomicCap uint8

// Atomic capabilities.
const (
	AtomicNone AtomicCap = iota // no atomics
	AtomicHCA                   // atomic with respect to other RDMA atomics on the device
	AtomicGlob                  // atomic also with respect to CPU atomics
)

// DeviceCaps are the optional features a device supports. The conformance
// suite tests the declared behaviour of whatever is absent.
type DeviceCaps uint32

// Device capability bits.
const (
	// CapRNRRetry: a Send that finds no posted receive is retried per the
	// QP's RNR timer and retry count. Without it (iWARP) such a Send ends
	// the connection: both QPs move to the error state.
	CapRNRRetry DeviceCaps = 1 << iota
	// CapSRQ: shared receive queues.
	CapSRQ
	// CapImmData: Send and RDMA Write with immediate data.
	CapImmData
	// CapAtomics: RDMA atomics (see DeviceAttr.AtomicCap).
	CapAtomics
	// CapMemoryWindows: memory windows of type 1 and type 2 (PD.AllocMW,
	// OpBindMW, OpLocalInv, OpSendWithInv). loop0, shm0 and tcp0 declare
	// it, and so does the ibverbs provider on devices that have both types
	// (rxe does, siw does not).
	CapMemoryWindows
	// CapCrossProcess: the two ends of a connection may live in different
	// processes.
	CapCrossProcess
	// CapAckedCompletion: a Send or RDMA Write completes only once the
	// responder has taken it, so an error the responder finds (a receive
	// too small, a bad rkey, a missing right) completes the WR itself with
	// the remote error. InfiniBand and RoCE devices (rxe, mlx5) and loop0,
	// shm0 and tcp0 declare it. siw does not: it completes Sends and
	// Writes once they are on the wire, and the responder's error reaches
	// the requester as a Terminate that moves its QP to the error state
	// after the WR has completed successfully.
	CapAckedCompletion
	// CapModifyConnect: a QP is connected by Modify alone. A new QP is in
	// Reset; Reset→Init→RTR→RTS takes exactly the attributes of the table
	// in ibv_modify_qp(3), DestQPNum naming the peer; an illegal
	// transition is refused with ErrInvalidState and a missing or
	// superfluous attribute with ErrInvalidArg. loop0, shm0 and tcp0
	// declare it. rdma-core devices do not: siw reports a new QP as Init
	// and refuses RTS without a connected socket, rxe and mlx5 need an
	// address vector for RTR, and the kernel answers both kinds of
	// refusal with the same EINVAL.
	CapModifyConnect
	// CapRecvNoSGE: a receive with no SGE is taken; it receives
	// zero-length Sends and RDMA Writes with immediate. libsiw refuses
	// such receives at post time.
	CapRecvNoSGE
	// CapSQD: RTS→SQD drains the send queue and raises EventSQDrained.
	// mlx5 has no RTS→SQD.
	CapSQD
	// CapAtomicResultSGList: an atomic's result may be scattered over
	// several SGEs that total 8 bytes, in order. The verbs leave it to the
	// device: mlx5 writes 8 bytes into each SGE.
	CapAtomicResultSGList
	// CapQPErrorEvents: a QP that fails raises the affiliated
	// asynchronous error of the IB specification on its own device: a
	// responder that refuses a request EventQPAccessErr for a remote
	// access it may not grant (a bad rkey, a missing right) and
	// EventQPReqErr for an invalid request (a message longer than the
	// receive); a QP that moves to the error state for a cause no
	// completion of its own reports (its CQ overran) EventQPFatal. loop0,
	// shm0 and tcp0 declare it; rdma-core's devices are to be checked one
	// by one before the ibverbs provider declares it for them.
	CapQPErrorEvents
	// CapTransportRetry: requests travel over a transport the peer must
	// answer; one left unanswered (the peer's process stopped, its link
	// cut) is retried per the QP's Timeout and RetryCnt and then
	// completes with WCRetryExcErr, the QP moving to the error state.
	// InfiniBand and RoCE devices (rxe, mlx5) and tcp0 declare it (tcp0
	// gives a request at least 4 s: TCP_USER_TIMEOUT and its own watch
	// of unanswered requests). siw leaves it to TCP. shm0 and loop0 have
	// no such transport: the requester moves the data itself, so a
	// stopped peer process stops no operation.
	CapTransportRetry
	// CapCommEstEvent: a QP in RTR raises EventCommEst when the first
	// request of its peer reaches it (the IB specification's
	// communication established event; rdma_notify(3) takes it), once,
	// whether the request is a Send, an RDMA Write, a Read or an atomic,
	// and a QP connected straight to RTS raises none; and a connection
	// manager's Accept leaves a QP in RTR when asked (cm.Param.HoldRTR).
	// loop0, shm0 and tcp0 declare it. Of rdma-core's devices mlx5 and
	// the rdmavt ones (hfi1, qib) raise the event, rxe and siw do not,
	// and the ibverbs provider's Accept cannot hold a QP in RTR: it
	// declares it for no device.
	CapCommEstEvent
)

// DeviceAttr are a device's limits and capabilities (struct ibv_device_attr).
type DeviceAttr struct {
	Name            string
	Transport       string // "loop", "shm", "iwarp", "ib"
	FWVersion       string
	MaxMRSize       uint64
	MaxQP           int
	MaxQPWR         int // per queue
	MaxSGE          int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int // outstanding Reads/atomics a QP accepts as responder (IRD)
	MaxQPInitRdAtom int // outstanding Reads/atomics a QP may initiate (ORD)
	MaxSRQ          int
	MaxSRQWR        int
	MaxSRQSGE       int
	MaxInlineData   int
	MaxMsgSize      uint64
	MaxPrivateData  int // connection private data cm carries
	AtomicCap       AtomicCap
	Caps            DeviceCaps

	// PhysPortCnt is the number of the device's ports, numbered from 1:
	// the values QPAttr.Port may take (0 counts as 1). goverbs' own
	// devices have one.
	PhysPortCnt int
}

// Has reports whether the device declares every capability in c.
func (a DeviceAttr) Has(c DeviceCaps) bool { return a.Caps&c == c }

// EventType is the kind of an asynchronous event (enum ibv_event_type).
type EventType uint8

// Asynchronous event types.
const (
	EventCQErr            EventType = iota // a CQ overran; Element is the CQ
	EventQPFatal                           // a QP moved to the error state on its own; Element is the QP
	EventQPReqErr                          // invalid request on a QP
	EventQPAccessErr                       // remote access error on a QP's responder
	EventCommEst                           // a QP in RTR took its peer's first request; Element is the QP
	EventSQDrained                         // a QP moved to SQD has finished the WRs under way; Element is the QP
	EventPathMig                           // path migrated (unused)
	EventPathMigErr                        // path migration failed (unused)
	EventDeviceFatal                       // the device failed
	EventPortActive                        // port active
	EventPortErr                           // port error
	EventLIDChange                         // LID change
	EventPKeyChange                        // P_Key change
	EventSMChange                          // SM change
	EventSRQErr                            // an SRQ failed; Element is the SRQ
	EventSRQLimitReached                   // an armed SRQ fell below its limit; Element is the SRQ
	EventQPLastWQEReached                  // a QP on an SRQ moved to the error state takes no more of its receives; Element is the QP
)

var eventNames = [...]string{
	"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
	"local access violation work queue error", "communication established", "send queue drained",
	"path migrated", "path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached",
}

func (e EventType) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", uint8(e))
}

// AsyncEvent is an asynchronous event (struct ibv_async_event). Element is
// the user context given when the object it concerns was created; the verbs
// package sets it to the *verbs.QP, *verbs.CQ or *verbs.SRQ.
type AsyncEvent struct {
	Type    EventType
	Element any
}

func (a AtomicCap) String() string {
	switch a {
	case AtomicNone:
		return "none"
	case AtomicHCA:
		return "HCA"
	case AtomicGlob:
		return "global"
	}
	return fmt.Sprintf("AtomicCap(%d)", uint8(a))
}

var capNames = []string{"RNRRetry", "SRQ", "ImmData", "Atomics", "MemoryWindows", "CrossProcess",
	"AckedCompletion", "ModifyConnect", "RecvNoSGE", "SQD", "AtomicResultSGList", "QPErrorEvents", "TransportRetry",
	"CommEstEvent"}

func (c DeviceCaps) String() string { return bitNames(uint32(c), capNames, "none") }
