package ibverbs

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The libraries are loaded once, at the first use of the provider, with
// dlopen; every entry point the provider calls is looked up then, so that
// a missing one is reported at load time rather than in the middle of a
// connection.

// libs are the loaded libraries' entry points. A zero field means the
// library that holds it was not loaded.
type libs struct {
	// libibverbs.so.1
	getDeviceList, freeDeviceList, getDeviceName, getDeviceGUID uintptr
	openDevice, closeDevice, queryDevice, queryPort, queryGID   uintptr
	allocPD, deallocPD, regMR, deregMR                          uintptr
	createCompChannel, destroyCompChannel, createCQ, destroyCQ  uintptr
	getCQEvent, ackCQEvents                                     uintptr
	createQP, modifyQP, queryQP, destroyQP                      uintptr
	createSRQ, modifySRQ, querySRQ, destroySRQ                  uintptr
	getAsyncEvent, ackAsyncEvent, wcStatusStr                   uintptr
	// librdmacm.so.1 (optional: without it there is no rdma:// scheme)
	createEventChannel, destroyEventChannel, createID, destroyID    uintptr
	bindAddr, listen, resolveAddr, resolveRoute, connect, accept    uintptr
	reject, disconnect, establish, getCMEvent, ackCMEvent, initQPAt uintptr
	getSrcPort, migrateID, getDevices, freeDevices                  uintptr
	// libc
	errnoLocation uintptr
}

var (
	loadOnce sync.Once
	lib      libs
	// loadErr says why libibverbs could not be used; cmErr why
	// librdmacm could not.
	loadErr, cmErr error
)

// ErrNoLibrary is returned when libibverbs.so.1 cannot be loaded.
var ErrNoLibrary = errors.New("ibverbs: libibverbs.so.1 not found: install rdma-core (Debian: apt-get install ibverbs-providers libibverbs1) to use RDMA hardware and the kernel's rxe and siw devices")

// load loads the libraries once and returns why libibverbs is unusable.
func load() error {
	loadOnce.Do(func() { loadErr, cmErr = loadLibs(&lib, "libibverbs.so.1", "librdmacm.so.1") })
	return loadErr
}

// loadCM loads the libraries once and returns why librdmacm is unusable.
func loadCM() error {
	if err := load(); err != nil {
		return err
	}
	return cmErr
}

type symbol struct {
	p    *uintptr
	name string
}

func lookup(h uintptr, libName string, syms []symbol) error {
	for _, s := range syms {
		p, err := purego.Dlsym(h, s.name)
		if err != nil || p == 0 {
			return fmt.Errorf("ibverbs: %s lacks %s: the installed rdma-core is too old or broken (%v)", libName, s.name, err)
		}
		*s.p = p
	}
	return nil
}

// loadLibs loads libc and the libraries named verbsName and cmName (their
// sonames but in tests) into l.
func loadLibs(l *libs, verbsName, cmName string) (verbsErr, cmErr error) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("ibverbs: cannot load libc.so.6: %v", err), nil
	}
	if err := lookup(libc, "libc.so.6", []symbol{{&l.errnoLocation, "__errno_location"}}); err != nil {
		return err, nil
	}
	h, err := purego.Dlopen(verbsName, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("%w (%v)", ErrNoLibrary, err), nil
	}
	if err := lookup(h, "libibverbs.so.1", []symbol{
		{&l.getDeviceList, "ibv_get_device_list"}, {&l.freeDeviceList, "ibv_free_device_list"},
		{&l.getDeviceName, "ibv_get_device_name"}, {&l.getDeviceGUID, "ibv_get_device_guid"},
		{&l.openDevice, "ibv_open_device"}, {&l.closeDevice, "ibv_close_device"},
		{&l.queryDevice, "ibv_query_device"}, {&l.queryPort, "ibv_query_port"}, {&l.queryGID, "ibv_query_gid"},
		{&l.allocPD, "ibv_alloc_pd"}, {&l.deallocPD, "ibv_dealloc_pd"},
		{&l.regMR, "ibv_reg_mr"}, {&l.deregMR, "ibv_dereg_mr"},
		{&l.createCompChannel, "ibv_create_comp_channel"}, {&l.destroyCompChannel, "ibv_destroy_comp_channel"},
		{&l.createCQ, "ibv_create_cq"}, {&l.destroyCQ, "ibv_destroy_cq"},
		{&l.getCQEvent, "ibv_get_cq_event"}, {&l.ackCQEvents, "ibv_ack_cq_events"},
		{&l.createQP, "ibv_create_qp"}, {&l.modifyQP, "ibv_modify_qp"},
		{&l.queryQP, "ibv_query_qp"}, {&l.destroyQP, "ibv_destroy_qp"},
		{&l.createSRQ, "ibv_create_srq"}, {&l.modifySRQ, "ibv_modify_srq"},
		{&l.querySRQ, "ibv_query_srq"}, {&l.destroySRQ, "ibv_destroy_srq"},
		{&l.getAsyncEvent, "ibv_get_async_event"}, {&l.ackAsyncEvent, "ibv_ack_async_event"},
		{&l.wcStatusStr, "ibv_wc_status_str"},
	}); err != nil {
		return err, nil
	}
	cm, err := purego.Dlopen(cmName, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: librdmacm.so.1 not found, so rdma:// addresses are unavailable: install librdmacm1 (%v)", err)
	}
	return nil, lookup(cm, "librdmacm.so.1", []symbol{
		{&l.createEventChannel, "rdma_create_event_channel"}, {&l.destroyEventChannel, "rdma_destroy_event_channel"},
		{&l.createID, "rdma_create_id"}, {&l.destroyID, "rdma_destroy_id"},
		{&l.bindAddr, "rdma_bind_addr"}, {&l.listen, "rdma_listen"},
		{&l.resolveAddr, "rdma_resolve_addr"}, {&l.resolveRoute, "rdma_resolve_route"},
		{&l.connect, "rdma_connect"}, {&l.accept, "rdma_accept"}, {&l.reject, "rdma_reject"},
		{&l.disconnect, "rdma_disconnect"}, {&l.establish, "rdma_establish"},
		{&l.getCMEvent, "rdma_get_cm_event"}, {&l.ackCMEvent, "rdma_ack_cm_event"},
		{&l.initQPAt, "rdma_init_qp_attr"}, {&l.getSrcPort, "rdma_get_src_port"}, {&l.migrateID, "rdma_migrate_id"},
		{&l.getDevices, "rdma_get_devices"}, {&l.freeDevices, "rdma_free_devices"},
	})
}

// cargs is a foreign call: the function, up to six arguments, the result
// (the trampolines of callc_amd64.s read it).
type cargs struct {
	fn uintptr
	a  [6]uintptr
	r1 uintptr
}

// callErrno calls fn and returns its result and the errno the call left.
// The thread is locked around both so that errno is the call's own.
//
//go:uintptrescapes
func callErrno(fn uintptr, args ...uintptr) (uintptr, syscall.Errno) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	loc := call(lib.errnoLocation)
	*(*int32)(cptr(loc)) = 0
	r := call(fn, args...)
	return r, syscall.Errno(*(*int32)(cptr(loc)))
}

// callInt calls fn, which returns 0 or an errno value (as most of
// libibverbs does), and turns the result into an error.
//
//go:uintptrescapes
func callInt(fn uintptr, args ...uintptr) error {
	if r := int32(call(fn, args...)); r != 0 {
		if r < 0 {
			r = -r
		}
		return syscall.Errno(r)
	}
	return nil
}

// callRC calls fn, which returns 0, or -1 and sets errno (as librdmacm
// and some of libibverbs do).
//
//go:uintptrescapes
func callRC(fn uintptr, args ...uintptr) error {
	r, errno := callErrno(fn, args...)
	if int32(r) != 0 {
		if errno == 0 {
			errno = syscall.EIO
		}
		return errno
	}
	return nil
}

// callPtr calls fn, which returns a pointer, or NULL and sets errno.
//
//go:uintptrescapes
func callPtr(fn uintptr, args ...uintptr) (uintptr, error) {
	r, errno := callErrno(fn, args...)
	if r == 0 {
		if errno == 0 {
			errno = syscall.ENOMEM
		}
		return 0, errno
	}
	return r, nil
}

// goString copies the NUL-terminated C string at p.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *(*byte)(cptr(p + uintptr(n))) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(cptr(p)), n))
}

// cString returns s as a NUL-terminated byte slice.
func cString(s string) []byte { return append([]byte(s), 0) }

// cptr turns the address of C memory (never Go memory) into a pointer.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }
