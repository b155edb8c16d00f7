package ibverbs

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// srq is a shared receive queue (struct ibv_srq).
type srq struct {
	pd      *pd
	p       uintptr
	maxSGE  uint32
	entries uint32
	userCtx any
	gone    atomic.Bool
	// limit is the limit last armed, disarmed (0) by the limit event:
	// Query's answer where the device has no ibv_query_srq (siw).
	limit atomic.Uint32

	mu   sync.Mutex // rwr, and the SRQ's life
	rwr  [postBatch]ibvRecvWR
	bad  uintptr // post_srq_recv's bad_wr
	post cargs   // post_srq_recv with its arguments: the SRQ, rwr, bad
}

func (d *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	c := d.ctx
	if c.attr.Caps&driver.CapSRQ == 0 {
		return nil, fmt.Errorf("%w: %s has no SRQs", driver.ErrUnsupported, c.name)
	}
	if a.MaxWR == 0 || int(a.MaxWR) > c.attr.MaxSRQWR || int(a.MaxSGE) > c.attr.MaxSRQSGE || a.Limit > a.MaxWR {
		return nil, fmt.Errorf("%w: SRQ of %d WRs, %d SGEs, limit %d (the device allows %d WRs, %d SGEs)",
			driver.ErrInvalidArg, a.MaxWR, a.MaxSGE, a.Limit, c.attr.MaxSRQWR, c.attr.MaxSRQSGE)
	}
	ia := ibvSRQInitAttr{attr: ibvSRQAttr{maxWR: a.MaxWR, maxSGE: max(a.MaxSGE, 1), srqLimit: a.Limit}}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, driver.ErrClosed
	}
	p, err := callPtr(lib.createSRQ, d.p, uintptr(unsafe.Pointer(&ia)))
	if err != nil {
		return nil, errnoErr("ibv_create_srq", err)
	}
	// ibv_create_srq reports the sizes the device gave, which may be
	// larger than asked for: the SRQ holds that many.
	s := &srq{pd: d, p: p, maxSGE: ia.attr.maxSGE, entries: ia.attr.maxWR, userCtx: a.UserCtx}
	s.post = cargs{fn: c.postSRQRecv, a: [6]uintptr{p, uintptr(unsafe.Pointer(&s.rwr[0])), uintptr(unsafe.Pointer(&s.bad))}}
	d.srqs[s] = struct{}{}
	c.own(p, s)
	return s, nil
}

func (s *srq) PostRecv(wrs []driver.RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return 0, driver.ErrClosed
	}
	if s.pd.ctx.removed.Load() {
		return 0, s.pd.ctx.removedErr()
	}
	return postRecvs(&s.post, &s.rwr, &s.bad, wrs, s.maxSGE, "post_srq_recv")
}

func (s *srq) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	limit, set, err := soft.SRQLimit(a, mask, s.entries, "ibverbs")
	if err != nil || !set {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return driver.ErrClosed
	}
	attr := ibvSRQAttr{srqLimit: limit}
	if err := callInt(lib.modifySRQ, s.p, uintptr(unsafe.Pointer(&attr)), ibvSRQLimit); err != nil {
		return errnoErr("ibv_modify_srq", err)
	}
	s.limit.Store(limit)
	return nil
}

func (s *srq) Query() (driver.SRQAttr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	var attr ibvSRQAttr
	if err := callInt(lib.querySRQ, s.p, uintptr(unsafe.Pointer(&attr))); err != nil {
		err = errnoErr("ibv_query_srq", err)
		if !errors.Is(err, driver.ErrUnsupported) {
			return driver.SRQAttr{}, err
		}
		// libsiw has no ibv_query_srq: the sizes are the ones
		// ibv_create_srq gave, the limit the one armed.
		attr.srqLimit = s.limit.Load()
	}
	return driver.SRQAttr{MaxWR: s.entries, MaxSGE: s.maxSGE, Limit: attr.srqLimit}, nil
}

func (s *srq) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return driver.ErrClosed
	}
	if err := callInt(lib.destroySRQ, s.p); err != nil {
		return errnoErr("ibv_destroy_srq", err)
	}
	s.gone.Store(true)
	s.pd.ctx.disown(s.p)
	s.pd.mu.Lock()
	delete(s.pd.srqs, s)
	s.pd.mu.Unlock()
	return nil
}
