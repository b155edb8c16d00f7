package ibverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

func init() {
	verbs.Register("ibverbs", &provider{})
}

type provider struct{}

// Available reports why no device of this provider is listed: nil when
// libibverbs is loaded and lists at least one device, else an error that
// says what to install or load.
func Available() error {
	if err := load(); err != nil {
		return err
	}
	devs, err := listDevices()
	if err != nil {
		return err
	}
	if len(devs) == 0 {
		return errors.New("ibverbs: libibverbs lists no RDMA device: load a driver (modprobe rdma_rxe or siw, then `rdma link add rxe0 type rxe netdev eth0`) or install the NIC's provider")
	}
	return nil
}

type device struct {
	p         uintptr // struct ibv_device *
	name      string
	guid      uint64
	transport string
}

// listDevices lists the devices libibverbs knows; their ibv_device
// pointers are valid only until the list is freed, so it is used for
// names only.
func listDevices() ([]device, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n int32
	list, err := callPtr(lib.getDeviceList, uintptr(unsafe.Pointer(&n)))
	if err != nil {
		if err == syscall.ENOSYS {
			return nil, errors.New("ibverbs: the kernel has no RDMA support (ib_uverbs is not loaded)")
		}
		return nil, fmt.Errorf("ibverbs: ibv_get_device_list: %w", err)
	}
	defer call(lib.freeDeviceList, list)
	devs := make([]device, 0, n)
	for i := range uintptr(n) {
		d := *(*uintptr)(cptr(list + i*8))
		devs = append(devs, device{
			p:         d,
			name:      goString(call(lib.getDeviceName, d)),
			guid:      beSwap64(uint64(call(lib.getDeviceGUID, d))),
			transport: transportName(*(*uint32)(cptr(d + offDeviceTransportType))),
		})
	}
	return devs, nil
}

func transportName(t uint32) string {
	switch t {
	case ibvTransportIB:
		return "ib"
	case ibvTransportIWARP:
		return "iwarp"
	}
	return fmt.Sprintf("transport(%d)", t)
}

func beSwap64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b)) = v
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// The verbs' immediate data is a number (driver.SendWR.Imm) that crosses
// the wire in network byte order; ibverbs keeps it as those bytes (a
// __be32). putNetOrder and netOrder convert between the two whatever the
// host's byte order.
func putNetOrder(p *uint32, v uint32) {
	binary.BigEndian.PutUint32((*[4]byte)(unsafe.Pointer(p))[:], v)
}

func netOrder(p *uint32) uint32 { return binary.BigEndian.Uint32((*[4]byte)(unsafe.Pointer(p))[:]) }

func (*provider) Devices() []driver.DeviceInfo {
	devs, err := listDevices()
	if err != nil {
		return nil
	}
	out := make([]driver.DeviceInfo, len(devs))
	for i, d := range devs {
		out[i] = driver.DeviceInfo{Name: d.name, Provider: "ibverbs", Transport: d.transport, GUID: d.guid}
	}
	return out
}

// errnoErr turns an errno from libibverbs or librdmacm into an error that
// wraps the matching sentinel of package driver and the errno itself.
func errnoErr(op string, err error) error {
	var e syscall.Errno
	if !errors.As(err, &e) {
		return fmt.Errorf("ibverbs: %s: %w", op, err)
	}
	var s error
	switch e {
	case syscall.EINVAL:
		s = driver.ErrInvalidArg
	case syscall.ENOMEM, syscall.ENOSPC, syscall.EAGAIN:
		s = driver.ErrNoResources
	case syscall.EBUSY:
		s = driver.ErrBusy
	case syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.EPROTONOSUPPORT:
		s = driver.ErrUnsupported
	case syscall.ENODEV, syscall.ENXIO, syscall.ENOENT:
		s = driver.ErrNoDevice
	case syscall.ECONNREFUSED:
		s = driver.ErrRefused
	default:
		return fmt.Errorf("ibverbs: %s: %w", op, e)
	}
	if strings.Contains(s.Error(), e.Error()) {
		// (ErrInvalidArg says "invalid argument" as EINVAL does: once.)
		return fmt.Errorf("ibverbs: %s: %w", op, sameText{s, e})
	}
	return fmt.Errorf("ibverbs: %s: %w: %w", op, s, e)
}

// sameText wraps a sentinel and an errno whose text the sentinel's
// holds, and reads as the sentinel.
type sameText struct {
	sentinel error
	errno    syscall.Errno
}

func (t sameText) Error() string   { return t.sentinel.Error() }
func (t sameText) Unwrap() []error { return []error{t.sentinel, t.errno} }

// devContext is an open device: struct ibv_context and what the provider
// keeps about it.
type devContext struct {
	p     uintptr // struct ibv_context *
	name  string
	attr  driver.DeviceAttr
	iwarp bool
	// noReset: the device moves a QP out of RTS or ERR to ERR only, and
	// takes a move to RESET without making it (siw).
	noReset bool
	// kernelInvFlag: the device writes the kernel's IB_WC_WITH_INVALIDATE
	// into receive completions (mw.go).
	kernelInvFlag bool
	port          ibvPortAttr
	// maxSGERd is how many SGEs an RDMA Read scatters into (siw: 1).
	maxSGERd int
	events   soft.EventQueue

	// The ops table's data-path entry points.
	pollCQ, reqNotifyCQ, postSend, postRecv, postSRQRecv uintptr

	// removed is set once the device is gone (removeDevice): posting is
	// refused and CQ.Wait returns ErrNoDevice once the CQ is empty.
	removed atomic.Bool

	mu     sync.Mutex
	closed bool
	owners map[uintptr]any // ibv_qp/cq/srq pointer -> the object, for async events
	pds    map[*pd]struct{}
	allocs []*alloc // AllocMR memory, for RegMR inside it

	qpsMu   sync.RWMutex
	qpByNum map[uint32]*qp // for the source QP of receive completions
	watcher *fdWatcher
}

func (*provider) Open(name string) (driver.Context, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n int32
	list, err := callPtr(lib.getDeviceList, uintptr(unsafe.Pointer(&n)))
	if err != nil {
		return nil, errnoErr("ibv_get_device_list", err)
	}
	var ctxp uintptr
	for i := range uintptr(n) {
		d := *(*uintptr)(cptr(list + i*8))
		if goString(call(lib.getDeviceName, d)) == name {
			ctxp, err = callPtr(lib.openDevice, d)
			break
		}
	}
	call(lib.freeDeviceList, list)
	if err != nil {
		return nil, errnoErr("ibv_open_device "+name, err)
	}
	if ctxp == 0 {
		return nil, fmt.Errorf("ibverbs: %w: %q", driver.ErrNoDevice, name)
	}
	c := &devContext{p: ctxp, name: name, events: soft.NewEventQueue(),
		owners: map[uintptr]any{}, pds: map[*pd]struct{}{}, qpByNum: map[uint32]*qp{}}
	c.pollCQ = *(*uintptr)(cptr(ctxp + offContextPollCQ))
	c.reqNotifyCQ = *(*uintptr)(cptr(ctxp + offContextReqNotifyCQ))
	c.postSend = *(*uintptr)(cptr(ctxp + offContextPostSend))
	c.postRecv = *(*uintptr)(cptr(ctxp + offContextPostRecv))
	c.postSRQRecv = *(*uintptr)(cptr(ctxp + offContextPostSRQRecv))
	if err := c.query(); err != nil {
		call(lib.closeDevice, ctxp)
		return nil, err
	}
	asyncFD := int(*(*int32)(cptr(ctxp + offContextAsyncFD)))
	w, err := watchFD(asyncFD, c.asyncEvent)
	if err != nil {
		call(lib.closeDevice, ctxp)
		return nil, fmt.Errorf("ibverbs: watch the async event fd of %s: %w", name, err)
	}
	c.watcher = w
	return c, nil
}

// query fills in the device's attributes from ibv_query_device and
// ibv_query_port (port 1).
func (c *devContext) query() error {
	var a ibvDeviceAttr
	if err := callInt(lib.queryDevice, c.p, uintptr(unsafe.Pointer(&a))); err != nil {
		return errnoErr("ibv_query_device "+c.name, err)
	}
	if err := callInt(lib.queryPort, c.p, 1, uintptr(unsafe.Pointer(&c.port))); err != nil {
		return errnoErr("ibv_query_port "+c.name, err)
	}
	dev := *(*uintptr)(cptr(c.p + offContextDevice))
	tt := *(*uint32)(cptr(dev + offDeviceTransportType))
	c.iwarp = tt == ibvTransportIWARP
	transport := transportName(tt)
	if tt == ibvTransportIB && c.port.linkLayer == ibvLinkLayerEthernet {
		transport = "roce"
	}
	fw := a.fwVer[:]
	if i := indexByte(fw, 0); i >= 0 {
		fw = fw[:i]
	}
	c.maxSGERd = max(int(a.maxSGERd), 1)
	c.attr = driver.DeviceAttr{
		Name:            c.name,
		Transport:       transport,
		FWVersion:       string(fw),
		MaxMRSize:       a.maxMRSize,
		MaxQP:           int(a.maxQP),
		MaxQPWR:         int(a.maxQPWR),
		MaxSGE:          int(a.maxSGE),
		MaxCQ:           int(a.maxCQ),
		MaxCQE:          int(a.maxCQE),
		MaxMR:           int(a.maxMR),
		MaxPD:           int(a.maxPD),
		MaxQPRdAtom:     int(a.maxQPRdAtom),
		MaxQPInitRdAtom: int(a.maxQPInitRdAtom),
		MaxSRQ:          int(a.maxSRQ),
		MaxSRQWR:        int(a.maxSRQWR),
		MaxSRQSGE:       int(a.maxSRQSGE),
		MaxMsgSize:      uint64(c.port.maxMsgSz),
		MaxPrivateData:  maxPrivateData,
		AtomicCap:       driver.AtomicCap(min(a.atomicCap, uint32(driver.AtomicGlob))),
		Caps:            driver.CapCrossProcess,
	}
	if a.maxSRQ > 0 {
		c.attr.Caps |= driver.CapSRQ
	}
	if !c.iwarp {
		// InfiniBand and RoCE: RNR NAKs and immediate data are part of
		// the transport. iWARP has neither.
		c.attr.Caps |= driver.CapRNRRetry | driver.CapImmData
		// The responder acknowledges every request, so a Send or Write
		// completes with the responder's error; unanswered requests are
		// retried per Timeout and RetryCnt; a receive may have no SGE;
		// RTS→SQD drains the send queue; an atomic's result is copied
		// into its SGE list in order. iWARP (siw) does none of these:
		// it completes a WR once TCP has taken it, leaves retries to
		// TCP, and libsiw refuses a receive without an SGE.
		//
		// Not declared: CapModifyConnect (RTR needs an address vector
		// that Modify does not carry, and the kernel answers an illegal
		// transition and a missing attribute with the same EINVAL) and
		// CapQPErrorEvents (the affiliated error events are not raised
		// as the IB specification names them by every device).
		c.attr.Caps |= driver.CapAckedCompletion | driver.CapTransportRetry |
			driver.CapRecvNoSGE | driver.CapSQD | driver.CapAtomicResultSGList
	}
	if c.attr.AtomicCap != driver.AtomicNone {
		c.attr.Caps |= driver.CapAtomics
	}
	if mwCaps(a.deviceCapFlags, c.p) {
		c.attr.Caps |= driver.CapMemoryWindows
	}
	c.kernelInvFlag = !c.iwarp && a.vendorID == rxeVendorID
	c.noReset = c.iwarp && a.vendorID == siwVendorID
	c.attr.MaxInlineData = c.probeInline()
	return nil
}

func indexByte(b []byte, x byte) int {
	for i, v := range b {
		if v == x {
			return i
		}
	}
	return -1
}

// probeInline finds the largest inline payload the device grants a QP:
// ibv_query_device does not report it, so it creates throwaway QPs.
func (c *devContext) probeInline() int {
	pdp, err := callPtr(lib.allocPD, c.p)
	if err != nil {
		return 0
	}
	defer call(lib.deallocPD, pdp)
	cqp, err := callPtr(lib.createCQ, c.p, 1, 0, 0, 0)
	if err != nil {
		return 0
	}
	defer call(lib.destroyCQ, cqp)
	for _, n := range []uint32{1024, 512, 256, 128, 64, 32} {
		ia := ibvQPInitAttr{sendCQ: cqp, recvCQ: cqp, qpType: ibvQPTypeRC,
			cap: ibvQPCap{maxSendWR: 1, maxRecvWR: 1, maxSendSGE: 1, maxRecvSGE: 1, maxInlineData: n}}
		qp, err := callPtr(lib.createQP, pdp, uintptr(unsafe.Pointer(&ia)))
		if err == nil {
			call(lib.destroyQP, qp)
			return int(min(n, ia.cap.maxInlineData))
		}
	}
	return 0
}

func (c *devContext) QueryDevice() driver.DeviceAttr { return c.attr }

func (c *devContext) Events() <-chan driver.AsyncEvent { return c.events.Events() }

// asyncEvent reads the async events that are ready, delivers them and
// acks them; it reports false when the fd has none ready.
func (c *devContext) asyncEvent() bool {
	var ev ibvAsyncEvent
	if r := int32(call(lib.getAsyncEvent, c.p, uintptr(unsafe.Pointer(&ev)))); r != 0 {
		return false
	}
	t := driver.EventType(ev.eventType)
	var element any
	switch t {
	case driver.EventDeviceFatal:
		call(lib.ackAsyncEvent, uintptr(unsafe.Pointer(&ev)))
		c.removeDevice()
		return true
	case driver.EventPortActive, driver.EventPortErr,
		driver.EventLIDChange, driver.EventPKeyChange, driver.EventSMChange:
	default:
		c.mu.Lock()
		o := c.owners[ev.element]
		c.mu.Unlock()
		switch o := o.(type) {
		case *cq:
			if t == driver.EventCQErr {
				o.overrun.Store(true)
			}
			element = o.userCtx
		case *qp:
			element = o.userCtx
			if t == driver.EventQPFatal || t == driver.EventQPReqErr || t == driver.EventQPAccessErr {
				o.state.Store(uint32(driver.QPSErr))
			}
		case *srq:
			element = o.userCtx
			if t == driver.EventSRQLimitReached {
				o.limit.Store(0)
			}
		}
	}
	call(lib.ackAsyncEvent, uintptr(unsafe.Pointer(&ev)))
	if t <= driver.EventQPLastWQEReached {
		c.events.Event(t, element)
	}
	return true
}

// removeDevice records that the device is gone: its driver raised a
// fatal error (a device with disassociation, such as mlx5, does so when
// it is removed), or rdma_cm reported its removal (rxe and siw have no
// disassociation: the kernel's removal waits until every process has
// closed the device, and only rdma_cm tells them). It raises
// EventDeviceFatal once and wakes the goroutines in CQ.Wait, which
// return ErrNoDevice once they have taken what the CQs hold; posting is
// refused from then on. The objects stay until they are destroyed and
// the context is closed, which lets the kernel finish the removal.
func (c *devContext) removeDevice() {
	if !c.removed.CompareAndSwap(false, true) {
		return
	}
	c.events.Event(driver.EventDeviceFatal, nil)
	forgetRemovedDevices()
	c.mu.Lock()
	for _, o := range c.owners {
		if q, ok := o.(*cq); ok {
			q.wake()
		}
	}
	c.mu.Unlock()
}

// forgetRemovedDevices has librdmacm compare its list of devices with the
// kernel's: librdmacm holds a context of its own on each device its ids
// were bound to, and closes that of a removed device only once it has
// seen the device leave the list and its last id is destroyed. Until
// then the kernel's removal of the device waits for this process.
func forgetRemovedDevices() {
	if loadCM() != nil {
		return
	}
	var n int32
	if list := call(lib.getDevices, uintptr(unsafe.Pointer(&n))); list != 0 {
		call(lib.freeDevices, list)
	}
}

// removedErr is the error of a verb on a device that is gone.
func (c *devContext) removedErr() error {
	return fmt.Errorf("ibverbs: %w: %s was removed: destroy its objects and close the context", driver.ErrNoDevice, c.name)
}

func (c *devContext) own(p uintptr, o any) {
	c.mu.Lock()
	c.owners[p] = o
	c.mu.Unlock()
}

func (c *devContext) disown(p uintptr) {
	c.mu.Lock()
	delete(c.owners, p)
	c.mu.Unlock()
}

func (c *devContext) AllocPD() (driver.PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, driver.ErrClosed
	}
	p, err := callPtr(lib.allocPD, c.p)
	if err != nil {
		return nil, errnoErr("ibv_alloc_pd", err)
	}
	d := &pd{ctx: c, p: p, mrs: map[*mr]struct{}{}, byLKey: map[uint32]*mr{}, qps: map[*qp]struct{}{}, srqs: map[*srq]struct{}{}}
	c.pds[d] = struct{}{}
	return d, nil
}

// Close destroys every QP, SRQ, MR, PD and CQ made on the context, then
// closes the device.
func (c *devContext) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	pds := slices.Collect(maps.Keys(c.pds))
	var cqs []*cq
	for _, o := range c.owners {
		if q, ok := o.(*cq); ok {
			cqs = append(cqs, q)
		}
	}
	c.mu.Unlock()
	for _, p := range pds {
		p.destroyAll()
	}
	destroyEach(cqs)
	c.watcher.stop()
	if err := callInt(lib.closeDevice, c.p); err != nil {
		return errnoErr("ibv_close_device", err)
	}
	return nil
}

// fdWatcher runs a function each time a file descriptor that libibverbs
// or librdmacm reads becomes readable, in a goroutine parked in the Go
// runtime's poller in between. It watches a duplicate of the descriptor
// (the library keeps the original), made non-blocking.
type fdWatcher struct {
	f    *os.File
	done chan struct{}
}

// watchFD calls ready whenever fd is readable, until ready reports false
// (nothing more to read: wait again) or stop is called.
func watchFD(fd int, ready func() bool) (*fdWatcher, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "rdma-fd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	w := &fdWatcher{f: f, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			err := rc.Read(func(uintptr) bool { return ready() })
			if err != nil {
				return
			}
		}
	}()
	return w, nil
}

// stop ends the watcher's goroutine and waits for it.
func (w *fdWatcher) stop() {
	w.f.Close()
	<-w.done
}

// loopbackAV returns the address vector of the device's own port 1: what
// a QP moved to RTR by hand is given, so that it reaches QPs of the same
// device. On RoCE it is the first IPv4-mapped GID (the one rdma_cm uses
// for an IPv4 address), on InfiniBand the port's LID.
func (c *devContext) loopbackAV() (ibvAHAttr, error) {
	av := ibvAHAttr{portNum: 1}
	if c.port.linkLayer != ibvLinkLayerEthernet {
		av.dlid = c.port.lid
		return av, nil
	}
	var first [16]byte
	firstIdx := -1
	for i := 0; i < int(c.port.gidTblLen) && i < 256; i++ {
		var gid [16]byte
		if callInt(lib.queryGID, c.p, 1, uintptr(i), uintptr(unsafe.Pointer(&gid))) != nil || gid == [16]byte{} {
			continue
		}
		if firstIdx < 0 {
			first, firstIdx = gid, i
		}
		if gid[10] == 0xff && gid[11] == 0xff && gid[0] == 0 {
			first, firstIdx = gid, i
			break
		}
	}
	if firstIdx < 0 {
		return av, fmt.Errorf("%w: %s has no GID: give its network device an address", driver.ErrInvalidState, c.name)
	}
	av.isGlobal = 1
	av.grh = ibvGlobalRoute{dgid: first, sgidIndex: uint8(firstIdx), hopLimit: 64}
	return av, nil
}
