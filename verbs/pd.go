package verbs

import (
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/verbs/driver"
)

// users counts the objects that depend on another one, so that destroying
// it while they live is refused, as ibverbs refuses with EBUSY.
type users struct{ n atomic.Int32 }

func (u *users) add()  { u.n.Add(1) }
func (u *users) done() { u.n.Add(-1) }

// check returns ErrBusy if anything still depends on the object.
func (u *users) check(what string) error {
	if n := u.n.Load(); n > 0 {
		return fmt.Errorf("verbs: destroy %s: %w (%d objects still use it)", what, ErrBusy, n)
	}
	return nil
}

// PD is a protection domain: memory regions, QPs and SRQs created on it may
// be used only with each other.
type PD struct {
	ctx   *Context
	d     driver.PD
	users users
}

// Context returns the device context the PD belongs to.
func (p *PD) Context() *Context { return p.ctx }

func checkAccess(access AccessFlags) error {
	if access&^(RemoteAccess|AccessLocalWrite|AccessMWBind) != 0 {
		return fmt.Errorf("%w: unknown access flags %v", ErrInvalidArg, access)
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return fmt.Errorf("%w: remote write and remote atomic access need AccessLocalWrite too", ErrInvalidArg)
	}
	return nil
}

// AllocMR allocates size bytes of memory chosen by the provider and
// registers it with the given access. This is the fast path for memory
// peers access: a provider can place it where a peer process can map it.
func (p *PD) AllocMR(size int, access AccessFlags) (*MR, error) {
	if err := checkAccess(access); err != nil {
		return nil, fmt.Errorf("verbs: alloc MR: %w", err)
	}
	if size <= 0 || uint64(size) > p.ctx.attr.MaxMRSize {
		return nil, fmt.Errorf("verbs: alloc MR of %d bytes: %w (the device allows 1 to %d)", size, ErrInvalidArg, p.ctx.attr.MaxMRSize)
	}
	d, err := p.d.AllocMR(size, access)
	if err != nil {
		return nil, fmt.Errorf("verbs: alloc MR: %w", err)
	}
	return p.newMR(d), nil
}

// RegMR registers memory the caller owns (ibv_reg_mr). The caller keeps buf
// alive until Dereg and must not hand it to anything that could move it.
func (p *PD) RegMR(buf []byte, access AccessFlags) (*MR, error) {
	if err := checkAccess(access); err != nil {
		return nil, fmt.Errorf("verbs: reg MR: %w", err)
	}
	if len(buf) == 0 || uint64(len(buf)) > p.ctx.attr.MaxMRSize {
		return nil, fmt.Errorf("verbs: reg MR of %d bytes: %w (the device allows 1 to %d)", len(buf), ErrInvalidArg, p.ctx.attr.MaxMRSize)
	}
	d, err := p.d.RegMR(buf, access)
	if err != nil {
		return nil, fmt.Errorf("verbs: reg MR: %w", err)
	}
	return p.newMR(d), nil
}

func (p *PD) newMR(d driver.MR) *MR {
	p.users.add()
	return &MR{pd: p, d: d, lkey: d.LKey(), rkey: d.RKey(), addr: d.Addr(), buf: d.Bytes(), access: d.Access()}
}

// QPInitAttr are the creation attributes of a queue pair.
type QPInitAttr struct {
	// SendCQ and RecvCQ receive the QP's completions; they may be the same.
	SendCQ *CQ
	RecvCQ *CQ
	// SRQ, if set, supplies the receives instead of the QP's own queue.
	SRQ *SRQ
	Cap QPCap
	// SigAll: every send WR produces a completion, SendSignaled or not.
	SigAll bool
}

// CreateQP creates a reliable-connected queue pair in the Reset state
// (ibv_create_qp).
func (p *PD) CreateQP(attr QPInitAttr) (*QP, error) {
	if attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, fmt.Errorf("verbs: create QP: %w: SendCQ and RecvCQ are required", ErrInvalidArg)
	}
	a := p.ctx.attr
	c := attr.Cap
	if int(c.MaxSendWR) > a.MaxQPWR || int(c.MaxRecvWR) > a.MaxQPWR || int(c.MaxSendSGE) > a.MaxSGE ||
		int(c.MaxRecvSGE) > a.MaxSGE || int(c.MaxInlineData) > a.MaxInlineData || c.MaxSendWR == 0 {
		return nil, fmt.Errorf("verbs: create QP with %+v: %w (device limits: %d WRs, %d SGEs, %d inline bytes; MaxSendWR must be at least 1)",
			c, ErrInvalidArg, a.MaxQPWR, a.MaxSGE, a.MaxInlineData)
	}
	if attr.SRQ == nil && c.MaxRecvWR == 0 {
		return nil, fmt.Errorf("verbs: create QP: %w: MaxRecvWR must be at least 1 without an SRQ", ErrInvalidArg)
	}
	if attr.SRQ != nil && attr.SRQ.pd != p {
		return nil, fmt.Errorf("verbs: create QP: %w: the SRQ belongs to another PD; create it on the QP's PD, whose memory its receives must be in", ErrInvalidArg)
	}
	q := &QP{pd: p, sendCQ: attr.SendCQ, recvCQ: attr.RecvCQ, srq: attr.SRQ}
	da := driver.QPInitAttr{Type: QPTypeRC, SendCQ: attr.SendCQ.d, RecvCQ: attr.RecvCQ.d, Cap: c, SigAll: attr.SigAll, UserCtx: q}
	if attr.SRQ != nil {
		da.SRQ = attr.SRQ.d
	}
	d, err := p.d.CreateQP(da)
	if err != nil {
		return nil, fmt.Errorf("verbs: create QP: %w", err)
	}
	q.d = d
	q.num = d.Num()
	p.users.add()
	attr.SendCQ.users.add()
	attr.RecvCQ.users.add()
	if attr.SRQ != nil {
		attr.SRQ.users.add()
	}
	return q, nil
}

// SRQInitAttr are the creation attributes of a shared receive queue.
type SRQInitAttr struct {
	MaxWR  uint32
	MaxSGE uint32
	// Limit arms the limit event at creation (0: unarmed).
	Limit uint32
}

// CreateSRQ creates a shared receive queue (ibv_create_srq).
func (p *PD) CreateSRQ(attr SRQInitAttr) (*SRQ, error) {
	a := p.ctx.attr
	if !a.Has(CapSRQ) {
		return nil, fmt.Errorf("verbs: create SRQ: %w", ErrUnsupported)
	}
	if attr.MaxWR == 0 || int(attr.MaxWR) > a.MaxSRQWR || int(attr.MaxSGE) > a.MaxSRQSGE || attr.Limit > attr.MaxWR {
		return nil, fmt.Errorf("verbs: create SRQ with %+v: %w (device limits: %d WRs, %d SGEs)", attr, ErrInvalidArg, a.MaxSRQWR, a.MaxSRQSGE)
	}
	s := &SRQ{pd: p}
	d, err := p.d.CreateSRQ(driver.SRQInitAttr{MaxWR: attr.MaxWR, MaxSGE: attr.MaxSGE, Limit: attr.Limit, UserCtx: s})
	if err != nil {
		return nil, fmt.Errorf("verbs: create SRQ: %w", err)
	}
	s.d = d
	p.users.add()
	return s, nil
}

// Dealloc frees the protection domain (ibv_dealloc_pd). It fails with
// ErrBusy while regions, QPs or SRQs created on it live.
func (p *PD) Dealloc() error {
	p.ctx.life.RLock()
	defer p.ctx.life.RUnlock()
	if err := p.ctx.closedErr("dealloc PD"); err != nil {
		return err
	}
	if err := p.users.check("PD"); err != nil {
		return err
	}
	return p.d.Dealloc()
}

// MR is a registered memory region.
type MR struct {
	pd     *PD
	d      driver.MR
	lkey   uint32
	rkey   uint32
	addr   uint64
	buf    []byte
	access AccessFlags
	dereg  atomic.Bool
}

// LKey is the key local work requests use in their SGEs.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey is the key a peer uses to access the region remotely.
func (m *MR) RKey() uint32 { return m.rkey }

// Addr is the virtual address of the region's first byte, the address
// SGEs and peers name it by.
func (m *MR) Addr() uint64 { return m.addr }

// Len is the region's length in bytes.
func (m *MR) Len() int { return len(m.buf) }

// Bytes is the region's memory. Peers may read and write it at any time
// their access allows; synchronise through completions.
func (m *MR) Bytes() []byte { return m.buf }

// Access returns the access rights the region was registered with.
func (m *MR) Access() AccessFlags { return m.access }

// PD returns the protection domain of the region.
func (m *MR) PD() *PD { return m.pd }

// SGE returns the scatter/gather element for n bytes at offset off of the
// region. It does not check bounds: the provider does, at post time.
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.addr + uint64(off), Length: uint32(n), LKey: m.lkey}
}

// Dereg deregisters the region (ibv_dereg_mr): later local or remote access
// with its keys fails. AllocMR memory is released and must not be used again.
func (m *MR) Dereg() error {
	m.pd.ctx.life.RLock()
	defer m.pd.ctx.life.RUnlock()
	if m.dereg.Swap(true) {
		return fmt.Errorf("verbs: dereg MR: %w", ErrClosed)
	}
	if err := m.pd.ctx.closedErr("dereg MR"); err != nil {
		m.pd.users.done()
		return err
	}
	if err := m.d.Dereg(); err != nil {
		m.dereg.Store(false)
		return fmt.Errorf("verbs: dereg MR: %w", err)
	}
	m.pd.users.done()
	return nil
}
