package verbs

import "github.com/goverbs/goverbs/verbs/driver"

// The value types of the verbs API are defined in package driver, so that
// providers and applications share them without conversion (driver cannot
// import verbs, which imports it); these aliases are the names
// applications use. Their documentation, struct fields included, is
// driver's, copied here so that go doc shows it on these names: after a
// change in driver, run go test ./verbs -run TestAliasDocs -update.

// AccessFlags are the rights granted on a memory region (and, for a QP, the
// remote operations its responder accepts). They mirror enum ibv_access_flags.
type AccessFlags = driver.AccessFlags

// Access flags (enum ibv_access_flags).
const (
	AccessLocalWrite   = driver.AccessLocalWrite   // the local HCA may write the region (receives, Read results)
	AccessRemoteWrite  = driver.AccessRemoteWrite  // peers may RDMA Write into the region
	AccessRemoteRead   = driver.AccessRemoteRead   // peers may RDMA Read from the region
	AccessRemoteAtomic = driver.AccessRemoteAtomic // peers may run atomics on the region
	AccessMWBind       = driver.AccessMWBind       // memory windows may be bound to the region
	RemoteAccess       = driver.RemoteAccess
)

// Opcode is the operation of a send work request (enum ibv_wr_opcode).
type Opcode = driver.Opcode

// Send work request opcodes (enum ibv_wr_opcode).
const (
	OpRDMAWrite         = driver.OpRDMAWrite
	OpRDMAWriteWithImm  = driver.OpRDMAWriteWithImm
	OpSend              = driver.OpSend
	OpSendWithImm       = driver.OpSendWithImm
	OpRDMARead          = driver.OpRDMARead
	OpAtomicCmpAndSwp   = driver.OpAtomicCmpAndSwp
	OpAtomicFetchAndAdd = driver.OpAtomicFetchAndAdd
	OpLocalInv          = driver.OpLocalInv
	OpBindMW            = driver.OpBindMW
	OpSendWithInv       = driver.OpSendWithInv
)

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags = driver.SendFlags

// Send flags (enum ibv_send_flags).
const (
	// SendFence makes the WR wait until every prior RDMA Read and atomic on
	// the same QP has completed.
	SendFence = driver.SendFence
	// SendSignaled asks for a completion even when the QP was created
	// without SigAll.
	SendSignaled = driver.SendSignaled
	// SendSolicited sets the solicited event indication on a Send or a
	// Write with immediate.
	SendSolicited = driver.SendSolicited
	// SendInline copies the payload at post time: the buffers may be reused
	// as soon as PostSend returns, and their lkeys are not checked.
	SendInline = driver.SendInline
)

// SGE is one element of a scatter/gather list: Length bytes at virtual
// address Addr inside the memory region whose local key is LKey.
//
//	type SGE struct {
//		Addr   uint64
//		Length uint32
//		LKey   uint32
//	}
type SGE = driver.SGE

// SendWR is a send work request (struct ibv_send_wr). Fields that do not
// apply to the opcode are ignored.
//
//	type SendWR struct {
//		WRID   uint64
//		SGList []SGE
//		Opcode Opcode
//		Flags  SendFlags
//		// Imm is the immediate data of OpSendWithImm and OpRDMAWriteWithImm,
//		// a number: it crosses the wire in network byte order, and the
//		// receiver's WorkCompletion.Imm is the same number (a C peer reads it
//		// as ntohl(wc.imm_data), and its htonl(x) arrives here as x).
//		Imm uint32
//		// InvalidateRKey is the rkey invalidated by OpSendWithInv (at the
//		// peer) and OpLocalInv (locally): a type 2 memory window's.
//		InvalidateRKey uint32
//		// Bind is the binding OpBindMW makes.
//		Bind MWBind
//		// RemoteAddr and RKey name the remote memory of RDMA and atomic
//		// operations.
//		RemoteAddr uint64
//		RKey       uint32
//		// CompareAdd is the value compared by OpAtomicCmpAndSwp, or added by
//		// OpAtomicFetchAndAdd; Swap is the value swapped in on a match.
//		CompareAdd uint64
//		Swap       uint64
//	}
type SendWR = driver.SendWR

// RecvWR is a receive work request (struct ibv_recv_wr).
//
//	type RecvWR struct {
//		WRID   uint64
//		SGList []SGE
//	}
type RecvWR = driver.RecvWR

// WorkCompletion reports the outcome of a work request (struct ibv_wc).
// On an error status only WRID, Status, QPNum and VendorErr are meaningful.
//
//	type WorkCompletion struct {
//		WRID            uint64
//		Status          WCStatus
//		Opcode          WCOpcode
//		Flags           WCFlags
//		VendorErr       uint32
//		ByteLen         uint32 // bytes received (receives) or read (RDMA Read)
//		Imm             uint32 // immediate data when Flags has WCWithImm: the sender's SendWR.Imm, whatever either host's byte order
//		InvalidatedRKey uint32 // when Flags has WCWithInv
//		QPNum           uint32 // the local QP the work request was posted to
//		SrcQP           uint32 // the remote QP (receives)
//	}
type WorkCompletion = driver.WorkCompletion

// WCStatus is the status of a work completion (enum ibv_wc_status); the
// numeric values are those of ibverbs.
type WCStatus = driver.WCStatus

// Completion statuses (enum ibv_wc_status).
const (
	WCSuccess        = driver.WCSuccess        // the operation completed successfully
	WCLocLenErr      = driver.WCLocLenErr      // local length error: a receive buffer was too small or a message too long
	WCLocQPOpErr     = driver.WCLocQPOpErr     // local QP operation error: an internal consistency error or a malformed WR
	WCLocEECOpErr    = driver.WCLocEECOpErr    // local EE context operation error (unused on RC)
	WCLocProtErr     = driver.WCLocProtErr     // local protection error: a bad lkey or an address outside the region
	WCWRFlushErr     = driver.WCWRFlushErr     // work request flushed because the QP is in the error state
	WCMWBindErr      = driver.WCMWBindErr      // memory window bind error
	WCBadRespErr     = driver.WCBadRespErr     // bad response from the responder
	WCLocAccessErr   = driver.WCLocAccessErr   // local access error
	WCRemInvReqErr   = driver.WCRemInvReqErr   // remote invalid request: the responder found the request invalid (too long for its buffer, misaligned atomic, unsupported op)
	WCRemAccessErr   = driver.WCRemAccessErr   // remote access error: bad rkey, out of bounds, or missing rights
	WCRemOpErr       = driver.WCRemOpErr       // remote operation error: the responder failed to complete the operation
	WCRetryExcErr    = driver.WCRetryExcErr    // transport retry counter exceeded: the peer is unreachable or gone
	WCRNRRetryExcErr = driver.WCRNRRetryExcErr // RNR retry counter exceeded: the peer posted no receive in time
	WCLocRDDViolErr  = driver.WCLocRDDViolErr  // local RDD violation (unused on RC)
	WCRemInvRDReqErr = driver.WCRemInvRDReqErr // remote invalid RD request (unused on RC)
	WCRemAbortErr    = driver.WCRemAbortErr    // remote aborted
	WCInvEECNErr     = driver.WCInvEECNErr     // invalid EE context number (unused on RC)
	WCInvEECStateErr = driver.WCInvEECStateErr // invalid EE context state (unused on RC)
	WCFatalErr       = driver.WCFatalErr       // fatal error
	WCRespTimeoutErr = driver.WCRespTimeoutErr // response timeout
	WCGeneralErr     = driver.WCGeneralErr     // general error
)

// WCOpcode is the kind of operation a completion reports (enum ibv_wc_opcode).
type WCOpcode = driver.WCOpcode

// Completion opcodes (enum ibv_wc_opcode).
const (
	WCSend            = driver.WCSend
	WCRDMAWrite       = driver.WCRDMAWrite
	WCRDMARead        = driver.WCRDMARead
	WCCompSwap        = driver.WCCompSwap
	WCFetchAdd        = driver.WCFetchAdd
	WCBindMW          = driver.WCBindMW
	WCLocalInv        = driver.WCLocalInv
	WCRecv            = driver.WCRecv
	WCRecvRDMAWithImm = driver.WCRecvRDMAWithImm
)

// WCFlags qualify a completion (enum ibv_wc_flags).
type WCFlags = driver.WCFlags

// Completion flags (enum ibv_wc_flags).
const (
	WCWithImm   = driver.WCWithImm   // Imm is valid
	WCWithInv   = driver.WCWithInv   // InvalidatedRKey is valid
	WCSolicited = driver.WCSolicited // the message carried the solicited event indication
)

// QPType is the transport service of a queue pair. Only RC is implemented.
type QPType = driver.QPType

// QPTypeRC is the reliable connected service, the only one implemented.
const QPTypeRC = driver.QPTypeRC

// QPState is the state of a queue pair (enum ibv_qp_state).
type QPState = driver.QPState

// QP states (enum ibv_qp_state).
const (
	QPSReset = driver.QPSReset
	QPSInit  = driver.QPSInit
	QPSRTR   = driver.QPSRTR
	QPSRTS   = driver.QPSRTS
	QPSSQD   = driver.QPSSQD
	QPSSQE   = driver.QPSSQE
	QPSErr   = driver.QPSErr
)

// MTU is a path MTU (enum ibv_mtu).
type MTU = driver.MTU

// Path MTUs (enum ibv_mtu).
const (
	MTU256  = driver.MTU256
	MTU512  = driver.MTU512
	MTU1024 = driver.MTU1024
	MTU2048 = driver.MTU2048
	MTU4096 = driver.MTU4096
)

// RNRTimer is the encoded minimum RNR NAK timer of InfiniBand (5 bits):
// how long a requester waits before retrying a Send that found no posted
// receive. 0 means 655.36 ms; 1 through 31 run from 0.01 ms to 491.52 ms.
type RNRTimer = driver.RNRTimer

// RNRRetryInfinite as QPAttr.RNRRetry retries receiver-not-ready forever.
const RNRRetryInfinite = driver.RNRRetryInfinite

// QPCap are the capacities of a queue pair (struct ibv_qp_cap).
//
//	type QPCap struct {
//		MaxSendWR     uint32
//		MaxRecvWR     uint32
//		MaxSendSGE    uint32
//		MaxRecvSGE    uint32
//		MaxInlineData uint32
//	}
type QPCap = driver.QPCap

// QPAttr are the modifiable attributes of a queue pair (struct ibv_qp_attr).
//
//	type QPAttr struct {
//		State    QPState
//		CurState QPState
//		// AccessFlags are the remote operations the QP's responder accepts
//		// (AccessRemoteWrite, AccessRemoteRead, AccessRemoteAtomic).
//		AccessFlags AccessFlags
//		Port        uint8
//		PathMTU     MTU
//		// DestQPNum names the remote QP. Providers whose connections are made
//		// by cm fill it in; loop uses it to find the peer.
//		DestQPNum uint32
//		RQPSN     uint32
//		SQPSN     uint32
//		// MaxRdAtomic is the number of RDMA Reads and atomics this QP may have
//		// outstanding as a requester (ORD); MaxDestRdAtomic the number it
//		// accepts as a responder (IRD).
//		MaxRdAtomic     uint8
//		MaxDestRdAtomic uint8
//		MinRNRTimer     RNRTimer
//		// Timeout is the encoded local ACK timeout (4.096 µs × 2^Timeout).
//		Timeout  uint8
//		RetryCnt uint8
//		// RNRRetry is how many times a Send that met no posted receive is
//		// retried; RNRRetryInfinite retries forever.
//		RNRRetry uint8
//		Cap      QPCap
//	}
type QPAttr = driver.QPAttr

// QPAttrMask says which fields of a QPAttr a Modify sets (enum ibv_qp_attr_mask).
type QPAttrMask = driver.QPAttrMask

// QP attribute mask bits (enum ibv_qp_attr_mask).
const (
	QPAttrState           = driver.QPAttrState
	QPAttrCurState        = driver.QPAttrCurState
	QPAttrAccessFlags     = driver.QPAttrAccessFlags
	QPAttrPort            = driver.QPAttrPort
	QPAttrPathMTU         = driver.QPAttrPathMTU
	QPAttrDestQPN         = driver.QPAttrDestQPN
	QPAttrRQPSN           = driver.QPAttrRQPSN
	QPAttrSQPSN           = driver.QPAttrSQPSN
	QPAttrMaxQPRdAtomic   = driver.QPAttrMaxQPRdAtomic
	QPAttrMaxDestRdAtomic = driver.QPAttrMaxDestRdAtomic
	QPAttrMinRNRTimer     = driver.QPAttrMinRNRTimer
	QPAttrTimeout         = driver.QPAttrTimeout
	QPAttrRetryCnt        = driver.QPAttrRetryCnt
	QPAttrRNRRetry        = driver.QPAttrRNRRetry
	QPAttrCap             = driver.QPAttrCap
)

// SRQAttr are an SRQ's attributes (struct ibv_srq_attr).
//
//	type SRQAttr struct {
//		MaxWR  uint32
//		MaxSGE uint32
//		// Limit: when the number of posted receives falls below Limit, the
//		// SRQ raises EventSRQLimitReached once and disarms (Limit reads 0).
//		Limit uint32
//	}
type SRQAttr = driver.SRQAttr

// SRQAttrMask says which SRQAttr fields Modify sets.
type SRQAttrMask = driver.SRQAttrMask

// SRQ attribute mask bits.
const (
	SRQAttrMaxWR = driver.SRQAttrMaxWR // resize (not supported by every provider)
	SRQAttrLimit = driver.SRQAttrLimit // arm the limit event
)

// AtomicCap says how RDMA atomics are atomic (enum ibv_atomic_cap).
type AtomicCap = driver.AtomicCap

// Atomic capabilities (enum ibv_atomic_cap).
const (
	AtomicNone = driver.AtomicNone // no atomics
	AtomicHCA  = driver.AtomicHCA  // atomic with respect to other RDMA atomics on the device
	AtomicGlob = driver.AtomicGlob // atomic also with respect to CPU atomics
)

// DeviceCaps are the optional features a device supports. The conformance
// suite tests the declared behaviour of whatever is absent.
type DeviceCaps = driver.DeviceCaps

// Device capabilities.
const (
	// CapRNRRetry: a Send that finds no posted receive is retried per the
	// QP's RNR timer and retry count. Without it (iWARP) such a Send ends
	// the connection: both QPs move to the error state.
	CapRNRRetry = driver.CapRNRRetry
	// CapSRQ: shared receive queues.
	CapSRQ = driver.CapSRQ
	// CapImmData: Send and RDMA Write with immediate data.
	CapImmData = driver.CapImmData
	// CapAtomics: RDMA atomics (see DeviceAttr.AtomicCap).
	CapAtomics = driver.CapAtomics
	// CapMemoryWindows: memory windows of type 1 and type 2 (PD.AllocMW,
	// OpBindMW, OpLocalInv, OpSendWithInv). loop0, shm0 and tcp0 declare
	// it, and so does the ibverbs provider on devices that have both types
	// (rxe does, siw does not).
	CapMemoryWindows = driver.CapMemoryWindows
	// CapCrossProcess: the two ends of a connection may live in different
	// processes.
	CapCrossProcess = driver.CapCrossProcess
	// CapAckedCompletion: a Send or RDMA Write completes only once the
	// responder has taken it, so an error the responder finds (a receive
	// too small, a bad rkey, a missing right) completes the WR itself with
	// the remote error. InfiniBand and RoCE devices (rxe, mlx5) and loop0,
	// shm0 and tcp0 declare it. siw does not: it completes Sends and
	// Writes once they are on the wire, and the responder's error reaches
	// the requester as a Terminate that moves its QP to the error state
	// after the WR has completed successfully.
	CapAckedCompletion = driver.CapAckedCompletion
	// CapModifyConnect: a QP is connected by Modify alone. A new QP is in
	// Reset; Reset→Init→RTR→RTS takes exactly the attributes of the table
	// in ibv_modify_qp(3), DestQPNum naming the peer; an illegal
	// transition is refused with ErrInvalidState and a missing or
	// superfluous attribute with ErrInvalidArg. loop0, shm0 and tcp0
	// declare it. rdma-core devices do not: siw reports a new QP as Init
	// and refuses RTS without a connected socket, rxe and mlx5 need an
	// address vector for RTR, and the kernel answers both kinds of
	// refusal with the same EINVAL.
	CapModifyConnect = driver.CapModifyConnect
	// CapRecvNoSGE: a receive with no SGE is taken; it receives
	// zero-length Sends and RDMA Writes with immediate. libsiw refuses
	// such receives at post time.
	CapRecvNoSGE = driver.CapRecvNoSGE
	// CapSQD: RTS→SQD drains the send queue and raises EventSQDrained.
	// mlx5 has no RTS→SQD.
	CapSQD = driver.CapSQD
	// CapAtomicResultSGList: an atomic's result may be scattered over
	// several SGEs that total 8 bytes, in order. The verbs leave it to the
	// device: mlx5 writes 8 bytes into each SGE.
	CapAtomicResultSGList = driver.CapAtomicResultSGList
	// CapQPErrorEvents: a QP that fails raises the affiliated
	// asynchronous error of the IB specification on its own device: a
	// responder that refuses a request EventQPAccessErr for a remote
	// access it may not grant (a bad rkey, a missing right) and
	// EventQPReqErr for an invalid request (a message longer than the
	// receive); a QP that moves to the error state for a cause no
	// completion of its own reports (its CQ overran) EventQPFatal. loop0,
	// shm0 and tcp0 declare it; rdma-core's devices are to be checked one
	// by one before the ibverbs provider declares it for them.
	CapQPErrorEvents = driver.CapQPErrorEvents
	// CapTransportRetry: requests travel over a transport the peer must
	// answer; one left unanswered (the peer's process stopped, its link
	// cut) is retried per the QP's Timeout and RetryCnt and then
	// completes with WCRetryExcErr, the QP moving to the error state.
	// InfiniBand and RoCE devices (rxe, mlx5) and tcp0 declare it (tcp0
	// gives a request at least 4 s: TCP_USER_TIMEOUT and its own watch
	// of unanswered requests). siw leaves it to TCP. shm0 and loop0 have
	// no such transport: the requester moves the data itself, so a
	// stopped peer process stops no operation.
	CapTransportRetry = driver.CapTransportRetry
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
	CapCommEstEvent = driver.CapCommEstEvent
)

// DeviceAttr are a device's limits and capabilities (struct ibv_device_attr).
//
//	type DeviceAttr struct {
//		Name            string
//		Transport       string // "loop", "shm", "iwarp", "ib"
//		FWVersion       string
//		MaxMRSize       uint64
//		MaxQP           int
//		MaxQPWR         int // per queue
//		MaxSGE          int
//		MaxCQ           int
//		MaxCQE          int
//		MaxMR           int
//		MaxPD           int
//		MaxQPRdAtom     int // outstanding Reads/atomics a QP accepts as responder (IRD)
//		MaxQPInitRdAtom int // outstanding Reads/atomics a QP may initiate (ORD)
//		MaxSRQ          int
//		MaxSRQWR        int
//		MaxSRQSGE       int
//		MaxInlineData   int
//		MaxMsgSize      uint64
//		MaxPrivateData  int // connection private data cm carries
//		AtomicCap       AtomicCap
//		Caps            DeviceCaps
//
//		// PhysPortCnt is the number of the device's ports, numbered from 1:
//		// the values QPAttr.Port may take (0 counts as 1). goverbs' own
//		// devices have one.
//		PhysPortCnt int
//	}
type DeviceAttr = driver.DeviceAttr

// DeviceInfo names a device a driver offers.
//
//	type DeviceInfo struct {
//		Name      string // device name, e.g. "loop0"
//		Provider  string // provider name, e.g. "loop"
//		Transport string // "loop", "shm", "iwarp"
//		GUID      uint64
//	}
type DeviceInfo = driver.DeviceInfo

// EventType is the kind of an asynchronous event (enum ibv_event_type).
type EventType = driver.EventType

// Asynchronous event types (enum ibv_event_type).
const (
	EventCQErr            = driver.EventCQErr            // a CQ overran; Element is the CQ
	EventQPFatal          = driver.EventQPFatal          // a QP moved to the error state on its own; Element is the QP
	EventQPReqErr         = driver.EventQPReqErr         // invalid request on a QP
	EventQPAccessErr      = driver.EventQPAccessErr      // remote access error on a QP's responder
	EventCommEst          = driver.EventCommEst          // a QP in RTR took its peer's first request; Element is the QP
	EventSQDrained        = driver.EventSQDrained        // a QP moved to SQD has finished the WRs under way; Element is the QP
	EventDeviceFatal      = driver.EventDeviceFatal      // the device failed
	EventSRQErr           = driver.EventSRQErr           // an SRQ failed; Element is the SRQ
	EventSRQLimitReached  = driver.EventSRQLimitReached  // an armed SRQ fell below its limit; Element is the SRQ
	EventQPLastWQEReached = driver.EventQPLastWQEReached // a QP on an SRQ moved to the error state takes no more of its receives; Element is the QP
)

// AsyncEvent is an asynchronous event (struct ibv_async_event). Element is
// the user context given when the object it concerns was created; the verbs
// package sets it to the *verbs.QP, *verbs.CQ or *verbs.SRQ.
//
//	type AsyncEvent struct {
//		Type    EventType
//		Element any
//	}
type AsyncEvent = driver.AsyncEvent

// Errors returned by the verbs API; test them with errors.Is.
var (
	ErrNoDevice     = driver.ErrNoDevice
	ErrInvalidArg   = driver.ErrInvalidArg
	ErrUnsupported  = driver.ErrUnsupported
	ErrQueueFull    = driver.ErrQueueFull
	ErrInvalidState = driver.ErrInvalidState
	ErrBusy         = driver.ErrBusy
	ErrClosed       = driver.ErrClosed
	ErrCQOverrun    = driver.ErrCQOverrun
	ErrNoResources  = driver.ErrNoResources
)
