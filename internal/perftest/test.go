// Package perftest measures goverbs devices the way perftest (ib_send_lat,
// ib_write_bw and their siblings from linux-rdma/perftest) measures RDMA
// hardware, so that the numbers mean what RDMA people expect:
//
//   - send_lat and write_lat are ping-pongs and report half the round
//     trip; write_lat polls the last byte of its own target buffer for the
//     peer's new value, not a completion. read_lat and atomic_lat report
//     the full operation. Latencies are t_min, t_typical (the median),
//     t_avg, the 99th percentile and t_max, in microseconds, from the
//     times between consecutive posts, less the two largest samples.
//   - send_bw, write_bw, read_bw and atomic_bw keep a window (the tx depth)
//     of outstanding work requests, signal every CQMod-th of them, and
//     report the peak bandwidth, the average bandwidth in MiB/s (2^20
//     bytes, perftest's and ucx_perftest's "MB"), and the message rate in
//     Mpps (10^6 messages a second).
//
// A Server (Serve) accepts one connection per test run; the client (Run)
// names the test and its parameters in the connection's private data, and
// the server answers with the buffer the client's one-sided operations
// target. After the measured loop both sides exchange a Send with their
// CPU time, so that a Result carries the CPU time per operation of both
// processes (getrusage).
//
// The package also runs the peers goverbs is compared against
// (ucx_perftest, fi_pingpong, plain Go TCP, and perftest's own ib_*
// programs on a kernel RDMA device goverbs runs on) and parses their
// output; see PlanPeers.
package perftest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/goverbs/goverbs/verbs"
)

// Test is one of perftest's eight tests.
type Test uint8

// The tests, named as perftest's binaries are, less the ib_ prefix.
const (
	SendLat Test = iota + 1
	WriteLat
	ReadLat
	AtomicLat
	SendBW
	WriteBW
	ReadBW
	AtomicBW
)

// Tests lists every test in the order a suite runs them.
var Tests = []Test{SendLat, WriteLat, ReadLat, AtomicLat, SendBW, WriteBW, ReadBW, AtomicBW}

var testNames = [...]string{
	SendLat: "send_lat", WriteLat: "write_lat", ReadLat: "read_lat", AtomicLat: "atomic_lat",
	SendBW: "send_bw", WriteBW: "write_bw", ReadBW: "read_bw", AtomicBW: "atomic_bw",
}

// String returns the test's name, e.g. "write_bw".
func (t Test) String() string {
	if t.Valid() {
		return testNames[t]
	}
	return fmt.Sprintf("Test(%d)", uint8(t))
}

// Valid reports whether t is one of the eight tests.
func (t Test) Valid() bool { return t >= SendLat && t <= AtomicBW }

// ParseTest returns the test called name ("send_lat", ..., "atomic_bw").
func ParseTest(name string) (Test, error) {
	for _, t := range Tests {
		if t.String() == name {
			return t, nil
		}
	}
	names := make([]string, len(Tests))
	for i, t := range Tests {
		names[i] = t.String()
	}
	return 0, fmt.Errorf("no test %q: the tests are %s", name, strings.Join(names, ", "))
}

// Latency reports whether t is a latency test.
func (t Test) Latency() bool { return t >= SendLat && t <= AtomicLat }

// Opcode is the operation the test measures.
func (t Test) Opcode() verbs.Opcode {
	switch t {
	case SendLat, SendBW:
		return verbs.OpSend
	case WriteLat, WriteBW:
		return verbs.OpRDMAWrite
	case ReadLat, ReadBW:
		return verbs.OpRDMARead
	}
	return verbs.OpAtomicFetchAndAdd
}

// Atomic reports whether t measures 8-byte atomics (FetchAndAdd, as
// perftest does by default).
func (t Test) Atomic() bool { return t == AtomicLat || t == AtomicBW }

// twoSided reports whether the server takes part in the measured loop
// (it receives, or ping-pongs); otherwise it only waits.
func (t Test) twoSided() bool { return t == SendLat || t == WriteLat || t == SendBW }

// AtomicSize is the only size of an atomic test.
const AtomicSize = 8

// MaxAllSize is the largest size -a runs, as perftest's MAX_SIZE.
const MaxAllSize = 8 << 20

// AllSizes returns every size perftest's -a runs: the powers of two from
// 2 bytes to 8 MiB.
func AllSizes() []int {
	var s []int
	for n := 2; n <= MaxAllSize; n *= 2 {
		s = append(s, n)
	}
	return s
}

// DefaultSizes are the sizes a suite runs when none are given: small
// messages where latency and message rate matter, and large ones where
// bandwidth does.
func DefaultSizes() []int { return []int{8, 64, 4096, 65536, 1 << 20} }

// Sizes returns the sizes test t runs out of sizes: atomics run only
// AtomicSize, whatever was asked.
func (t Test) Sizes(sizes []int) []int {
	if t.Atomic() {
		return []int{AtomicSize}
	}
	return sizes
}

// Params are the parameters of one test run; both sides use them.
type Params struct {
	Test Test
	// Size is the message size in bytes.
	Size int
	// Iters is the number of measured iterations; Warmup iterations run
	// first and are not measured.
	Iters  int
	Warmup int
	// TxDepth is the window: how many send work requests a bandwidth test
	// keeps outstanding.
	TxDepth int
	// RxDepth is how many receives the receiving side of a Send test
	// keeps posted.
	RxDepth int
	// CQMod signals every CQMod-th send work request (perftest's
	// --cq-mod); the others complete silently.
	CQMod int
	// Inline sends messages of up to Inline bytes inline (Sends and
	// Writes); 0 never does.
	Inline int
	// PostList is how many work requests a bandwidth test's client posts
	// per PostSend (perftest's --post_list); 1 posts them one at a time.
	// The server does not use it.
	PostList int
	// Event waits for completions with CQ.Wait (ReqNotify and the
	// completion channel) instead of busy polling.
	Event bool
}

// Defaults of perftest (perftest_parameters.h) that Params follows.
const (
	DefaultItersLat   = 1000 // DEF_ITERS
	DefaultItersBW    = 5000 // DEF_ITERS_WB
	DefaultTxDepthBW  = 128  // DEF_TX_BW
	DefaultTxDepthLat = 1    // DEF_TX_LAT
	DefaultRxDepth    = 512  // DEF_RX_SEND
	DefaultCQMod      = 100  // DEF_CQ_MOD
	DefaultInlineSend = 236  // DEF_INLINE_SEND_RC_UC
	DefaultInlineWr   = 220  // DEF_INLINE_WRITE
)

// DefaultParams returns perftest's defaults for test t at size bytes,
// with a warm-up of a tenth of the iterations. The inline size is capped
// to what attr allows.
func DefaultParams(t Test, size int, attr verbs.DeviceAttr) Params {
	p := Params{Test: t, Size: size, Iters: DefaultItersBW, TxDepth: DefaultTxDepthBW,
		RxDepth: DefaultRxDepth, CQMod: DefaultCQMod, PostList: 1}
	if t.Latency() {
		p.Iters, p.TxDepth = DefaultItersLat, DefaultTxDepthLat
	}
	switch t.Opcode() {
	case verbs.OpSend:
		p.Inline = min(DefaultInlineSend, attr.MaxInlineData)
	case verbs.OpRDMAWrite:
		p.Inline = min(DefaultInlineWr, attr.MaxInlineData)
	}
	if t.Atomic() {
		p.Size = AtomicSize
	}
	p.Warmup = p.Iters / 10
	return p
}

// sendDepth is the send queue depth the test needs: the window for a
// bandwidth test; for a latency test, room for the unsignaled sends
// between two signaled ones.
func (p Params) sendDepth() int {
	if p.Test.Latency() {
		return max(p.TxDepth, p.cqMod())
	}
	return p.TxDepth
}

// cqMod is the signaling interval the loops use: perftest signals every
// write_lat, read_lat and atomic_lat, and at least once per window.
func (p Params) cqMod() int {
	switch p.Test {
	case WriteLat, ReadLat, AtomicLat:
		return 1
	case SendLat:
		return p.CQMod
	}
	return min(p.CQMod, p.TxDepth)
}

// postList is how many work requests the bandwidth loop posts at once.
func (p Params) postList() int {
	if p.Test.Latency() || p.PostList < 1 {
		return 1
	}
	return p.PostList
}

// total is the number of iterations the loops run, warm-up included.
func (p Params) total() int { return p.Warmup + p.Iters }

// area is the length of one of the two halves of an endpoint's data
// buffer: the message rounded up to a cache line, and at least 64 bytes
// so that write_lat's polled word lies inside it.
func (p Params) area() int { return max(64, (p.Size+63)&^63) }

// regionLen is the length of each side's one registered region: the two
// data areas and the control area.
func (p Params) regionLen() int { return 2*p.area() + ctrlArea }

// ErrUnsupported marks a test, size or parameter the device or the
// benchmark cannot run; the message says what to do instead.
var ErrUnsupported = errors.New("not supported")

// Check validates p against a device's limits and returns an error that
// says what to change.
func (p Params) Check(dev string, a verbs.DeviceAttr) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...)
	}
	switch {
	case !p.Test.Valid():
		return bad("unknown test %d", p.Test)
	case p.Test.Atomic() && !a.Has(verbs.CapAtomics):
		return bad("device %s has no RDMA atomics (see \"goverbs devices -v -d %s\"): run another test or device", dev, dev)
	case p.Test.Atomic() && p.Size != AtomicSize:
		return bad("%v moves %d bytes, not %d: leave -s out for atomics", p.Test, AtomicSize, p.Size)
	case p.Size < 1:
		return bad("size %d: give -s of at least 1 byte", p.Size)
	case uint64(p.Size) > a.MaxMsgSize:
		return bad("size %d B is more than device %s carries in one message (max_msg_sz %d B): give a smaller -s", p.Size, dev, a.MaxMsgSize)
	case uint64(p.regionLen()) > a.MaxMRSize:
		return bad("size %d B needs a %d-byte region, more than device %s registers (max_mr_size %d B): give a smaller -s", p.Size, p.regionLen(), dev, a.MaxMRSize)
	case p.Test.Latency() && p.Iters < 5:
		return bad("-n %d: a latency test needs at least 5 iterations", p.Iters)
	case p.Iters < 1 || p.Warmup < 0:
		return bad("-n %d: give at least 1 iteration", p.Iters)
	case p.TxDepth < 1 || p.sendDepth() > a.MaxQPWR:
		return bad("tx depth %d: device %s takes 1 to %d work requests per queue", p.TxDepth, dev, a.MaxQPWR)
	case p.RxDepth < 1 || p.RxDepth > a.MaxQPWR:
		return bad("rx depth %d: device %s takes 1 to %d work requests per queue", p.RxDepth, dev, a.MaxQPWR)
	case p.CQMod < 1:
		return bad("cq-mod %d: give at least 1", p.CQMod)
	case p.PostList < 1 || (!p.Test.Latency() && p.PostList > p.TxDepth):
		return bad("post list %d: give 1 to the tx depth (%d)", p.PostList, p.TxDepth)
	case p.Inline < 0 || p.Inline > a.MaxInlineData:
		return bad("inline size %d: device %s sends 0 to %d bytes inline", p.Inline, dev, a.MaxInlineData)
	case p.Event && p.Test == WriteLat:
		return bad("write_lat waits by polling memory, not for completions, so --event does not apply (perftest's ib_write_lat refuses -e too): run it without --event")
	case p.total() > 1<<31-1:
		return bad("-n %d: too many iterations", p.Iters)
	}
	if p.RxDepth > 0xffff || p.Inline > 0xffff || p.CQMod > 0xffff || p.TxDepth > 0xffff {
		return bad("parameters out of range")
	}
	return nil
}
