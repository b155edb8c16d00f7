package verbs_test

import (
	"fmt"
	"log"

	"github.com/goverbs/goverbs/verbs"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0
)

// check ends the example on an error.
func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// connect moves qp from Reset through Init and RTR to RTS, connected to
// the QP numbered dest, as an ibverbs program does after exchanging QP
// numbers with its peer. Package cm does all of this, and the exchange,
// for a program that dials or accepts; by hand it works on loop0, whose
// QPs find their peer by number.
func connect(qp *verbs.QP, dest uint32) {
	check(qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1,
		AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags))
	check(qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: verbs.MTU4096, DestQPNum: dest,
		MaxDestRdAtomic: 1, MinRNRTimer: 1},
		verbs.QPAttrState|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|
			verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer))
	check(qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|
			verbs.QPAttrRNRRetry|verbs.QPAttrMaxQPRdAtomic))
}

// The verbs from start to end, on the in-process device loop0: open a
// device, register memory, create a CQ and a QP on each side, connect the
// QPs, then write into the peer's memory with an RDMA Write and read it
// back with an RDMA Read, polling the CQ for each completion. The peer's
// CPU takes no part in either.
func Example() {
	// Each side opens the device and registers its memory. The target
	// grants remote access; the initiator's buffer only local writes,
	// which an RDMA Read needs to land in it.
	target, err := verbs.Open("loop0")
	check(err)
	defer target.Close()
	tpd, err := target.AllocPD()
	check(err)
	remote, err := tpd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	check(err)

	dev, err := verbs.Open("loop0")
	check(err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	check(err)
	buf := make([]byte, 64)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	check(err)

	// A CQ and a QP on each side, connected to each other.
	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	tcq, err := target.CreateCQ(16)
	check(err)
	tqp, err := tpd.CreateQP(verbs.QPInitAttr{SendCQ: tcq, RecvCQ: tcq, Cap: qpCap})
	check(err)
	cq, err := dev.CreateCQ(16)
	check(err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap})
	check(err)
	connect(qp, tqp.Num())
	connect(tqp, qp.Num())

	// The peer's address and rkey are what the initiator needs; a real
	// program learns them in a message (cm's private data, or a Send).
	raddr, rkey := remote.Addr(), remote.RKey()
	wc := make([]verbs.WorkCompletion, 1)
	poll := func() verbs.WorkCompletion {
		for cq.Poll(wc) == 0 {
		}
		return wc[0]
	}

	// RDMA Write: the local bytes named by the SGE go to the remote address.
	n := copy(buf, "Hello, RDMA!")
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{mr.SGE(0, n)}, RemoteAddr: raddr, RKey: rkey}})
	check(err)
	c := poll()
	fmt.Println(c.WRID, c.Opcode, c.Status)
	fmt.Printf("target's memory: %q\n", remote.Bytes()[:n])

	// RDMA Read: the remote bytes come back into the second half of buf.
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{mr.SGE(32, n)}, RemoteAddr: raddr, RKey: rkey}})
	check(err)
	c = poll()
	fmt.Println(c.WRID, c.Opcode, c.Status, c.ByteLen, "bytes")
	fmt.Printf("read back: %q\n", buf[32:32+c.ByteLen])

	// A wrong rkey never reaches memory: the Read fails, and the QP
	// moves to the error state.
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{mr.SGE(32, n)}, RemoteAddr: raddr, RKey: rkey + 1}})
	check(err)
	c = poll()
	fmt.Println(c.WRID, c.Opcode, c.Status, qp.State())
	// Output:
	// 1 RDMA_WRITE success
	// target's memory: "Hello, RDMA!"
	// 2 RDMA_READ success 12 bytes
	// read back: "Hello, RDMA!"
	// 3 RDMA_READ remote access error ERR
}
