package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// ctrlSlots is how many receives the control QP keeps posted: perftest
// sends its next message only once this side has answered the last one,
// so one would do; more cost nothing.
const ctrlSlots = 4

// ctrl is the control connection: a QP whose receives are posted before
// it connects (perftest's client sends as soon as it is connected), and
// a region of ctrlSlots receive slots and one send slot, each destLen
// bytes, the largest control message.
type ctrl struct {
	scq, rcq *verbs.CQ
	ep       *cm.Endpoint
	mr       *verbs.MR
	conn     *cm.Conn
	wc       []verbs.WorkCompletion
}

func newCtrl(pd *verbs.PD) (c *ctrl, err error) {
	c = &ctrl{wc: make([]verbs.WorkCompletion, 1)}
	defer func() {
		if err != nil {
			c.close()
			c = nil
		}
	}()
	dev := pd.Context()
	if c.scq, err = dev.CreateCQ(2); err != nil {
		return nil, err
	}
	if c.rcq, err = dev.CreateCQ(ctrlSlots); err != nil {
		return nil, err
	}
	if c.ep, err = cm.NewEndpointAccess(pd, verbs.QPInitAttr{SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: ctrlSlots, MaxSendSGE: 1, MaxRecvSGE: 1}}, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.mr, err = pd.AllocMR((ctrlSlots+1)*destLen, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	for slot := range ctrlSlots {
		if err = c.post(slot); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// post posts the receive of slot.
func (c *ctrl) post(slot int) error {
	if _, err := c.ep.QP().PostRecv([]verbs.RecvWR{{WRID: uint64(slot), SGList: []verbs.SGE{c.mr.SGE(slot*destLen, destLen)}}}); err != nil {
		return fmt.Errorf("post a control receive: %w", err)
	}
	return nil
}

// send sends b (at most destLen bytes) and waits for its completion.
func (c *ctrl) send(ctx context.Context, b []byte) error {
	off := ctrlSlots * destLen
	copy(c.mr.Bytes()[off:], b)
	if _, err := c.ep.QP().PostSend([]verbs.SendWR{{WRID: ctrlSlots, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{c.mr.SGE(off, len(b))}}}); err != nil {
		return fmt.Errorf("post a control message: %w", err)
	}
	if _, err := c.scq.Wait(ctx, c.wc); err != nil {
		return fmt.Errorf("waiting for a control message's completion: %w", err)
	}
	return checkWC(&c.wc[0], verbs.WCSend)
}

// recv waits for the peer's next message, which must be n bytes long,
// returns a copy of it and posts its slot's receive again.
func (c *ctrl) recv(ctx context.Context, n int) ([]byte, error) {
	if _, err := c.rcq.Wait(ctx, c.wc); err != nil {
		return nil, fmt.Errorf("waiting for the peer's control message: %w", err)
	}
	wc := &c.wc[0]
	if err := checkWC(wc, verbs.WCRecv); err != nil {
		return nil, err
	}
	if wc.WRID >= ctrlSlots {
		return nil, fmt.Errorf("a control receive completed with work request ID %d, not one of the %d posted", wc.WRID, ctrlSlots)
	}
	if wc.ByteLen != uint32(n) {
		return nil, fmt.Errorf("the peer's control message has %d bytes, want %d", wc.ByteLen, n)
	}
	slot := int(wc.WRID)
	b := append([]byte(nil), c.mr.Bytes()[slot*destLen:][:n]...)
	return b, c.post(slot)
}

// xchg is one of perftest's exchanges: the client sends mine and
// receives the server's, the server receives the client's and answers
// with mine. The peer's message must be n bytes long.
func (c *ctrl) xchg(ctx context.Context, client bool, mine []byte, n int) ([]byte, error) {
	if client {
		if err := c.send(ctx, mine); err != nil {
			return nil, err
		}
		return c.recv(ctx, n)
	}
	b, err := c.recv(ctx, n)
	if err != nil {
		return nil, err
	}
	return b, c.send(ctx, mine)
}

func (c *ctrl) close() error {
	return closeAll(c.conn, c.ep, c.mr, c.scq, c.rcq)
}

// recvDepth is how many of send_lat's receives are posted at once; each
// one taken is posted again until -n have been.
const recvDepth = 64

// dataEP is the test's connection: its QP and CQs.
type dataEP struct {
	scq, rcq *verbs.CQ
	ep       *cm.Endpoint
	conn     *cm.Conn
	wc       []verbs.WorkCompletion
	recvs    []verbs.RecvWR // the one receive send_lat posts again
	posted   int            // receives posted
}

func newDataEP(pd *verbs.PD, cfg config) (d *dataEP, err error) {
	d = &dataEP{wc: make([]verbs.WorkCompletion, 1)}
	defer func() {
		if err != nil {
			d.close()
			d = nil
		}
	}()
	dev := pd.Context()
	depth := min(cfg.iters, recvDepth)
	if d.scq, err = dev.CreateCQ(2); err != nil {
		return nil, err
	}
	if d.rcq, err = dev.CreateCQ(depth); err != nil {
		return nil, err
	}
	d.ep, err = cm.NewEndpointAccess(pd, verbs.QPInitAttr{SendCQ: d.scq, RecvCQ: d.rcq,
		Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: uint32(depth), MaxSendSGE: 1, MaxRecvSGE: 1}},
		verbs.AccessLocalWrite|cfg.test.access())
	if err != nil {
		return nil, err
	}
	return d, nil
}

// postRecvs posts n receives of size bytes at off of mr, and keeps the
// work request to post again.
func (d *dataEP) postRecvs(mr *verbs.MR, off, size, n int) error {
	d.recvs = []verbs.RecvWR{{SGList: []verbs.SGE{mr.SGE(off, size)}}}
	for range n {
		if err := d.postRecv(); err != nil {
			return err
		}
	}
	return nil
}

func (d *dataEP) postRecv() error {
	d.recvs[0].WRID = uint64(d.posted)
	if _, err := d.ep.QP().PostRecv(d.recvs); err != nil {
		return fmt.Errorf("post receive %d: %w", d.posted+1, err)
	}
	d.posted++
	return nil
}

func (d *dataEP) close() error {
	return closeAll(d.conn, d.ep, nil, d.scq, d.rcq)
}

// closeAll disconnects conn and destroys ep's QP, then mr and the CQs,
// each when it is not nil.
func closeAll(conn *cm.Conn, ep *cm.Endpoint, mr *verbs.MR, cqs ...*verbs.CQ) error {
	var errs []error
	if conn != nil {
		conn.Close()
	}
	if ep != nil {
		errs = append(errs, ep.Destroy())
	}
	if mr != nil {
		errs = append(errs, mr.Dereg())
	}
	for _, cq := range cqs {
		if cq != nil {
			errs = append(errs, cq.Destroy())
		}
	}
	return errors.Join(errs...)
}

// checkWC returns an error unless wc is a successful completion of op.
func checkWC(wc *verbs.WorkCompletion, op verbs.WCOpcode) error {
	if wc.Status != verbs.WCSuccess {
		return fmt.Errorf("a %v work request (ID %d) completed with status %v (vendor error %#x)", op, wc.WRID, wc.Status, wc.VendorErr)
	}
	if wc.Opcode != op {
		return fmt.Errorf("a %v completion where a %v was due", wc.Opcode, op)
	}
	return nil
}
