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
//
// # Portability
//
// A program that keeps these rules runs unchanged on loop0, shm0 and tcp0,
// and on the RDMA devices of rdma-core.
//
// Post receives before connecting. A Send, or an RDMA Write with
// immediate data, that finds no receive posted meets a different fate on
// each device. Devices that declare CapRNRRetry in DeviceAttr.Caps, as
// loop0 and shm0 do (and InfiniBand and RoCE devices), make the sender
// retry every
// MinRNRTimer, up to the connection's RNRRetry count (cm's default, 7,
// retries forever); each retry costs the sender that long. Devices
// without it (tcp0, and iWARP devices such as siw) have no such
// retry: the receiver ends the connection, both QPs move to the error
// state, and the Send completes with WCRNRRetryExcErr. So make the QP
// with cm.NewEndpoint, which moves it to Init, post its receives, and
// only then Dial or Accept; receives posted in Init are kept. After
// that, keep a receive posted for every message the peer may send (the
// application's protocol grants the peer credits), as on any RDMA device.
//
// Atomics (OpAtomicCmpAndSwp, OpAtomicFetchAndAdd) work on one 8-byte
// word. Its remote address must be a multiple of 8; an atomic on any
// other address completes with WCRemInvReqErr and the QP moves to the
// error state. The local buffer, which receives the word's previous
// value, is 8 bytes in one or more SGEs, with no alignment required.
// loop0, shm0 and tcp0 operate on the word in the byte order of the host
// that holds it (little-endian on amd64 and arm64), as sync/atomic and
// encoding/binary.NativeEndian see it, and write the previous value in
// the byte order of the host that asked; tcp0 carries the operands
// big-endian on the wire (RFC 7306) and converts at both ends. On these
// three devices an RDMA atomic is atomic also with respect to the word's
// owner using sync/atomic on it (AtomicGlob). Other devices declare what
// they guarantee in DeviceAttr.AtomicCap; AtomicNone means no atomics.
//
// Remote atomics reach only a region registered with AccessRemoteAtomic
// (which needs AccessLocalWrite), through a QP connected with responder
// resources (cm offers the device's maximum). On shm0 that region must
// lie in memory from AllocMR, which is shared with the peer (RegMR of
// part of it will do); RegMR of other Go memory refuses
// AccessRemoteAtomic with ErrUnsupported. On tcp0 both
// ends must be goverbs, which negotiate RFC 7306: connected to another
// iWARP implementation such as siw, PostSend refuses atomics with
// ErrUnsupported.
package verbs
