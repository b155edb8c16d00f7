package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// remoteBuf is the peer's target area: where one-sided operations go.
type remoteBuf struct {
	addr uint64
	rkey uint32
}

// Work request IDs of the control messages and credits; data WRs carry
// their index.
const (
	wrCtrlRecv = 1<<63 + iota
	wrCtrlSend
	wrRecv
	wrCredit
)

// Offsets in the control area, which follows the data areas in the same
// region: the receive, then the send. Sharing the data region means the
// control receive, posted as the last data message may be arriving,
// exposes nothing new to the peer then: on shm, a region's first receive
// hands the peer its segment, a one-time cost that would otherwise land
// in the measured loop.
const (
	ctrlRecvOff = 0
	ctrlSendOff = 64
	ctrlArea    = 128
)

// ErrPeerGone is returned when the connection ended in the middle of a run.
var ErrPeerGone = errors.New("the connection to the peer ended in the middle of the run")

// endpoint is one side of one run: its queues, its buffers and its
// connection. Its buffer has two data areas of p.area() bytes, then the
// control area: the first is the local side of the operations it posts
// (the source of Sends and Writes, where Reads and atomics land); the
// second is the target of the peer's operations (Sends land there, Writes
// are written there, Reads and atomics read it).
type endpoint struct {
	ctx    context.Context
	p      Params
	pd     *verbs.PD
	buf    *verbs.MR
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qp     *verbs.QP
	conn   *cm.Conn
	remote remoteBuf
	wc     []verbs.WorkCompletion

	// The work requests the loops post, made once so that the loops
	// allocate nothing: the operation (aimed at the peer's target area
	// once connected; a post list of them in bandwidth tests), receives into the target area (and room for the
	// control receive after them), and the control receive.
	swr    []verbs.SendWR
	rwrs   []verbs.RecvWR
	ctrlWR verbs.RecvWR
	// ctrlAfterData: post the control receive in the same call as the
	// last data receive, so that it is posted before the peer can send
	// the control message (a provider without RNR retry, such as iWARP,
	// ends the connection at a Send that finds no receive).
	ctrlAfterData bool
	// early is the control message's completion when a loop polled it
	// with the last data messages.
	early    verbs.WorkCompletion
	hasEarly bool

	// Credits, for send_bw on a device without RNR retry, as perftest
	// does for iWARP: the receiver RDMA-Writes how many messages it has
	// taken (and replaced with new receives) into the first word of the
	// sender's target area, and the sender keeps fewer than RxDepth
	// messages beyond that count. sent counts the messages sent before
	// the current loop.
	credits bool
	sent    int
	cwr     []verbs.SendWR

	// Set by mark and markEnd: the CPU time the process used in the
	// measured part of the run.
	cpuStart, cpuEnd time.Duration
	cpuOK            bool

	// hook, if set (by tests), runs at mark and at markEnd.
	hook func()
}

// newEndpoint creates the resources of one run on dev and moves the QP to
// Init, so that receives can be posted before it connects.
func newEndpoint(ctx context.Context, dev *verbs.Context, p Params) (e *endpoint, err error) {
	e = &endpoint{ctx: ctx, p: p, wc: make([]verbs.WorkCompletion, 32)}
	defer func() {
		if err != nil {
			e.close()
			e = nil
		}
	}()
	if e.pd, err = dev.AllocPD(); err != nil {
		return e, err
	}
	access := verbs.AccessLocalWrite | verbs.RemoteAccess
	if e.buf, err = e.pd.AllocMR(p.regionLen(), access); err != nil {
		return e, err
	}
	sendDepth := p.sendDepth() + 1 // and the control message
	recvDepth := min(p.RxDepth, p.total()) + 1
	if e.scq, err = dev.CreateCQ(sendDepth); err != nil {
		return e, err
	}
	if e.rcq, err = dev.CreateCQ(recvDepth); err != nil {
		return e, err
	}
	// Credits (send_bw without RNR retry) go inline when the device can.
	inline := p.Inline
	creditInline := dev.QueryDevice().MaxInlineData >= 4
	if creditInline {
		inline = max(inline, 4)
	}
	qpCap := verbs.QPCap{MaxSendWR: uint32(sendDepth), MaxRecvWR: uint32(recvDepth),
		MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(inline)}
	ep, err := cm.NewEndpoint(e.pd, verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Cap: qpCap})
	if err != nil {
		return e, err
	}
	e.qp = ep.QP()
	e.swr = make([]verbs.SendWR, p.postList())
	for i := range e.swr {
		e.swr[i] = verbs.SendWR{Opcode: p.Test.Opcode(), SGList: []verbs.SGE{e.buf.SGE(0, p.Size)}, CompareAdd: 1}
	}
	e.rwrs = make([]verbs.RecvWR, len(e.wc)+1)
	for i := range e.rwrs {
		e.rwrs[i] = verbs.RecvWR{WRID: wrRecv, SGList: []verbs.SGE{e.buf.SGE(p.area(), p.Size)}}
	}
	e.ctrlWR = verbs.RecvWR{WRID: wrCtrlRecv, SGList: []verbs.SGE{e.buf.SGE(e.ctrlOff(ctrlRecvOff), ctrlLen)}}
	e.cwr = []verbs.SendWR{{WRID: wrCredit, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{e.buf.SGE(0, 4)}}}
	if creditInline {
		e.cwr[0].Flags |= verbs.SendInline
	}
	return e, nil
}

// connected aims the operation, and the credits, at the peer's target
// area.
func (e *endpoint) connected(remote remoteBuf) {
	e.remote = remote
	for i := range e.swr {
		e.swr[i].RemoteAddr, e.swr[i].RKey = remote.addr, remote.rkey
	}
	e.cwr[0].RemoteAddr, e.cwr[0].RKey = remote.addr, remote.rkey
}

// needCredits says whether send_bw needs credits on a device: when a
// Send that finds no receive posted is not retried.
func needCredits(a verbs.DeviceAttr) bool { return !a.Has(verbs.CapRNRRetry) }

// close disconnects and destroys what newEndpoint created.
func (e *endpoint) close() error {
	var errs []error
	if e.conn != nil {
		select {
		case <-e.conn.Done():
			e.conn.Close()
		default:
			errs = append(errs, e.conn.Close())
		}
	}
	if e.qp != nil {
		errs = append(errs, e.qp.Destroy())
	}
	for _, cq := range []*verbs.CQ{e.scq, e.rcq} {
		if cq != nil {
			errs = append(errs, cq.Destroy())
		}
	}
	if e.buf != nil {
		errs = append(errs, e.buf.Dereg())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// param is the cm parameters of both sides: a short RNR timer (10 µs), so
// that a Send that finds no receive posted yet is retried soon.
func param(privateData []byte) *cm.Param {
	return &cm.Param{PrivateData: privateData, MinRNRTimer: 1}
}

// ctrlOff is the offset in the buffer of off in the control area.
func (e *endpoint) ctrlOff(off int) int { return 2*e.p.area() + off }

// target describes the endpoint's target area to the peer.
func (e *endpoint) target() remoteBuf {
	return remoteBuf{addr: e.buf.Addr() + uint64(e.p.area()), rkey: e.buf.RKey()}
}

// prepostRecv posts the first receives of a Send test, at most RxDepth of
// them, all into the target area.
func (e *endpoint) prepostRecv() (posted int, err error) {
	return e.postRecvs(0, min(e.p.RxDepth, e.p.total()))
}

// postRecvs posts n more receives, in batches; posted counts them. With
// ctrlAfterData, the batch that posts the run's last data receive ends
// with the control receive.
func (e *endpoint) postRecvs(posted, n int) (int, error) {
	for n > 0 {
		k := min(n, len(e.rwrs)-1)
		batch := e.rwrs[:k]
		if e.ctrlAfterData && posted+k == e.p.total() {
			e.rwrs[k] = e.ctrlWR
			batch = e.rwrs[:k+1]
		}
		got, err := e.qp.PostRecv(batch)
		e.rwrs[k] = e.rwrs[0]
		if got > k {
			got = k
		}
		posted += got
		n -= got
		if err != nil {
			return posted, fmt.Errorf("post receive %d: %w", posted, err)
		}
	}
	return posted, nil
}

// baseFlags are the flags of every data WR: inline when the message fits.
func (e *endpoint) baseFlags() verbs.SendFlags {
	if e.p.Size <= e.p.Inline && e.p.Test.Opcode() != verbs.OpRDMARead && !e.p.Test.Atomic() {
		return verbs.SendInline
	}
	return 0
}

// now is a timestamp for the measured loops: see stamp and toNanos.
func (e *endpoint) now() int64 { return stamp() }

// mark records the CPU time at the start of the measured part.
func (e *endpoint) mark() {
	if e.hook != nil {
		e.hook()
	}
	e.cpuStart, e.cpuOK = processCPU()
}

// markEnd records the CPU time at its end.
func (e *endpoint) markEnd() {
	var ok bool
	e.cpuEnd, ok = processCPU()
	e.cpuOK = e.cpuOK && ok
	if e.hook != nil {
		e.hook()
	}
}

// cpu is the CPU time of the measured part, or -1 if it was not measured.
func (e *endpoint) cpu() time.Duration {
	if !e.cpuOK {
		return -1
	}
	return e.cpuEnd - e.cpuStart
}

// alive returns an error once the run must stop: ctx ended, the
// connection broke, or the CQ overran.
func (e *endpoint) alive(cq *verbs.CQ) error {
	if err := e.ctx.Err(); err != nil {
		return err
	}
	if e.conn != nil {
		select {
		case <-e.conn.Done():
			return ErrPeerGone
		default:
		}
	}
	return cq.Err()
}

// waitCQ returns at least one completion of cq in wc: it busy-polls, or,
// with event, sleeps in CQ.Wait. It does not allocate.
func (e *endpoint) waitCQ(cq *verbs.CQ, wc []verbs.WorkCompletion, event bool) (int, error) {
	if event {
		n, err := cq.Wait(e.ctx, wc)
		if err != nil {
			if aerr := e.alive(cq); aerr != nil {
				return 0, aerr
			}
		}
		return n, err
	}
	for spins := 1; ; spins++ {
		if n := cq.Poll(wc); n > 0 {
			return n, nil
		}
		if spins&0xfff == 0 {
			if err := e.alive(cq); err != nil {
				return 0, err
			}
		}
	}
}

// check returns an error unless wc is a successful completion of op. (It
// inlines into the measured loops, which pay no call for a completion
// that is what they expect.)
func check(wc *verbs.WorkCompletion, op verbs.WCOpcode) error {
	if wc.Status == verbs.WCSuccess && wc.Opcode == op {
		return nil
	}
	return unexpected(wc, op)
}

// unexpected is the error of a completion check refuses.
func unexpected(wc *verbs.WorkCompletion, op verbs.WCOpcode) error {
	if wc.Status != verbs.WCSuccess {
		if wc.Status == verbs.WCWRFlushErr {
			return fmt.Errorf("%v flushed: %w", op, ErrPeerGone)
		}
		return fmt.Errorf("%v work request %d completed with status %q (vendor error %#x)", wc.Opcode, wc.WRID, wc.Status, wc.VendorErr)
	}
	if wc.Opcode != op {
		return fmt.Errorf("got a %v completion, want %v", wc.Opcode, op)
	}
	return nil
}

// polledByte is the last byte of the target area, as write_lat polls it:
// the aligned 32-bit word that holds it, loaded atomically, and the
// byte's shift in it.
type polledByte struct {
	word  *uint32
	shift uint
}

func (e *endpoint) lastTargetByte() (polledByte, error) {
	off := e.p.area() + e.p.Size - 1
	b := e.buf.Bytes()
	p := unsafe.Pointer(&b[off&^3])
	if uintptr(p)%4 != 0 {
		return polledByte{}, errors.New("the data buffer is not 4-byte aligned")
	}
	shift := uint(off&3) * 8
	if !littleEndian {
		shift = 24 - shift
	}
	return polledByte{word: (*uint32)(p), shift: shift}, nil
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// word32 is the 32-bit word at offset off of the data buffer, for atomic
// access.
func (e *endpoint) word32(off int) (*uint32, error) {
	p := unsafe.Pointer(&e.buf.Bytes()[off])
	if uintptr(p)%4 != 0 {
		return nil, errors.New("the data buffer is not 4-byte aligned")
	}
	return (*uint32)(p), nil
}

// spinCredit waits until the credit word reads at least want.
func (e *endpoint) spinCredit(credit *uint32, want int) error {
	for spins := 1; int(atomic.LoadUint32(credit)) < want; spins++ {
		if spins&0xffff == 0 {
			if err := e.alive(e.scq); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendCredit tells the sender, with an RDMA Write into its target area,
// that rcnt messages have been taken and their receives replaced.
// outstanding counts the credit writes not yet completed.
func (e *endpoint) sendCredit(rcnt int, outstanding *int) error {
	inline := e.cwr[0].Flags&verbs.SendInline != 0
	for *outstanding > 0 && (*outstanding >= e.p.sendDepth() || !inline) {
		if err := e.reapCredits(outstanding, true); err != nil {
			return err
		}
	}
	if err := e.reapCredits(outstanding, false); err != nil {
		return err
	}
	binary.NativeEndian.PutUint32(e.buf.Bytes()[0:4], uint32(rcnt))
	if _, err := e.qp.PostSend(e.cwr); err != nil {
		return fmt.Errorf("post a credit: %w", err)
	}
	*outstanding++
	if !inline {
		// The source is rewritten for the next credit: wait for this one.
		return e.reapCredits(outstanding, true)
	}
	return nil
}

// reapCredits takes the completions of credit writes; with wait, at least
// one.
func (e *endpoint) reapCredits(outstanding *int, wait bool) error {
	wc := e.wc[:min(*outstanding, len(e.wc))]
	if len(wc) == 0 {
		return nil
	}
	var n int
	if wait {
		var err error
		if n, err = e.waitCQ(e.scq, wc, e.p.Event); err != nil {
			return err
		}
	} else {
		n = e.scq.Poll(wc)
	}
	for i := range n {
		if err := check(&wc[i], verbs.WCRDMAWrite); err != nil {
			return fmt.Errorf("credit: %w", err)
		}
	}
	*outstanding -= n
	return nil
}

// A wait on a polled byte that has taken progressAfter loads polls the
// send CQ every progressSpins loads. (Polled from the start, shm0's 8 B
// write_lat took 0.25-0.28 µs one way rather than 0.22-0.23: its Writes
// land within a few hundred loads.)
const (
	progressAfter = 1024
	progressSpins = 64
)

// spin waits until the polled byte reads want. Once the wait has taken
// progressAfter loads, it also polls the send CQ for no completion (Poll
// of an empty slice) every progressSpins loads, as ucx_perftest's put_lat
// calls ucp_worker_progress while it polls memory: a provider that
// receives in software (tcp0) places the peer's Write in the polling
// goroutine, rather than leaving it to its receive goroutine, which an
// application that polls lets rest.
func (e *endpoint) spin(pb polledByte, want byte) error {
	for spins := 1; ; spins++ {
		if byte(atomic.LoadUint32(pb.word)>>pb.shift) == want {
			return nil
		}
		if spins >= progressAfter && spins%progressSpins == 0 {
			e.scq.Poll(nil)
		}
		if spins&0xffff == 0 {
			if err := e.alive(e.scq); err != nil {
				return err
			}
		}
	}
}

// ctrlSend sends a control message and waits for its completion.
func (e *endpoint) ctrlSend(kind byte, m ctrlMsg) error {
	b := e.buf.Bytes()[e.ctrlOff(ctrlSendOff):][:ctrlLen]
	encodeCtrl(b, kind, m)
	wr := []verbs.SendWR{{WRID: wrCtrlSend, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{e.buf.SGE(e.ctrlOff(ctrlSendOff), ctrlLen)}}}
	if _, err := e.qp.PostSend(wr); err != nil {
		return fmt.Errorf("post the control message: %w", err)
	}
	if _, err := e.waitCQ(e.scq, e.wc[:1], true); err != nil {
		return err
	}
	if e.wc[0].WRID != wrCtrlSend {
		return fmt.Errorf("expected the control message's completion, got one of WR %#x", e.wc[0].WRID)
	}
	return check(&e.wc[0], verbs.WCSend)
}

// postCtrlRecv posts the receive of the peer's control message.
func (e *endpoint) postCtrlRecv() error {
	if _, err := e.qp.PostRecv([]verbs.RecvWR{e.ctrlWR}); err != nil {
		return fmt.Errorf("post the control receive: %w", err)
	}
	return nil
}

// isCtrl keeps the completion of the control receive when a loop polls
// it among its data messages, and says so.
func (e *endpoint) isCtrl(wc *verbs.WorkCompletion) bool {
	if wc.WRID != wrCtrlRecv {
		return false
	}
	e.early, e.hasEarly = *wc, true
	return true
}

// ctrlRecv waits for the peer's control message of kind.
func (e *endpoint) ctrlRecv(kind byte) (ctrlMsg, error) {
	if e.hasEarly {
		e.wc[0], e.hasEarly = e.early, false
	} else if _, err := e.waitCQ(e.rcq, e.wc[:1], true); err != nil {
		return ctrlMsg{}, err
	}
	if e.wc[0].WRID != wrCtrlRecv {
		return ctrlMsg{}, fmt.Errorf("expected the peer's control message, got a completion of WR %#x", e.wc[0].WRID)
	}
	if err := check(&e.wc[0], verbs.WCRecv); err != nil {
		return ctrlMsg{}, err
	}
	b, err := verbs.Received(&e.wc[0], e.buf.Bytes()[e.ctrlOff(ctrlRecvOff):][:ctrlLen])
	if err != nil {
		return ctrlMsg{}, err
	}
	return decodeCtrl(b, kind)
}
