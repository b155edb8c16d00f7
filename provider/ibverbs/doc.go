// Package ibverbs is the goverbs provider of the RDMA devices the kernel
// has: hardware (mlx5, irdma, efa, ...) and the kernel's own software
// devices rxe (RoCE v2) and siw (iWARP), each under its kernel name
// ("rxe0", "siw0", "mlx5_0"). Import it for its side effects:
//
//	import _ "github.com/goverbs/goverbs/provider/ibverbs"
//
// It drives rdma-core's libibverbs.so.1 and librdmacm.so.1, loaded at run
// time with github.com/ebitengine/purego rather than linked with cgo, so a
// program that imports it still builds with CGO_ENABLED=0 and runs where
// rdma-core is absent: the provider then lists no device and Available
// says why. (A CGO_ENABLED=0 binary that imports it is linked dynamically
// against the C library, which purego needs to load libraries.) Run-time
// loading is sound here because everything crosses the boundary as plain
// memory: the C structures the provider builds are declared in Go with
// their C layout, checked field by field against the headers by a cgo-built
// test, and the data path passes only memory the provider owns and keeps
// alive.
//
// The data path makes one foreign call per PostSend, PostRecv or Poll of a
// batch, through the function pointers of the device context's ops table
// (ibv_post_send, ibv_post_recv and ibv_poll_cq are inline functions in
// verbs.h that do the same), and on amd64 allocates nothing; on other
// architectures each of those calls goes through purego.SyscallN, which
// allocates its argument slice (8 bytes). On amd64 it makes that call
// from the goroutine on a C stack of its own, without entering the
// runtime's syscall state as cgo calls do: those functions never block,
// and a busy-polling goroutine found in a call by the runtime's monitor
// would otherwise have its P handed to another thread, woken for nothing
// (callc_amd64.go says more). The calls that may block (events, connection
// setup) go through runtime.cgocall as cgo calls do. Completion channels
// and the asynchronous event queue are file descriptors watched by the Go
// runtime's poller, so no OS thread is parked per CQ.
//
// Connections are made through librdmacm: package cm serves the address
// scheme rdma://host:port, with private data, reject and disconnect; the
// QP must be on the device the kernel routes the address to (cm.Device
// names it). The provider creates its QPs itself and moves them through
// Init, RTR and RTS with the attributes rdma_init_qp_attr gives, so the
// peer may be any rdma_cm program. interop/ibverbs.sh connects goverbs
// programs on rxe and siw, each side serving in turn, to librdmacm's
// rping, ucmatose, rdma_server and rdma_client, and to perftest's
// ib_send_lat, ib_write_lat and ib_read_lat run with -R
// (examples/perftestpeer).
//
// What a device lacks, as its attributes and transport say, is refused
// with ErrUnsupported at post time before it reaches the device: on iWARP
// (siw) there are no atomics, no immediate data and no RNR retry.
//
// Devices round their queues up; the provider counts outstanding work
// requests itself, so PostSend and PostRecv refuse with ErrQueueFull at
// the capacities the QP was created with, as every provider does.
//
// A QP moved to RTR by Modify (rather than by cm) is given the address of
// its own device's port, so it can be connected by hand only to a QP of the
// same device; iWARP QPs are connected by cm alone (Modify to RTR or RTS is
// refused with ErrUnsupported). On iWARP the wire carries no QP numbers, so
// receive completions report SrcQP 0.
//
// Memory windows are offered on devices whose device_cap_flags have
// IBV_DEVICE_MEM_WINDOW and type 2A or 2B windows (rxe has them, siw does
// not). A type 1 window is bound with ibv_bind_mw, and its new key is the
// one the device library chooses (rxe and mlx5 step the low byte, as
// ibv_inc_rkey does); a type 2 window is bound by an IBV_WR_BIND_MW work
// request with a new key whose low byte the provider draws from
// crypto/rand, differing from the old one. MW.RKey changes when the bind
// has completed successfully. A bind must name a live window and region
// of the QP's PD; the device enforces the rest (AccessMWBind on the
// region, and AccessLocalWrite on it for a window that grants remote
// write or atomics),
// and rxe does so partly: it checks an access through a window against
// the bounds of the whole region rather than the window's, completes a
// Send with Invalidate that the responder refuses successfully at the
// requester, invalidates a type 2 window bound to another QP of the PD,
// and refuses to deregister a region with a window bound to it (EINVAL).
//
// A device that is removed (rdma link delete, a driver unloaded, a NIC
// unplugged) raises EventDeviceFatal on Context.Events, once: devices
// with disassociation (mlx5) report it themselves, and for the others (rxe
// and siw) rdma_cm's device-removal event on a connection does. Its
// connections end, their QPs moving to the error state; CQ.Wait returns
// ErrNoDevice once the CQ is empty (Poll still takes the flushed
// completions), and posting is refused with ErrNoDevice. Destroy the
// objects and close the context: a device without disassociation is not
// removed until every process has closed it, and once one has, the
// provider has librdmacm forget the device (librdmacm then keeps a
// context open on each other device until the process exits). A device
// removed under a context that has no rdma_cm connection raises nothing
// unless the device reports it itself.
//
// Not supported: UD and other QP types, more than one port
// per device (port 1 is used), and completions do not report the solicited
// flag (struct ibv_wc does not carry it). On InfiniBand and RoCE the private
// data of a connection arrives padded with zeros to the CM message's size
// (56 bytes for a request), as librdmacm delivers it.
//
// Where the kernel's devices answer otherwise than the conformance suite
// asks (rxe and siw report some errors under other statuses, siw completes
// a Send once TCP has taken it), the provider passes on what the device
// says; interop/ibverbs.sh lists each such case.
//
// The conformance suite runs against a device when the environment names
// it and an address of its network interface:
//
//	GOVERBS_IBVERBS_DEVICE=rxe0 GOVERBS_IBVERBS_HOST=10.77.0.2 go test ./provider/ibverbs/
package ibverbs
