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
// verbs.h that do the same), and allocates nothing. Completion channels
// and the asynchronous event queue are file descriptors watched by the Go
// runtime's poller, so no OS thread is parked per CQ.
//
// Connections are made through librdmacm: package cm serves the address
// scheme rdma://host:port, with private data, reject and disconnect; the
// QP must be on the device the kernel routes the address to (cm.Device
// names it). The provider creates its QPs itself and moves them through
// Init, RTR and RTS with the attributes rdma_init_qp_attr gives, so the
// peer may be any rdma_cm program (rping, rdma_server, perftest -R).
//
// What a device lacks, as its attributes and transport say, is refused
// with ErrUnsupported at post time before it reaches the device: on iWARP
// (siw) there are no atomics, no immediate data and no RNR retry.
//
// Not supported: memory windows, UD and other QP types, more than one port
// per device (port 1 is used), and completions do not report the solicited
// flag (struct ibv_wc does not carry it).
package ibverbs
