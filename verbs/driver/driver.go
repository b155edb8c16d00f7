// Package driver is the contract between the verbs package and the
// providers that implement it, in the way database/sql/driver serves
// database/sql: applications import verbs; a provider implements these
// interfaces and registers itself with verbs.Register from its init.
//
// The data path (QP.PostSend, QP.PostRecv, SRQ.PostRecv, CQ.Poll) is one
// interface call from the verbs package into the provider. Implementations
// of those methods must not allocate and must be safe for concurrent use.
//
// Providers report errors with the sentinel errors of this package, wrapped
// with fmt.Errorf("...: %w", ...) where context helps; callers test them with
// errors.Is.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors shared by every provider.
var (
	ErrNoDevice     = errors.New("no such RDMA device: run `goverbs devices` to list them")
	ErrInvalidArg   = errors.New("invalid argument")
	ErrUnsupported  = errors.New("operation not supported by this device")
	ErrQueueFull    = errors.New("work queue full: poll completions before posting more")
	ErrInvalidState = errors.New("operation not allowed in the QP's current state")
	ErrBusy         = errors.New("resource still in use: destroy the objects that use it first")
	ErrClosed       = errors.New("object already destroyed or closed")
	ErrCQOverrun    = errors.New("completion queue overrun: completions were lost; make the CQ deeper or poll more often")
	ErrNoResources  = errors.New("device resource limit reached")
	ErrRefused      = errors.New("connection refused")
	ErrRejected     = errors.New("connection rejected by the peer")
	ErrDisconnected = errors.New("connection closed by the peer")
	ErrPrivateData  = errors.New("private data longer than the provider allows")
)

// DeviceInfo names a device a driver offers.
type DeviceInfo struct {
	Name      string // device name, e.g. "loop0"
	Provider  string // provider name, e.g. "loop"
	Transport string // "loop", "shm", "iwarp"
	GUID      uint64
}

// Driver is a provider. It lists its devices and opens them.
type Driver interface {
	Devices() []DeviceInfo
	Open(name string) (Context, error)
}

// Context is an open device (struct ibv_context).
type Context interface {
	QueryDevice() DeviceAttr
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least cqe
	// completions. userCtx is returned in the AsyncEvent of CQ events.
	CreateCQ(cqe int, userCtx any) (CQ, error)
	// Events delivers asynchronous events. The channel is never closed
	// while the context is open; events are dropped if nobody reads them
	// and the buffer is full.
	Events() <-chan AsyncEvent
	// Close releases the device and every resource created on it; QPs
	// still connected move their peers to the error state.
	Close() error
}

// PD is a protection domain (struct ibv_pd).
type PD interface {
	// AllocMR allocates size bytes of memory the provider chooses (the
	// fast path for remote access) and registers it.
	AllocMR(size int, access AccessFlags) (MR, error)
	// RegMR registers memory the caller owns. The caller must keep buf
	// alive and must not let it move (Go heap memory does not move).
	RegMR(buf []byte, access AccessFlags) (MR, error)
	CreateQP(attr QPInitAttr) (QP, error)
	CreateSRQ(attr SRQInitAttr) (SRQ, error)
	Dealloc() error
}

// MWAllocator is a PD that allocates memory windows; a device that
// declares CapMemoryWindows implements it.
type MWAllocator interface {
	// AllocMW allocates an unbound window of type typ (ibv_alloc_mw).
	AllocMW(typ MWType) (MW, error)
}

// MW is a memory window (struct ibv_mw).
type MW interface {
	// RKey is the window's current key: the one its latest completed
	// bind gave it.
	RKey() uint32
	Type() MWType
	// Dealloc frees the window; access through it fails from the
	// moment Dealloc returns.
	Dealloc() error
}

// MR is a registered memory region (struct ibv_mr).
type MR interface {
	LKey() uint32
	RKey() uint32
	// Addr is the virtual address of the first byte: the address peers
	// use with the rkey, and local SGEs use with the lkey.
	Addr() uint64
	Bytes() []byte
	Access() AccessFlags
	Dereg() error
}

// CQ is a completion queue (struct ibv_cq).
type CQ interface {
	// Poll moves up to len(wc) completions into wc and returns how many;
	// it never blocks and never allocates.
	Poll(wc []WorkCompletion) int
	// ReqNotify arms the CQ: the next completion (with solicitedOnly, the
	// next solicited or unsuccessful one) sends a token on Notify.
	ReqNotify(solicitedOnly bool) error
	// Notify is the completion channel: it receives a token each time an
	// armed CQ gets a completion. Its buffer holds one token.
	Notify() <-chan struct{}
	// Err reports a CQ overrun (ErrCQOverrun) once it has happened.
	Err() error
	Destroy() error
}

// Sizer is a CQ that holds more completions than were asked for, as
// ibverbs devices may round a CQ's size up (struct ibv_cq's cqe). It is
// optional: a CQ that does not implement it holds exactly as many as its
// CreateCQ asked for.
type Sizer interface {
	// CQE returns how many completions the CQ holds before it overruns.
	CQE() int
}

// Sleeper is a CQ that can put the calling thread itself to sleep until
// it is notified, which spares CQ.Wait the hand-off from a waiting
// goroutine through Notify (a thread woken, then a goroutine readied for
// another thread). It is optional.
type Sleeper interface {
	// Arm arms the CQ for its next completion, as ReqNotify(false) does
	// but without the Notify channel's token, and returns a ticket.
	Arm() (ticket uint32, err error)
	// Sleep blocks the calling thread until the CQ has been notified
	// since Arm returned ticket (at once if it has), the CQ is
	// destroyed, or d has passed (d < 0: no limit). It may return
	// early.
	Sleep(ticket uint32, d time.Duration)
}

// QPInitAttr are the creation attributes of a QP (struct ibv_qp_init_attr).
type QPInitAttr struct {
	Type   QPType
	SendCQ CQ
	RecvCQ CQ
	SRQ    SRQ // nil: the QP has its own receive queue
	Cap    QPCap
	// SigAll: every send WR produces a completion, SendSignaled or not.
	SigAll bool
	// UserCtx is returned as the Element of the QP's async events.
	UserCtx any
}

// QP is a queue pair (struct ibv_qp).
type QP interface {
	Num() uint32
	// PostSend posts wrs in order. It returns how many were posted; when
	// that is fewer than len(wrs), err says why wrs[n] was refused and
	// none after it was posted.
	PostSend(wrs []SendWR) (int, error)
	// PostRecv posts receive WRs in order, as PostSend does.
	PostRecv(wrs []RecvWR) (int, error)
	Modify(attr *QPAttr, mask QPAttrMask) error
	Query() (QPAttr, error)
	Destroy() error
}

// SRQInitAttr are the creation attributes of an SRQ (struct ibv_srq_init_attr).
type SRQInitAttr struct {
	MaxWR  uint32
	MaxSGE uint32
	// Limit arms the limit event at creation (0: unarmed).
	Limit uint32
	// UserCtx is returned as the Element of the SRQ's async events.
	UserCtx any
}

// SRQAttr are an SRQ's attributes (struct ibv_srq_attr).
type SRQAttr struct {
	MaxWR  uint32
	MaxSGE uint32
	// Limit: when the number of posted receives falls below Limit, the
	// SRQ raises EventSRQLimitReached once and disarms (Limit reads 0).
	Limit uint32
}

// SRQAttrMask says which SRQAttr fields Modify sets.
type SRQAttrMask uint32

// SRQ attribute mask bits.
const (
	SRQAttrMaxWR SRQAttrMask = 1 << iota // resize (not supported by every provider)
	SRQAttrLimit                         // arm the limit event
)

// SRQ is a shared receive queue (struct ibv_srq).
type SRQ interface {
	PostRecv(wrs []RecvWR) (int, error)
	Modify(attr SRQAttr, mask SRQAttrMask) error
	Query() (SRQAttr, error)
	Destroy() error
}

// ConnParam are the parameters of a connection request or reply (struct
// rdma_conn_param).
type ConnParam struct {
	PrivateData []byte
	// ResponderResources is the number of Reads/atomics this side accepts
	// (IRD); InitiatorDepth the number it will issue (ORD).
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	// MinRNRTimer is what the responder asks requesters to wait.
	MinRNRTimer RNRTimer
	// QPNum is the sender's QP number (filled in by the provider).
	QPNum uint32
	// HoldRTR, given to ConnRequest.Accept, leaves the QP in RTR once it
	// is connected: it takes the requester's requests, and the caller
	// moves it to RTS with Modify. Providers with CapCommEstEvent honour
	// it; package cm gives it to no other.
	HoldRTR bool
}

// ConnManager is implemented by drivers that set up connections for the cm
// package. Addresses are given without their scheme ("name" for
// "loop://name").
type ConnManager interface {
	// Schemes are the address schemes the driver serves ("loop").
	Schemes() []string
	// MaxPrivateData is the longest private data a request or reply carries.
	MaxPrivateData() int
	Listen(addr string) (Listener, error)
	// Dial connects qp (in Reset or Init) to a listener. On success the
	// QP is in RTS.
	Dial(ctx context.Context, addr string, qp QP, p ConnParam) (Conn, error)
}

// ListenConfig is what a listener is told beyond its address: who it
// trusts and how it treats peers that fail remote accesses. The zero
// value is the default of each field.
type ListenConfig struct {
	// Strikes is the number of failed remote accesses (a wrong key, a
	// range outside a region, a right the region or QP lacks) a peer
	// may make over connections accepted by this listener before its
	// connection requests are refused for a back-off period
	// (default 4). A peer is a remote IP address on tcp0.
	Strikes int
	// Backoff is the first refusal period (default 1 s); each later
	// refusal doubles it, up to MaxBackoff (default 1 h).
	Backoff, MaxBackoff time.Duration
	// TrustUIDs and TrustGIDs name the users and groups, besides the
	// listener's own user, whose processes a shm0 listener accepts
	// (checked with SO_PEERCRED). Other providers ignore them.
	TrustUIDs, TrustGIDs []uint32
}

// ConfigListener is implemented by connection managers whose listeners
// take a ListenConfig; cm.ListenWith uses it, and Listen is
// ListenConfig with the zero ListenConfig.
type ConfigListener interface {
	ListenConfig(addr string, cfg ListenConfig) (Listener, error)
}

// Listener accepts connection requests.
type Listener interface {
	// Accept waits for the next connection request.
	Accept(ctx context.Context) (ConnRequest, error)
	Close() error
	Addr() string
}

// ConnRequest is an incoming connection request.
type ConnRequest interface {
	// Param is what the dialling side asked for, private data included.
	Param() ConnParam
	// Accept connects qp (in Reset or Init) to the requester and moves
	// it to RTS, or leaves it in RTR if p.HoldRTR.
	Accept(qp QP, p ConnParam) (Conn, error)
	// Reject refuses the request, sending privateData to the requester.
	Reject(privateData []byte) error
}

// PeerNamer is implemented by connection requests whose provider can tell
// peers apart. Peer names the requester's side — on TCP its IP address,
// on a Unix socket its process, as the kernel knows it — so that a
// listener can bound what one peer holds.
type PeerNamer interface {
	Peer() string
}

// Conn is an established connection.
type Conn interface {
	// RemoteParam is what the peer sent: the reply for a dialled
	// connection, the request for an accepted one.
	RemoteParam() ConnParam
	// Done is closed when the connection ends, by either side or by the
	// peer's death; the QP is then in the error state.
	Done() <-chan struct{}
	// Close disconnects: the local QP moves to the error state and the
	// peer is told.
	Close() error
}

// RejectError is returned by a Dial that the listener rejected; it carries
// the rejection's private data.
type RejectError struct {
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("connection rejected by the peer (%d bytes of private data)", len(e.PrivateData))
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *RejectError) Unwrap() error { return ErrRejected }
