package ibverbs

import (
	"testing"

	"github.com/ebitengine/purego"
)

// BenchmarkForeignCall measures one call into libibverbs through purego,
// the cost the data path pays once per PostSend, PostRecv or Poll batch
// (ibv_wc_status_str does almost nothing in C).
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
