package rlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/goverbs/goverbs/verbs"
)

// receiver is the receiving end of a replicate or fetch connection: it
// owns the buffers the sender pushes frames into, checks every frame,
// appends the good ones to the member's log, and reports what it freed
// and what is durable.
//
// Buffers and receives. In ModeWrite the ring is Buffers buffers of
// BufferSize bytes the sender may RDMA Write, and Buffers+2 small control
// receives take START, the DATA announcements and a final ERROR; in
// ModeSend the Buffers+2 receives are themselves large enough for a DATA
// header and a full buffer of frames. The sender has at most Buffers DATA
// messages outstanding (a credit comes back with every buffer the
// receiver frees), so Buffers+2 receives always suffice: a Send never
// finds no receive posted.
type receiver struct {
	m      *Member
	k      *link
	mode   Mode
	ring   ringInfo
	ringMR *verbs.MR // ModeWrite: the buffers; ModeSend: the receive slots
	ctrlMR *verbs.MR // ModeWrite: the control receive slots
	sendMR *verbs.MR // HELLO, ERROR and STATUS slots
	nrecv  int
	slot   int // size of a receive slot
	epoch  uint64
	target uint64 // fetch: done once the log is durable up to this record

	started  bool
	expect   uint64 // next seq
	released uint64
	gen      uint32 // current generation of DATA
	nacked   bool   // a NACK of generation gen is outstanding
	dirty    bool   // something to report
	reported uint64 // durable last reported
	busy     [statusSlots]bool
	copyBuf  []byte

	wc     []verbs.WorkCompletion
	rwr    [1]verbs.RecvWR
	swr    [1]verbs.SendWR
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

const (
	statusSlots = 4
	helloSlot   = statusSlots
	errorSlot   = statusSlots + 1
	sendSlots   = statusSlots + 2
)

// newReceiver makes a receiving end's connection; prepare then registers
// its buffers and posts its receives, before the sender may send.
// epoch is the sender's epoch (no record may be newer); target, if not
// zero, ends the session once the log is durable up to it (fetch).
func newReceiver(m *Member, mode Mode, buffers, bufSize int, epoch, target uint64) (*receiver, error) {
	r := &receiver{m: m, mode: mode, epoch: epoch, target: target, nrecv: buffers + 2,
		ring: ringInfo{buffers: buffers, bufSize: bufSize}, done: make(chan struct{}),
		wc: make([]verbs.WorkCompletion, 16), copyBuf: make([]byte, bufSize)}
	k, err := newLink(m, r.nrecv+sendSlots+4, verbs.QPCap{MaxSendWR: sendSlots, MaxRecvWR: uint32(r.nrecv), MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return nil, err
	}
	r.k = k
	r.ctx, r.cancel = context.WithCancel(m.ctx)
	return r, nil
}

// prepare registers the receiver's buffers and posts its receives; on an
// error the caller closes the receiver.
func (r *receiver) prepare() error {
	k, mode, buffers, bufSize := r.k, r.mode, r.ring.buffers, r.ring.bufSize
	var err error
	if mode == ModeWrite {
		if r.ringMR, err = k.alloc(buffers*bufSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
			return err
		}
		r.ring.addr, r.ring.rkey = r.ringMR.Addr(), r.ringMR.RKey()
		if r.ctrlMR, err = k.alloc(r.nrecv*ctrlSize, verbs.AccessLocalWrite); err != nil {
			return err
		}
		r.slot = ctrlSize
	} else {
		r.slot = dataLen + bufSize
		if r.ctrlMR, err = k.alloc(r.nrecv*r.slot, verbs.AccessLocalWrite); err != nil {
			return err
		}
	}
	if r.sendMR, err = k.alloc(sendSlots*ctrlSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := range r.nrecv {
		if err := r.postRecv(i); err != nil {
			return err
		}
	}
	return nil
}

func (r *receiver) postRecv(i int) error {
	r.rwr[0] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{r.ctrlMR.SGE(i*r.slot, r.slot)}}
	_, err := r.k.qp.PostRecv(r.rwr[:])
	return err
}

func (r *receiver) sendSlot(i int) []byte { return r.sendMR.Bytes()[i*ctrlSize : (i+1)*ctrlSize] }

func (r *receiver) post(i int, m msg) error {
	r.swr[0] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{r.sendMR.SGE(i*ctrlSize, len(m))}}
	_, err := r.k.qp.PostSend(r.swr[:])
	return err
}

// stop ends the session and waits for run to return.
func (r *receiver) stop() {
	r.stopNoWait()
	<-r.done
}

func (r *receiver) stopNoWait() {
	r.cancel()
	r.k.disconnect()
}

// close releases the session's context and its link, once run has
// returned (or was never called).
func (r *receiver) close() {
	r.cancel()
	r.k.close()
}

// run serves the session until the connection ends (or, fetching, until
// the log holds the target durably).
func (r *receiver) run() (err error) {
	defer close(r.done)
	defer func() {
		if err != nil {
			r.sendError(err)
		}
	}()
	durable, unsubscribe := r.m.log.subscribe()
	defer unsubscribe()
	last, _ := r.m.log.Last()
	if err := r.post(helloSlot, putHello(r.sendSlot(helloSlot), r.epoch, r.m.log.First(), last, r.m.log.Durable(), r.m.log.history())); err != nil {
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	for _, wc := range r.k.takeStash() {
		if err := r.handle(wc); err != nil {
			return err
		}
	}
	for {
		if err := r.m.log.Err(); err != nil {
			return err
		}
		if r.started && r.target > 0 {
			if l, _ := r.m.log.Last(); l == r.target && r.m.log.Durable() >= r.target {
				return nil
			}
		}
		if err := r.report(); err != nil {
			return err
		}
		n, err := waitCQ(r.ctx, r.k.cq, r.wc, durable, nil)
		if err != nil {
			return err
		}
		for _, wc := range r.wc[:n] {
			if err := r.handle(wc); err != nil {
				return err
			}
		}
	}
}

// sendError tells the sender why the session ends, if the connection
// still stands.
func (r *receiver) sendError(err error) {
	if r.ctx.Err() != nil || isPeerGone(err) {
		return
	}
	r.post(errorSlot, putError(r.sendSlot(errorSlot), errorCode(err), err.Error()))
}

// report sends a STATUS if there is news and a slot to send it from.
func (r *receiver) report() error {
	if !r.started {
		return nil
	}
	durable := r.m.log.Durable()
	if !r.dirty && durable == r.reported {
		return nil
	}
	for i := range statusSlots {
		if r.busy[i] {
			continue
		}
		r.busy[i] = true
		if err := r.post(i, putStatus(r.sendSlot(i), r.released, durable, r.nacked, r.expect, r.gen)); err != nil {
			return fmt.Errorf("%w: %w", errPeerGone, err)
		}
		r.dirty, r.reported = false, durable
		return nil
	}
	return nil
}

// handle processes one completion.
func (r *receiver) handle(wc verbs.WorkCompletion) error {
	if wc.Status != verbs.WCSuccess {
		return wcError(wc)
	}
	if wc.Opcode != verbs.WCRecv {
		if wc.WRID < statusSlots {
			r.busy[wc.WRID] = false
		}
		return nil
	}
	i, b, err := receivedSlot(&wc, wc.WRID, r.nrecv, r.slot, r.ctrlMR.Bytes())
	var m msg
	if err == nil {
		m, err = parseMsg(b)
	}
	if err == nil {
		err = r.apply(m)
	}
	if err != nil {
		return err
	}
	if err := r.postRecv(i); err != nil {
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	return nil
}

// apply acts on a checked message.
func (r *receiver) apply(m msg) error {
	switch m.typ() {
	case msgStart:
		if r.started {
			return errMsg("a second START")
		}
		keep := m.startTruncate()
		last, _ := r.m.log.Last()
		if keep > last {
			return errMsg("START keeps records up to %d, but the log ends at %d", keep, last)
		}
		if err := r.m.log.truncate(keep); err != nil {
			return err
		}
		if keep < last {
			r.m.cfg.Logf("rlog: %s: cut the log back from record %d to %d, where it agrees with the sender", r.m.cfg.Listen, last, keep)
		}
		r.started, r.expect, r.gen, r.dirty = true, keep+1, m.startGen(), true
		return nil
	case msgData:
		if !r.started {
			return errMsg("DATA before START")
		}
		return r.data(m)
	case msgError:
		return fmt.Errorf("the sender ended the session: %w", codeError(m.errCode(), m.errText()))
	}
	return errMsg("unexpected message type %d from a sender", m.typ())
}

// data takes in a batch: it copies the frames out of the buffer, checks
// each — checksum, the sequence number expected next, an epoch neither
// older than the log's last nor newer than the sender's — appends the
// good prefix, frees the buffer, and NACKs the batch if a frame failed.
func (r *receiver) data(m msg) error {
	gen := m.dataGen()
	switch {
	case gen < r.gen || (gen == r.gen && r.nacked):
		// A batch sent before the sender saw our NACK: drop it.
		r.released++
		r.dirty = true
		return nil
	case gen > r.gen:
		r.gen, r.nacked = gen, false
	}
	var frames []byte
	n := m.dataBytes()
	if r.mode == ModeWrite {
		if len(m) != dataLen || m.dataBuf() >= r.ring.buffers || n > r.ring.bufSize {
			return errMsg("DATA names %d bytes in buffer %d of %d buffers of %d bytes", n, m.dataBuf(), r.ring.buffers, r.ring.bufSize)
		}
		off := m.dataBuf() * r.ring.bufSize
		frames = r.ringMR.Bytes()[off : off+n]
	} else {
		if len(m) != dataLen+n || n > r.ring.bufSize {
			return errMsg("DATA of %d bytes carries %d bytes of frames", len(m), n)
		}
		frames = m[dataLen:]
	}
	// Copy first: the frames checked are the frames written, whatever
	// the sender does to the buffer meanwhile.
	buf := r.copyBuf[:copy(r.copyBuf, frames)]
	_, lastEpoch := r.m.log.Last()
	good, count, bad := 0, 0, error(nil)
	if m.dataFirst() != r.expect {
		bad = fmt.Errorf("batch starts at record %d, expected %d", m.dataFirst(), r.expect)
	}
	for bad == nil && good < len(buf) {
		f, size, err := parseFrame(buf[good:], MaxRecordLimit)
		switch {
		case err != nil:
			bad = fmt.Errorf("record %d: %w", r.expect+uint64(count), err)
		case f.seq() != r.expect+uint64(count):
			bad = fmt.Errorf("record %d where %d was expected", f.seq(), r.expect+uint64(count))
		case f.epoch() < lastEpoch || f.epoch() > r.epoch || f.epoch() == 0:
			bad = fmt.Errorf("record %d of epoch %d after epoch %d, from a sender of epoch %d", f.seq(), f.epoch(), lastEpoch, r.epoch)
		default:
			lastEpoch = f.epoch()
			good += size
			count++
		}
	}
	if bad == nil && count != m.dataCount() {
		bad = fmt.Errorf("batch of %d records holds %d", m.dataCount(), count)
	}
	if good > 0 {
		if err := r.m.log.append(buf[:good]); err != nil {
			return err
		}
		r.m.log.requestSync()
		r.expect += uint64(count)
	}
	if bad != nil {
		r.m.cfg.Logf("rlog: %s: refused a batch (NACK, record %d asked for again): %v", r.m.cfg.Listen, r.expect, bad)
		r.nacked = true
	}
	r.released++
	r.dirty = true
	return nil
}

// isPeerGone reports whether err is the connection breaking.
func isPeerGone(err error) bool { return errors.Is(err, errPeerGone) }
