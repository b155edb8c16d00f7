package ibverbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
)

// BenchmarkForeignCall measures one call into libibverbs as the data path
// makes it (call3), the cost paid once per PostSend, PostRecv or Poll
// batch (ibv_wc_status_str does almost nothing in C).
func BenchmarkForeignCall(b *testing.B) {
	if err := load(); err != nil {
		b.Skip(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		call3(lib.wcStatusStr, 5, 0, 0)
	}
}

// TestForeignCall checks that a call into libibverbs returns what C
// returns: the status string ibv_wc_status_str gives.
func TestForeignCall(t *testing.T) {
	if err := load(); err != nil {
		t.Skip(err)
	}
	if got := goString(call(lib.wcStatusStr, 5)); got != "Work Request Flushed Error" {
		t.Fatalf("ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR) = %q", got)
	}
}

// BenchmarkPuregoSyscallN is the same call through purego.SyscallN, which
// the data path does not use because it allocates its argument slice.
func BenchmarkPuregoSyscallN(b *testing.B) {
	if err := load(); err != nil {
		b.Skip(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		purego.SyscallN(lib.wcStatusStr, 5)
	}
}

// TestMissingLibraries checks what a machine without rdma-core gets: an
// error that says what to install, and no rdma:// scheme without
// librdmacm.
func TestMissingLibraries(t *testing.T) {
	var l libs
	verbsErr, _ := loadLibs(&l, "libibverbs-absent.so.1", "librdmacm.so.1")
	if !errors.Is(verbsErr, ErrNoLibrary) || !strings.Contains(verbsErr.Error(), "install rdma-core") {
		t.Fatalf("without libibverbs: %v", verbsErr)
	}
	if err := load(); err != nil {
		t.Skip(err) // nothing more to check without libibverbs here
	}
	verbsErr, cmErr := loadLibs(&l, "libibverbs.so.1", "librdmacm-absent.so.1")
	if verbsErr != nil || cmErr == nil || !strings.Contains(cmErr.Error(), "librdmacm1") {
		t.Fatalf("without librdmacm: %v, %v", verbsErr, cmErr)
	}
}
