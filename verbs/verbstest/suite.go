package verbstest

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
)

// testCase is one case of the suite, named "Group/Name".
type testCase struct {
	name string
	run  func(t *testing.T, h Harness)
}

// suite lists every case, grouped, in the order Run runs them.
var suite = []testCase{
	{"SendRecv/PostOrder", testPostOrder},
	{"SendRecv/ScatterGather", testScatterGather},
	{"SendRecv/Inline", testInline},
	{"SendRecv/InlineUnregistered", testInlineUnregistered},
	{"SendRecv/InlineTooLarge", testInlineTooLarge},
	{"SendRecv/TooManySGEs", testTooManySGEs},
	{"SendRecv/WithImm", testSendWithImm},
	{"SendRecv/ZeroLength", testZeroLengthSend},
	{"SendRecv/RecvTooSmall", testRecvTooSmall},
	{"SendRecv/Solicited", testSolicited},
	{"SendRecv/SolicitedOnly", testSolicitedOnly},
	{"SendRecv/LongMessages", testLongMessages},
	{"SendRecv/RecvBadLKey", testRecvBadLKey},
	{"SendRecv/RecvNoLocalWrite", testRecvNoLocalWrite},

	{"RNR/RetryExceeded", testRNRRetryExceeded},
	{"RNR/RetryTimer", testRNRRetryTimer},
	{"RNR/RetryForever", testRNRRetryForever},
	{"RNR/Drain", testRNRDrain},

	{"RDMA/Write", testWrite},
	{"RDMA/WriteZeroLength", testWriteZeroLength},
	{"RDMA/WriteMultiSGE", testWriteMultiSGE},
	{"RDMA/WriteWithImm", testWriteWithImm},
	{"RDMA/Read", testRead},
	{"RDMA/ReadZeroLength", testReadZeroLength},
	{"RDMA/ReadMultiSGE", testReadMultiSGE},
	{"RDMA/ReadLarge", testReadLarge},
	{"RDMA/ReadNoLocalWrite", testReadNoLocalWrite},
	{"RDMA/WriteInline", testWriteInline},
	{"RDMA/WriteWithImmZeroLength", testWriteWithImmZeroLength},
	{"RDMA/ReadsBeyondORD", testReadsBeyondORD},

	{"Atomic/CmpAndSwp", testCmpAndSwp},
	{"Atomic/FetchAndAdd", testFetchAndAdd},
	{"Atomic/Misaligned", testAtomicMisaligned},
	{"Atomic/BadLocalLength", testAtomicBadLocalLength},
	{"Atomic/SplitResult", testAtomicSplitResult},
	{"Atomic/Concurrent", testAtomicConcurrent},
	{"Atomic/ResultByteLen", testAtomicResultByteLen},
	{"Atomic/ResultNoLocalWrite", testAtomicResultNoLocalWrite},
	{"Atomic/ResultBadLKey", testAtomicResultBadLKey},

	{"Ordering/SendAfterWrites", testSendAfterWrites},
	{"Ordering/Fence", testFence},
	{"Ordering/FenceLocal", testFenceLocal},
	{"Ordering/FenceAtomic", testFenceAtomic},

	{"Protection/WrongLKey", testWrongLKey},
	{"Protection/LocalOutOfBounds", testLocalOutOfBounds},
	{"Protection/WrongRKey", testWrongRKey},
	{"Protection/RemotePastEnd", testRemotePastEnd},
	{"Protection/RemoteBelowStart", testRemoteBelowStart},
	{"Protection/NoRemoteWrite", testNoRemoteWrite},
	{"Protection/NoRemoteRead", testNoRemoteRead},
	{"Protection/NoRemoteAtomic", testNoRemoteAtomic},
	{"Protection/RemoteWrap", testRemoteWrap},
	{"Protection/LocalWrap", testLocalWrap},
	{"Protection/UnsignaledFault", testUnsignaledFault},
	{"Protection/OtherPDLKey", testOtherPDLKey},
	{"Protection/OtherPDRKey", testOtherPDRKey},
	{"Protection/QPNoRemoteRights", testQPNoRemoteRights},
	{"Protection/ManyRegions", testManyRegions},
	{"Protection/QPAccessKept", testQPAccessKept},

	{"Hostile/ForgedKey", testHostileForgedKey},
	{"Hostile/GuessedKeys", testHostileGuessedKeys},
	{"Hostile/StaleKey", testHostileStaleKey},
	{"Hostile/OutOfBounds", testHostileOutOfBounds},
	{"Hostile/Misaligned", testHostileMisaligned},
	{"Hostile/MissingRights", testHostileMissingRights},
	{"Hostile/AfterDisconnect", testHostileAfterDisconnect},
	{"Hostile/SendTooLarge", testHostileSendTooLarge},

	{"MemoryWindow/Type1", testMWType1},
	{"MemoryWindow/Rights", testMWRights},
	{"MemoryWindow/BindNeedsMWBind", testMWBindNeedsMWBind},
	{"MemoryWindow/Type2BoundQP", testMWType2QP},
	{"MemoryWindow/Rebind", testMWRebind},
	{"MemoryWindow/LocalInv", testMWLocalInv},
	{"MemoryWindow/SendWithInv", testMWSendWithInv},
	{"MemoryWindow/SendWithInvRefused", testMWSendWithInvRefused},
	{"MemoryWindow/Dealloc", testMWDealloc},
	{"MemoryWindow/BadRange", testMWBadRange},
	{"MemoryWindow/DeregRegion", testMWDeregRegion},
	{"MemoryWindow/Atomic", testMWAtomic},

	{"Lifecycle/StateMachine", testStateMachine},
	{"Lifecycle/IllegalTransitions", testIllegalTransitions},
	{"Lifecycle/MissingAttributes", testMissingAttributes},
	{"Lifecycle/ErrAndReset", testErrAndReset},
	{"Lifecycle/PostInWrongState", testPostInWrongState},
	{"Lifecycle/SendQueueFull", testSendQueueFull},
	{"Lifecycle/RecvQueueFull", testRecvQueueFull},
	{"Lifecycle/DeregMR", testDeregMR},
	{"Lifecycle/DeregLocalKey", testDeregLocalKey},
	{"Lifecycle/DeregContainer", testDeregContainer},
	{"Lifecycle/DestroyOrder", testDestroyOrder},
	{"Lifecycle/CQOverrun", testCQOverrun},
	{"Lifecycle/RecvCQOverrun", testRecvCQOverrun},
	{"Lifecycle/QueriedCap", testQueriedCap},
	{"Lifecycle/Reuse", testReuse},
	{"Lifecycle/ConnectWrongState", testConnectWrongState},
	{"Lifecycle/Drain", testDrain},

	{"Completion/Unsignaled", testUnsignaled},
	{"Completion/Retirement", testRetirement},
	{"Completion/SigAll", testSigAll},
	{"Completion/BusyPoll", testBusyPoll},
	{"Completion/PollEmpty", testPollEmpty},
	{"Completion/Wait", testWait},
	{"Completion/WaitIdleCPU", testWaitIdleCPU},
	{"Completion/WaitTogether", testWaitTogether},
	{"Completion/WaitBurst", testWaitBurst},
	{"Completion/WaitDestroyed", testWaitDestroyed},
	{"Completion/WaitContextClosed", testWaitContextClosed},
	{"Completion/EventDriven", testEventDriven},
	{"Completion/SolicitedOnlySendErrors", testSolicitedOnlySendErrors},

	{"SRQ/SharedByQPs", testSRQShared},
	{"SRQ/LimitEvent", testSRQLimit},
	{"SRQ/OtherPD", testSRQOtherPD},
	{"SRQ/LastWQEReached", testSRQLastWQE},
	{"SRQ/LastWQEAfterPlacement", testSRQLastWQEAfterPlacement},
	{"SRQ/NoLastWQEAfterReset", testSRQNoLastWQEAfterReset},
	{"SRQ/PostRecvOnQP", testSRQPostRecvOnQP},
	{"SRQ/Full", testSRQFull},
	{"SRQ/TooManySGEs", testSRQTooManySGEs},
	{"SRQ/QueryLimit", testSRQQueryLimit},
	{"SRQ/LongMessage", testSRQLongMessage},
	{"SRQ/RecvBadLKey", testSRQRecvBadLKey},

	{"Events/QPAccessErr", testQPAccessErrEvent},
	{"Events/QPReqErr", testQPReqErrEvent},
	{"Events/CommEst", testCommEst},
	{"Events/CommEstOneSided", testCommEstOneSided},
	{"Events/CommEstHeldPeerLeaves", testCommEstHeldPeerLeaves},
	{"Events/CommEstHeldLeaves", testCommEstHeldLeaves},
	{"Events/CommEstNotForLocalError", testCommEstNotForLocalError},

	{"DataPath/ZeroAlloc", testZeroAlloc},

	{"PeerFailure/Kill", testPeerKilled},
	{"PeerFailure/Disconnect", testPeerDisconnect},
	{"PeerFailure/Silent", testSilentPeer},
}

// Cases returns the names of every case of the suite, as "Group/Name";
// Run runs each as the subtest of that name.
func Cases() []string {
	names := make([]string, len(suite))
	for i, c := range suite {
		names[i] = c.name
	}
	return names
}

// Run runs the whole conformance suite against the provider h describes.
// Each case is a subtest named as Cases lists it, and makes its own pairs
// with h.NewPair; cases whose feature the device does not declare check
// the declared behaviour instead, or skip naming the capability. At the
// end Run logs a summary (shown with go test -v): the cases run, passed,
// failed and skipped, and for each skip, whole or of some of a case's
// subtests, the capability or harness property that caused it.
func Run(t *testing.T, h Harness) {
	skips.Range(func(k, _ any) bool { // from an earlier run of this test (-count)
		if strings.HasPrefix(k.(string), t.Name()+"/") {
			skips.Delete(k)
		}
		return true
	})
	var results []caseResult
	for i := 0; i < len(suite); {
		group, _, _ := strings.Cut(suite[i].name, "/")
		j := i
		for j < len(suite) && strings.HasPrefix(suite[j].name, group+"/") {
			j++
		}
		cases := suite[i:j]
		t.Run(group, func(t *testing.T) {
			for _, c := range cases {
				r := caseResult{name: c.name}
				t.Run(strings.TrimPrefix(c.name, group+"/"), func(t *testing.T) {
					r.testName = t.Name()
					defer func() { r.failed, r.skipped = t.Failed(), t.Skipped() }()
					c.run(t, h)
				})
				if r.testName != "" { // not left out by -run
					results = append(results, r)
				}
			}
		})
		i = j
	}
	t.Log(summarize(h, results))
}

// caseResult is how one case of a Run ended.
type caseResult struct {
	name, testName  string
	failed, skipped bool
}

// skips holds why a test skipped, by its full name: the capability the
// device lacks, or the property of the harness the case needs.
var skips sync.Map

// skip records why the test skips and skips it.
func skip(t testing.TB, why string) {
	t.Helper()
	skips.Store(t.Name(), why)
	t.Skipf("skipped: %s", why)
}

// summarize renders the results of a Run as one line per outcome.
func summarize(h Harness, results []caseResult) string {
	where := "both endpoints in this process"
	if h.Remote != nil {
		where = "B in another process"
	}
	if h.Without != 0 {
		where += ", taken to lack " + h.Without.String()
	}
	var passed, failed, skipped int
	var failures, whole, partial []string
	for _, r := range results {
		switch {
		case r.failed:
			failed++
			failures = append(failures, r.name)
		case r.skipped:
			skipped++
			whole = append(whole, fmt.Sprintf("%s (%s)", r.name, skipReason(r.testName)))
		default:
			passed++
		}
		if r.skipped {
			continue
		}
		var subs []string
		skips.Range(func(k, v any) bool {
			if name := k.(string); strings.HasPrefix(name, r.testName+"/") {
				subs = append(subs, fmt.Sprintf("%s: %s", strings.TrimPrefix(name, r.testName+"/"), v))
			}
			return true
		})
		if len(subs) > 0 {
			sort.Strings(subs)
			partial = append(partial, fmt.Sprintf("%s (%s)", r.name, strings.Join(subs, "; ")))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "conformance of %s, %s: %d cases run, %d passed, %d failed, %d skipped",
		h.Device, where, len(results), passed, failed, skipped)
	for _, l := range []struct {
		what  string
		names []string
	}{{"failed", failures}, {"skipped", whole}, {"passed with subtests skipped", partial}} {
		if len(l.names) > 0 {
			fmt.Fprintf(&b, "\n  %s: %s", l.what, strings.Join(l.names, ", "))
		}
	}
	return b.String()
}

// skipReason is why the test of that name skipped, as skip recorded it.
func skipReason(testName string) string {
	if v, ok := skips.Load(testName); ok {
		return v.(string)
	}
	return "no reason recorded"
}
