package verbs

import "github.com/goverbs/goverbs/verbs/driver"

// The value types of the verbs API are defined in package driver, so that
// providers and applications share them without conversion; these aliases
// are the names applications use.

// AccessFlags are the rights granted on a memory region or accepted by a QP.
type AccessFlags = driver.AccessFlags

// Access flags (enum ibv_access_flags).
const (
	AccessLocalWrite   = driver.AccessLocalWrite
	AccessRemoteWrite  = driver.AccessRemoteWrite
	AccessRemoteRead   = driver.AccessRemoteRead
	AccessRemoteAtomic = driver.AccessRemoteAtomic
	AccessMWBind       = driver.AccessMWBind
	RemoteAccess       = driver.RemoteAccess
)

// Opcode is the operation of a send work request.
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

// SendFlags modify a send work request.
type SendFlags = driver.SendFlags

// Send flags (enum ibv_send_flags).
const (
	SendFence     = driver.SendFence
	SendSignaled  = driver.SendSignaled
	SendSolicited = driver.SendSolicited
	SendInline    = driver.SendInline
)

// SGE is a scatter/gather element: Length bytes at Addr in the region of LKey.
type SGE = driver.SGE

// SendWR is a send work request.
type SendWR = driver.SendWR

// RecvWR is a receive work request.
type RecvWR = driver.RecvWR

// WorkCompletion reports the outcome of a work request.
type WorkCompletion = driver.WorkCompletion

// WCStatus is the status of a work completion.
type WCStatus = driver.WCStatus

// Completion statuses (enum ibv_wc_status).
const (
	WCSuccess        = driver.WCSuccess
	WCLocLenErr      = driver.WCLocLenErr
	WCLocQPOpErr     = driver.WCLocQPOpErr
	WCLocEECOpErr    = driver.WCLocEECOpErr
	WCLocProtErr     = driver.WCLocProtErr
	WCWRFlushErr     = driver.WCWRFlushErr
	WCMWBindErr      = driver.WCMWBindErr
	WCBadRespErr     = driver.WCBadRespErr
	WCLocAccessErr   = driver.WCLocAccessErr
	WCRemInvReqErr   = driver.WCRemInvReqErr
	WCRemAccessErr   = driver.WCRemAccessErr
	WCRemOpErr       = driver.WCRemOpErr
	WCRetryExcErr    = driver.WCRetryExcErr
	WCRNRRetryExcErr = driver.WCRNRRetryExcErr
	WCLocRDDViolErr  = driver.WCLocRDDViolErr
	WCRemInvRDReqErr = driver.WCRemInvRDReqErr
	WCRemAbortErr    = driver.WCRemAbortErr
	WCInvEECNErr     = driver.WCInvEECNErr
	WCInvEECStateErr = driver.WCInvEECStateErr
	WCFatalErr       = driver.WCFatalErr
	WCRespTimeoutErr = driver.WCRespTimeoutErr
	WCGeneralErr     = driver.WCGeneralErr
)

// WCOpcode is the kind of operation a completion reports.
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

// WCFlags qualify a completion.
type WCFlags = driver.WCFlags

// Completion flags (enum ibv_wc_flags).
const (
	WCWithImm   = driver.WCWithImm
	WCWithInv   = driver.WCWithInv
	WCSolicited = driver.WCSolicited
)

// QPType is the transport service of a QP.
type QPType = driver.QPType

// QPTypeRC is the reliable connected service, the only one implemented.
const QPTypeRC = driver.QPTypeRC

// QPState is the state of a queue pair.
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

// MTU is a path MTU.
type MTU = driver.MTU

// Path MTUs (enum ibv_mtu).
const (
	MTU256  = driver.MTU256
	MTU512  = driver.MTU512
	MTU1024 = driver.MTU1024
	MTU2048 = driver.MTU2048
	MTU4096 = driver.MTU4096
)

// RNRTimer is the encoded minimum RNR NAK timer.
type RNRTimer = driver.RNRTimer

// RNRRetryInfinite as QPAttr.RNRRetry retries receiver-not-ready forever.
const RNRRetryInfinite = driver.RNRRetryInfinite

// QPCap are the capacities of a queue pair.
type QPCap = driver.QPCap

// QPAttr are the modifiable attributes of a queue pair.
type QPAttr = driver.QPAttr

// QPAttrMask says which QPAttr fields Modify sets.
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

// SRQAttr are a shared receive queue's attributes.
type SRQAttr = driver.SRQAttr

// SRQAttrMask says which SRQAttr fields Modify sets.
type SRQAttrMask = driver.SRQAttrMask

// SRQ attribute mask bits.
const (
	SRQAttrMaxWR = driver.SRQAttrMaxWR
	SRQAttrLimit = driver.SRQAttrLimit
)

// AtomicCap says how RDMA atomics are atomic.
type AtomicCap = driver.AtomicCap

// Atomic capabilities (enum ibv_atomic_cap).
const (
	AtomicNone = driver.AtomicNone
	AtomicHCA  = driver.AtomicHCA
	AtomicGlob = driver.AtomicGlob
)

// DeviceCaps are the optional features a device supports.
type DeviceCaps = driver.DeviceCaps

// Device capabilities.
const (
	CapRNRRetry      = driver.CapRNRRetry
	CapSRQ           = driver.CapSRQ
	CapImmData       = driver.CapImmData
	CapAtomics       = driver.CapAtomics
	CapMemoryWindows = driver.CapMemoryWindows
	CapCrossProcess  = driver.CapCrossProcess
	// See verbs/driver for what each of these declares and which devices
	// lack it.
	CapAckedCompletion    = driver.CapAckedCompletion
	CapModifyConnect      = driver.CapModifyConnect
	CapRecvNoSGE          = driver.CapRecvNoSGE
	CapSQD                = driver.CapSQD
	CapAtomicResultSGList = driver.CapAtomicResultSGList
	CapQPErrorEvents      = driver.CapQPErrorEvents
	CapTransportRetry     = driver.CapTransportRetry
)

// DeviceAttr are a device's limits and capabilities.
type DeviceAttr = driver.DeviceAttr

// DeviceInfo names an available device.
type DeviceInfo = driver.DeviceInfo

// EventType is the kind of an asynchronous event.
type EventType = driver.EventType

// Asynchronous event types (enum ibv_event_type).
const (
	EventCQErr            = driver.EventCQErr
	EventQPFatal          = driver.EventQPFatal
	EventQPReqErr         = driver.EventQPReqErr
	EventQPAccessErr      = driver.EventQPAccessErr
	EventCommEst          = driver.EventCommEst
	EventSQDrained        = driver.EventSQDrained
	EventDeviceFatal      = driver.EventDeviceFatal
	EventSRQErr           = driver.EventSRQErr
	EventSRQLimitReached  = driver.EventSRQLimitReached
	EventQPLastWQEReached = driver.EventQPLastWQEReached
)

// AsyncEvent is an asynchronous event; Element is the *QP, *CQ or *SRQ it
// concerns.
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
