package verbs_test

import (
	"fmt"

	"github.com/goverbs/goverbs/verbs"
)

// Granting a peer part of a region through a type 2 memory window, and
// revoking it: the owner binds the window to 16 bytes of its region with
// remote read only, on the QP of that peer; the peer reads through the
// window's key; the owner invalidates the window with OpLocalInv, and the
// same Read then fails with a remote access error. The region's own key
// never leaves the owner.
func ExampleMW() {
	owner, err := verbs.Open("loop0")
	check(err)
	defer owner.Close()
	opd, err := owner.AllocPD()
	check(err)
	// AccessMWBind lets windows be bound to the region; a window's
	// rights are a subset of the region's.
	region, err := opd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessMWBind)
	check(err)
	copy(region.Bytes()[100:], "for the peer....")

	peer, err := verbs.Open("loop0")
	check(err)
	defer peer.Close()
	ppd, err := peer.AllocPD()
	check(err)
	buf, err := ppd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)

	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	ocq, err := owner.CreateCQ(16)
	check(err)
	oqp, err := opd.CreateQP(verbs.QPInitAttr{SendCQ: ocq, RecvCQ: ocq, Cap: qpCap})
	check(err)
	pcq, err := peer.CreateCQ(16)
	check(err)
	pqp, err := ppd.CreateQP(verbs.QPInitAttr{SendCQ: pcq, RecvCQ: pcq, Cap: qpCap})
	check(err)
	connect(oqp, pqp.Num())
	connect(pqp, oqp.Num())
	wc := make([]verbs.WorkCompletion, 1)
	poll := func(cq *verbs.CQ) verbs.WorkCompletion {
		for cq.Poll(wc) == 0 {
		}
		return wc[0]
	}

	// Grant: bind the window on the peer's QP; once the bind has
	// completed, RKey is the key to hand the peer.
	mw, err := opd.AllocMW(verbs.MWType2)
	check(err)
	_, err = oqp.PostSend([]verbs.SendWR{mw.Bind(1, region, region.Addr()+100, 16, verbs.AccessRemoteRead, verbs.SendSignaled)})
	check(err)
	c := poll(ocq)
	fmt.Println(c.Opcode, c.Status)
	addr, key := region.Addr()+100, mw.RKey()

	read := func(wrid uint64) verbs.WorkCompletion {
		_, err := pqp.PostSend([]verbs.SendWR{{WRID: wrid, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{buf.SGE(0, 16)}, RemoteAddr: addr, RKey: key}})
		check(err)
		return poll(pcq)
	}
	c = read(2)
	fmt.Println(c.Opcode, c.Status, fmt.Sprintf("%q", buf.Bytes()[:16]))

	// Revoke: once the invalidation has completed, nothing reaches the
	// region through the key.
	_, err = oqp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.OpLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: key}})
	check(err)
	c = poll(ocq)
	fmt.Println(c.Opcode, c.Status)
	c = read(4)
	fmt.Println(c.Opcode, c.Status)
	check(mw.Dealloc())
	// Output:
	// BIND_MW success
	// RDMA_READ success "for the peer...."
	// LOCAL_INV success
	// RDMA_READ remote access error
}
