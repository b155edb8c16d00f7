// Package verbstest is the conformance suite of goverbs: the semantics every
// provider honours, stated as tests. A provider's own test calls Run with a
// Harness that says how to make two connected endpoints; the suite then
// runs every case as a named subtest.
//
// The two endpoints are A, always in the test's process, and B, which may
// live in another process (Harness.Remote): every case drives B only
// through the Endpoint interface, whose arguments and results are plain
// data. What a device lacks is declared in its DeviceAttr (for example no
// CapRNRRetry), and the suite then checks the declared behaviour instead.
//
// The suite asserts only what the verbs specification and rdma-core's man
// pages require: where they allow several outcomes (a misaligned atomic
// refused at post time or failed at the responder, queues larger than
// asked for) it accepts each, and where devices differ it asks the
// capability flags (CapAckedCompletion, CapModifyConnect, CapRecvNoSGE,
// CapSQD, CapAtomicResultSGList, CapQPErrorEvents, CapTransportRetry,
// CapCommEstEvent);
// the MemoryWindow cases run on devices with CapMemoryWindows and skip on
// the others.
// Run logs, per provider, the cases run, passed, failed and skipped, with
// the capability behind each skip.
//
// Not checked: EventSRQErr, which of goverbs' providers only shm0
// raises, for an SRQ whose shared ring a peer corrupted (provider/shm's
// own tests check it: no case can make a peer write shared memory);
// EventDeviceFatal, which no goverbs provider can be made to raise from a
// test; and the byte order of
// immediate data against a peer that is not goverbs (tcp0's capture test
// reads it from the raw stream; siw in the VM is still to be run).
package verbstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Harness tells the suite how to build endpoints for a provider.
type Harness struct {
	// Device is the device both endpoints open, e.g. "loop0".
	Device string
	// Addr returns a fresh cm listen address for one pair, e.g.
	// "loop://t-17". B listens there and A dials it.
	Addr func(t testing.TB) string
	// Remote, if set, starts B in another process and returns an
	// Endpoint that drives it; kill must end that process abruptly (as
	// SIGKILL does). If nil, B lives in the test's process.
	Remote func(t testing.TB, opts PairOptions, addr string) (b Endpoint, kill func(), err error)
	// Without are capabilities the suite treats the device as lacking,
	// though it declares them: it then accepts every outcome the verbs
	// allow a device without them. A provider runs the suite so to check
	// that the suite's lenient side passes a device that behaves
	// strictly.
	Without verbs.DeviceCaps
}

// PairOptions shape the endpoints of one pair.
type PairOptions struct {
	// QPs is the number of connected QP pairs (default 1); QP i of A is
	// connected to QP i of B.
	QPs int
	// Cap is each QP's capacity (default: 16 WRs, 4 SGEs, 64 inline bytes).
	Cap verbs.QPCap
	// CQDepth is the depth of each endpoint's send and receive CQs
	// (default 256).
	CQDepth int
	// SRQ gives B's QPs one shared receive queue of SRQWR entries instead
	// of their own receive queues.
	SRQ   bool
	SRQWR uint32
	// SigAll creates the QPs with every send WR signaled.
	SigAll bool
	// RNRRetry and MinRNRTimer are set on both sides (defaults 7 and 1).
	RNRRetry    uint8
	MinRNRTimer verbs.RNRTimer
	// RNRRetrySet says that a zero RNRRetry is meant, not the default.
	RNRRetrySet bool
	// HoldRTR has B accept its connections with cm's Param.HoldRTR: B's
	// QPs stay in RTR, taking A's requests, until the case moves them to
	// RTS (SetQPState). Only for devices with CapCommEstEvent.
	HoldRTR bool
	// Without are the capabilities Attr leaves out (Harness.Without).
	Without verbs.DeviceCaps
}

// Defaults fills in the zero fields of o.
func (o PairOptions) Defaults() PairOptions {
	if o.QPs == 0 {
		o.QPs = 1
	}
	if o.Cap.MaxSendWR == 0 {
		o.Cap.MaxSendWR = 16
	}
	if o.Cap.MaxRecvWR == 0 {
		o.Cap.MaxRecvWR = 16
	}
	if o.Cap.MaxSendSGE == 0 {
		o.Cap.MaxSendSGE = 4
	}
	if o.Cap.MaxRecvSGE == 0 {
		o.Cap.MaxRecvSGE = 4
	}
	if o.Cap.MaxInlineData == 0 {
		o.Cap.MaxInlineData = 64
	}
	if o.CQDepth == 0 {
		o.CQDepth = 256
	}
	if o.SRQ && o.SRQWR == 0 {
		o.SRQWR = 64
	}
	if !o.RNRRetrySet && o.RNRRetry == 0 {
		o.RNRRetry = 7
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = 1
	}
	return o
}

// Region is a registered memory region of an endpoint, with guard bytes
// (canaries) on both sides of it that no operation may change.
type Region struct {
	ID   int
	Addr uint64
	Len  int
	LKey uint32
	RKey uint32
}

// SGE returns the SGE for n bytes at offset off of the region.
func (r Region) SGE(off, n int) verbs.SGE {
	return verbs.SGE{Addr: r.Addr + uint64(off), Length: uint32(n), LKey: r.LKey}
}

// CQKind selects one of an endpoint's two completion queues.
type CQKind int

// The completion queues of an endpoint.
const (
	SendCQ CQKind = iota
	RecvCQ
)

// Endpoint is one side of a pair, driven by plain data so that it may live
// in another process.
type Endpoint interface {
	// Attr returns the device's attributes.
	Attr() verbs.DeviceAttr
	// QPNum returns the number of QP i.
	QPNum(i int) uint32
	// NewRegion registers a region of size bytes with the access given,
	// surrounded by canaries, its bytes zeroed.
	NewRegion(size int, access verbs.AccessFlags) (Region, error)
	// NewOtherPDRegion is NewRegion on a second PD of the endpoint, one
	// its QPs do not belong to.
	NewOtherPDRegion(size int, access verbs.AccessFlags) (Region, error)
	// WriteRegion and ReadRegion access a region's bytes locally.
	WriteRegion(id, off int, data []byte) error
	ReadRegion(id, off, n int) ([]byte, error)
	// CanariesIntact reports whether the guard bytes around the region
	// are unchanged.
	CanariesIntact(id int) (bool, error)
	// DeregRegion deregisters the region; its memory stays readable.
	DeregRegion(id int) error
	// DeregContainer deregisters the provider allocation the region was
	// registered inside, leaving the region itself registered.
	DeregContainer(id int) error
	// AllocMW allocates a memory window of type typ on the endpoint's
	// PD and returns its id; MWRKey returns its current key and
	// DeallocMW frees it.
	AllocMW(typ verbs.MWType) (id int, err error)
	MWRKey(id int) (uint32, error)
	DeallocMW(id int) error
	// PostSend and PostRecv post to QP i; PostSRQRecv to the SRQ.
	PostSend(i int, wrs []verbs.SendWR) (int, error)
	PostRecv(i int, wrs []verbs.RecvWR) (int, error)
	PostSRQRecv(wrs []verbs.RecvWR) (int, error)
	// Completions collects completions from the CQ until it has n or
	// timeout passes, waiting without busy polling; n == 0 only polls.
	Completions(cq CQKind, n int, timeout time.Duration) ([]verbs.WorkCompletion, error)
	// QPState returns the state of QP i.
	QPState(i int) (verbs.QPState, error)
	// QPEvent waits up to timeout for an asynchronous event of type typ on
	// the endpoint's device and returns the index of the QP it names (-1
	// for an event that names none of them), or reports that none came.
	QPEvent(typ verbs.EventType, timeout time.Duration) (qp int, ok bool, err error)
	// SetQPAccess sets the remote operations QP i's responder accepts
	// (a Modify of AccessFlags in its current state).
	SetQPAccess(i int, access verbs.AccessFlags) error
	// SetQPState moves QP i to state s: a Modify of the state alone, or
	// from RTR to RTS with the attributes that move takes (rtsStep).
	SetQPState(i int, s verbs.QPState) error
	// Relisten listens at addr and accepts, in the background, one
	// connection for QP i, which must be in Reset; Reaccepted waits for
	// that accept's result.
	Relisten(i int, addr string) error
	Reaccepted() error
	// ArmSRQLimit arms the SRQ's limit event; SRQLimitEvent waits up to
	// timeout for the next limit event and reports whether one came.
	ArmSRQLimit(limit uint32) error
	SRQLimitEvent(timeout time.Duration) (bool, error)
	// Close tears the endpoint down in order.
	Close() error
}

// Pair is two connected endpoints.
type Pair struct {
	Opts PairOptions
	A    *Local
	B    Endpoint
	// KillB ends B abruptly: its process is killed, or, in process, its
	// device context is closed without any disconnect.
	KillB func()
	conns []*cm.Conn
}

// timeout bounds every wait in the suite so that a broken provider fails
// instead of hanging.
const timeout = 10 * time.Second

// NewPair makes a connected pair with the options given; t.Cleanup tears it
// down.
func (h Harness) NewPair(t testing.TB, opts PairOptions) *Pair {
	t.Helper()
	opts = opts.Defaults()
	opts.Without = h.Without
	addr := h.Addr(t)
	p := &Pair{Opts: opts}
	var err error
	var acceptErr chan error
	if h.Remote != nil {
		p.B, p.KillB, err = h.Remote(t, opts, addr)
		if err != nil {
			t.Fatalf("start remote endpoint: %v", err)
		}
	} else {
		b, err := NewLocal(h.Device, opts, true)
		if err != nil {
			t.Fatalf("create endpoint B: %v", err)
		}
		p.B = b
		p.KillB = func() { b.Ctx.Close() }
		l, err := cm.Listen(addr)
		if err != nil {
			t.Fatalf("listen %s: %v", addr, err)
		}
		acceptErr = make(chan error, 1)
		go func() {
			defer l.Close()
			acceptErr <- b.Accept(l, opts)
		}()
	}
	a, err := NewLocal(h.Device, opts, false)
	if err != nil {
		t.Fatalf("create endpoint A: %v", err)
	}
	p.A = a
	t.Cleanup(func() {
		a.Close()
		p.B.Close()
	})
	if err := a.Dial(addr, opts); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	if acceptErr != nil {
		if err := <-acceptErr; err != nil {
			t.Fatalf("accept: %v", err)
		}
	}
	if r, ok := p.B.(*remote); ok {
		if err := r.WaitAccepted(); err != nil {
			t.Fatalf("remote accept: %v", err)
		}
	}
	return p
}

// Local is an endpoint in this process, with its verbs objects exposed.
type Local struct {
	Ctx    *verbs.Context
	PD     *verbs.PD
	SendCQ *verbs.CQ
	RecvCQ *verbs.CQ
	SRQ    *verbs.SRQ
	QPs    []*verbs.QP
	Conns  []*cm.Conn

	without verbs.DeviceCaps
	opts    PairOptions

	reaccept chan error // Relisten's result
	stopBg   func()     // ends Relisten's accept
	bg       sync.WaitGroup

	mu        sync.Mutex
	otherPD   *verbs.PD
	regions   map[int]*region
	windows   map[int]*verbs.MW
	nextID    int
	srqEvents chan struct{}
	asyncEvs  chan verbs.AsyncEvent
	events    sync.WaitGroup
	done      chan struct{}
	closed    bool
}

type region struct {
	outer *verbs.MR // the whole allocation, local access only
	inner *verbs.MR // the region under test
	guard int
}

const guardLen = 64

// NewLocal creates an endpoint on device with opts (already defaulted);
// withSRQ gives it the SRQ when opts.SRQ is set (B's side).
func NewLocal(device string, opts PairOptions, withSRQ bool) (*Local, error) {
	ctx, err := verbs.Open(device)
	if err != nil {
		return nil, err
	}
	e := &Local{Ctx: ctx, without: opts.Without, opts: opts, regions: map[int]*region{}, windows: map[int]*verbs.MW{}, srqEvents: make(chan struct{}, 64),
		asyncEvs: make(chan verbs.AsyncEvent, 64), done: make(chan struct{})}
	fail := func(err error) (*Local, error) {
		ctx.Close()
		return nil, err
	}
	if e.PD, err = ctx.AllocPD(); err != nil {
		return fail(err)
	}
	if e.SendCQ, err = ctx.CreateCQ(opts.CQDepth); err != nil {
		return fail(err)
	}
	if e.RecvCQ, err = ctx.CreateCQ(opts.CQDepth); err != nil {
		return fail(err)
	}
	if opts.SRQ && withSRQ {
		if e.SRQ, err = e.PD.CreateSRQ(verbs.SRQInitAttr{MaxWR: opts.SRQWR, MaxSGE: opts.Cap.MaxRecvSGE}); err != nil {
			return fail(err)
		}
	}
	for range opts.QPs {
		qp, err := e.PD.CreateQP(verbs.QPInitAttr{SendCQ: e.SendCQ, RecvCQ: e.RecvCQ, SRQ: e.SRQ, Cap: opts.Cap, SigAll: opts.SigAll})
		if err != nil {
			return fail(err)
		}
		e.QPs = append(e.QPs, qp)
	}
	e.events.Add(1)
	go e.watchEvents()
	return e, nil
}

// watchEvents counts SRQ limit events and keeps every asynchronous event
// for WaitEvent until the context closes.
func (e *Local) watchEvents() {
	defer e.events.Done()
	for {
		select {
		case ev := <-e.Ctx.Events():
			if ev.Type == verbs.EventSRQLimitReached {
				select {
				case e.srqEvents <- struct{}{}:
				default:
				}
			}
			select {
			case e.asyncEvs <- ev:
			default:
			}
		case <-e.done:
			return
		}
	}
}

func (o PairOptions) param() *cm.Param {
	return &cm.Param{RNRRetryCount: o.RNRRetry, MinRNRTimer: o.MinRNRTimer, RetryCount: 7, NoDefaults: true}
}

// Accept accepts opts.QPs connections on l, one for each QP, in order.
func (e *Local) Accept(l *cm.Listener, opts PairOptions) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p := opts.param()
	p.HoldRTR = opts.HoldRTR
	for _, qp := range e.QPs {
		req, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		c, err := req.Accept(qp, p)
		if err != nil {
			return err
		}
		e.Conns = append(e.Conns, c)
	}
	return nil
}

// Dial connects each QP to addr, in order.
func (e *Local) Dial(addr string, opts PairOptions) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, qp := range e.QPs {
		c, err := cm.Dial(ctx, addr, qp, opts.param())
		if err != nil {
			return err
		}
		e.Conns = append(e.Conns, c)
	}
	return nil
}

// Attr implements Endpoint: the device's attributes, less the
// capabilities the pair's options leave out.
func (e *Local) Attr() verbs.DeviceAttr {
	a := e.Ctx.QueryDevice()
	a.Caps &^= e.without
	return a
}

// QPNum implements Endpoint.
func (e *Local) QPNum(i int) uint32 { return e.QPs[i].Num() }

// NewRegion implements Endpoint: it allocates size plus two guards of
// provider memory with local access only, fills the guards with a pattern,
// and registers the middle with the access under test.
func (e *Local) NewRegion(size int, access verbs.AccessFlags) (Region, error) {
	return e.newRegion(e.PD, size, access)
}

// NewOtherPDRegion implements Endpoint.
func (e *Local) NewOtherPDRegion(size int, access verbs.AccessFlags) (Region, error) {
	e.mu.Lock()
	pd := e.otherPD
	e.mu.Unlock()
	if pd == nil {
		var err error
		if pd, err = e.Ctx.AllocPD(); err != nil {
			return Region{}, err
		}
		e.mu.Lock()
		e.otherPD = pd
		e.mu.Unlock()
	}
	return e.newRegion(pd, size, access)
}

func (e *Local) newRegion(pd *verbs.PD, size int, access verbs.AccessFlags) (Region, error) {
	outer, err := pd.AllocMR(size+2*guardLen, verbs.AccessLocalWrite)
	if err != nil {
		return Region{}, err
	}
	b := outer.Bytes()
	for i := range b {
		b[i] = canary(i)
	}
	clear(b[guardLen : guardLen+size])
	inner, err := pd.RegMR(b[guardLen:guardLen+size], access)
	if err != nil {
		outer.Dereg()
		return Region{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID++
	e.regions[e.nextID] = &region{outer: outer, inner: inner, guard: guardLen}
	return Region{ID: e.nextID, Addr: inner.Addr(), Len: size, LKey: inner.LKey(), RKey: inner.RKey()}, nil
}

func canary(i int) byte { return byte(0xA5 ^ i*7) }

func (e *Local) region(id int) (*region, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.regions[id]
	if !ok {
		return nil, fmt.Errorf("no region %d", id)
	}
	return r, nil
}

// Region returns the MR of a region, for cases that use it directly.
func (e *Local) Region(id int) *verbs.MR {
	r, err := e.region(id)
	if err != nil {
		return nil
	}
	return r.inner
}

// WriteRegion implements Endpoint.
func (e *Local) WriteRegion(id, off int, data []byte) error {
	r, err := e.region(id)
	if err != nil {
		return err
	}
	b := r.outer.Bytes()[r.guard : len(r.outer.Bytes())-r.guard]
	if off < 0 || off+len(data) > len(b) {
		return fmt.Errorf("write of %d bytes at %d outside region of %d", len(data), off, len(b))
	}
	copy(b[off:], data)
	return nil
}

// ReadRegion implements Endpoint.
func (e *Local) ReadRegion(id, off, n int) ([]byte, error) {
	r, err := e.region(id)
	if err != nil {
		return nil, err
	}
	b := r.outer.Bytes()[r.guard : len(r.outer.Bytes())-r.guard]
	if off < 0 || n < 0 || off+n > len(b) {
		return nil, fmt.Errorf("read of %d bytes at %d outside region of %d", n, off, len(b))
	}
	return append([]byte(nil), b[off:off+n]...), nil
}

// CanariesIntact implements Endpoint.
func (e *Local) CanariesIntact(id int) (bool, error) {
	r, err := e.region(id)
	if err != nil {
		return false, err
	}
	b := r.outer.Bytes()
	for i := range b {
		if i >= r.guard && i < len(b)-r.guard {
			continue
		}
		if b[i] != canary(i) {
			return false, nil
		}
	}
	return true, nil
}

// DeregRegion implements Endpoint.
func (e *Local) DeregRegion(id int) error {
	r, err := e.region(id)
	if err != nil {
		return err
	}
	return r.inner.Dereg()
}

// DeregContainer implements Endpoint.
func (e *Local) DeregContainer(id int) error {
	r, err := e.region(id)
	if err != nil {
		return err
	}
	return r.outer.Dereg()
}

// AllocMW implements Endpoint.
func (e *Local) AllocMW(typ verbs.MWType) (int, error) {
	w, err := e.PD.AllocMW(typ)
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID++
	e.windows[e.nextID] = w
	return e.nextID, nil
}

// Window returns a memory window, for cases that use it directly.
func (e *Local) Window(id int) *verbs.MW {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.windows[id]
}

// MWRKey implements Endpoint.
func (e *Local) MWRKey(id int) (uint32, error) {
	w := e.Window(id)
	if w == nil {
		return 0, fmt.Errorf("no memory window %d", id)
	}
	return w.RKey(), nil
}

// DeallocMW implements Endpoint.
func (e *Local) DeallocMW(id int) error {
	w := e.Window(id)
	if w == nil {
		return fmt.Errorf("no memory window %d", id)
	}
	return w.Dealloc()
}

// PostSend implements Endpoint.
func (e *Local) PostSend(i int, wrs []verbs.SendWR) (int, error) { return e.QPs[i].PostSend(wrs) }

// PostRecv implements Endpoint.
func (e *Local) PostRecv(i int, wrs []verbs.RecvWR) (int, error) { return e.QPs[i].PostRecv(wrs) }

// PostSRQRecv implements Endpoint.
func (e *Local) PostSRQRecv(wrs []verbs.RecvWR) (int, error) {
	if e.SRQ == nil {
		return 0, errors.New("endpoint has no SRQ")
	}
	return e.SRQ.PostRecv(wrs)
}

// Completions implements Endpoint.
func (e *Local) Completions(kind CQKind, n int, timeout time.Duration) ([]verbs.WorkCompletion, error) {
	cq := e.SendCQ
	if kind == RecvCQ {
		cq = e.RecvCQ
	}
	buf := make([]verbs.WorkCompletion, max(n, 64))
	var out []verbs.WorkCompletion
	if n == 0 {
		k := cq.Poll(buf)
		return append(out, buf[:k]...), cq.Err()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:n-len(out)])
		out = append(out, buf[:k]...)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return out, nil
			}
			return out, err
		}
	}
	return out, nil
}

// QPState implements Endpoint.
func (e *Local) QPState(i int) (verbs.QPState, error) {
	a, err := e.QPs[i].Query()
	return a.State, err
}

// SetQPAccess implements Endpoint.
func (e *Local) SetQPAccess(i int, access verbs.AccessFlags) error {
	return e.QPs[i].Modify(&verbs.QPAttr{AccessFlags: access}, verbs.QPAttrAccessFlags)
}

// SetQPState implements Endpoint.
func (e *Local) SetQPState(i int, s verbs.QPState) error {
	q := e.QPs[i]
	if s == verbs.QPSRTS && q.State() == verbs.QPSRTR {
		st := rtsStep(e.opts)
		return q.Modify(&st.attr, st.mask)
	}
	return q.Modify(&verbs.QPAttr{State: s}, verbs.QPAttrState)
}

// Relisten implements Endpoint.
func (e *Local) Relisten(i int, addr string) error {
	l, err := cm.Listen(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		cancel()
		l.Close()
		return ErrClosedEndpoint
	}
	e.reaccept, e.stopBg = make(chan error, 1), cancel
	e.bg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.bg.Done()
		defer cancel()
		defer l.Close()
		req, err := l.Accept(ctx)
		if err == nil {
			var c *cm.Conn
			if c, err = req.Accept(e.QPs[i], e.opts.param()); err == nil {
				e.mu.Lock()
				e.Conns = append(e.Conns, c)
				e.mu.Unlock()
			}
		}
		e.reaccept <- err
	}()
	return nil
}

// ErrClosedEndpoint is Relisten's answer on an endpoint already closed.
var ErrClosedEndpoint = errors.New("verbstest: the endpoint is closed")

// Reaccepted implements Endpoint.
func (e *Local) Reaccepted() error {
	e.mu.Lock()
	ch := e.reaccept
	e.mu.Unlock()
	if ch == nil {
		return errors.New("verbstest: Reaccepted without Relisten")
	}
	return <-ch
}

// ArmSRQLimit implements Endpoint.
func (e *Local) ArmSRQLimit(limit uint32) error {
	if e.SRQ == nil {
		return errors.New("endpoint has no SRQ")
	}
	return e.SRQ.Modify(verbs.SRQAttr{Limit: limit}, verbs.SRQAttrLimit)
}

// SRQLimitEvent implements Endpoint.
func (e *Local) SRQLimitEvent(timeout time.Duration) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.srqEvents:
		return true, nil
	case <-t.C:
		return false, nil
	}
}

// WaitEvent waits up to timeout for an asynchronous event of type typ on
// the endpoint's device, discarding events of other types, and reports
// whether one came. The endpoint reads Ctx.Events itself, so cases that
// expect an asynchronous event use WaitEvent instead of that channel.
func (e *Local) WaitEvent(typ verbs.EventType, timeout time.Duration) (verbs.AsyncEvent, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev := <-e.asyncEvs:
			if ev.Type == typ {
				return ev, true
			}
		case <-t.C:
			return verbs.AsyncEvent{}, false
		}
	}
}

// QPEvent implements Endpoint.
func (e *Local) QPEvent(typ verbs.EventType, timeout time.Duration) (int, bool, error) {
	ev, ok := e.WaitEvent(typ, timeout)
	if !ok {
		return -1, false, nil
	}
	for i, q := range e.QPs {
		if ev.Element == any(q) {
			return i, true, nil
		}
	}
	return -1, true, nil
}

// Close implements Endpoint: it disconnects and destroys everything in
// order, and closes the device.
func (e *Local) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.done)
	if e.stopBg != nil {
		e.stopBg()
	}
	e.mu.Unlock()
	e.events.Wait()
	e.bg.Wait()
	for _, c := range e.Conns {
		c.Close()
	}
	return e.Ctx.Close()
}

// Connect connects QP cli to QP srv through cm: a listener at addr
// (tcp://127.0.0.1:0 picks a free port) takes the one connection. It
// returns the server's and the client's ends, closed when the test ends.
func Connect(t testing.TB, addr string, srv, cli *verbs.QP) (server, client *cm.Conn) {
	t.Helper()
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 1)
	go func() {
		var c *cm.Conn
		if req, err := l.Accept(context.Background()); err == nil {
			if c, err = req.Accept(srv, nil); err != nil {
				t.Error(err)
			}
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client, err = cm.Dial(ctx, l.Addr(), cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	if server = <-accepted; server == nil {
		client.Close()
		t.Fatal("no accepted connection")
	}
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return server, client
}

// openLocal opens device in the test's process with a PD and a CQ of 64
// entries; the context closes when the test ends.
func openLocal(t testing.TB, device string) (*verbs.Context, *verbs.PD, *verbs.CQ) {
	t.Helper()
	ctx, err := verbs.Open(device)
	if err != nil {
		t.Fatalf("open %s: %v", device, err)
	}
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, pd, cq
}

// QPOn opens device and makes on it a PD, a CQ of 64 entries and a QP on
// that CQ with room for depth WRs of one SGE each way: the pieces of a
// test that connects QPs itself (Connect). The context closes when the
// test ends.
func QPOn(t testing.TB, device string, depth int) (*verbs.PD, *verbs.CQ, *verbs.QP) {
	t.Helper()
	_, pd, cq := openLocal(t, device)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: uint32(depth), MaxRecvWR: uint32(depth), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return pd, cq, qp
}

// Side is one end of a test that connects QPs itself (Connect): a QP
// with its PD and CQ, as QPOn makes them.
type Side struct {
	PD *verbs.PD
	CQ *verbs.CQ
	QP *verbs.QP
}

// NewSide is QPOn's pieces as a Side.
func NewSide(t testing.TB, device string, depth int) *Side {
	t.Helper()
	s := &Side{}
	s.PD, s.CQ, s.QP = QPOn(t, device, depth)
	return s
}
