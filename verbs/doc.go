// Package verbs is the RDMA verbs API for Go: devices, protection domains,
// registered memory regions with local and remote keys, completion queues,
// reliable-connected queue pairs, shared receive queues, and the work
// requests that move data between them — send/recv (message semantics) and
// RDMA Read, Write and atomics (memory semantics).
//
// It mirrors libibverbs in Go form. A program opens a device, allocates a
// protection domain, registers memory, creates completion queues and a queue
// pair, connects the queue pair (usually with package cm), posts work
// requests and polls or waits for their completions:
//
//	ctx, _ := verbs.Open("loop0")
//	pd, _ := ctx.AllocPD()
//	mr, _ := pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
//	cq, _ := ctx.CreateCQ(64)
//	qp, _ := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
//	// connect qp with cm.Dial, then:
//	wr := []verbs.SendWR{{Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
//		SGList: []verbs.SGE{mr.SGE(0, 8)}, RemoteAddr: raddr, RKey: rkey}}
//	qp.PostSend(wr)
//	wc := make([]verbs.WorkCompletion, 1)
//	for cq.Poll(wc) == 0 {
//	}
//
// The package's Example runs these steps whole on loop0, connecting the
// QPs by hand; package cm's examples connect them as a client and a
// server do.
//
// Devices come from providers, which register themselves when imported
// for their side effect: provider/loop (device loop0, both ends in one
// process), provider/shm (shm0, processes of one host over shared memory)
// and provider/iwarp (tcp0, iWARP over TCP across hosts, interoperating
// with Linux siw). Import the ones the program may use:
//
//	import _ "github.com/goverbs/goverbs/provider/shm"
//
// # Concurrency
//
// Every object is safe for concurrent use by multiple goroutines, as
// ibverbs objects are thread-safe: several goroutines may post to one QP,
// or poll one CQ, at once. Destroying an object while another goroutine
// still uses it is a programming error, as it is in C; the destroy order is
// enforced (a CQ in use by a QP, or a PD with live regions, cannot be
// destroyed).
//
// # The data path
//
// QP.PostSend, QP.PostRecv, SRQ.PostRecv and CQ.Poll are the data path.
// Each is one call into the provider and allocates nothing: keep the work
// request and completion slices and reuse them.
package verbs
