package verbstest

import (
	"strings"
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

	{"Atomic/CmpAndSwp", testCmpAndSwp},
	{"Atomic/FetchAndAdd", testFetchAndAdd},
	{"Atomic/Misaligned", testAtomicMisaligned},
	{"Atomic/BadLocalLength", testAtomicBadLocalLength},
	{"Atomic/SplitResult", testAtomicSplitResult},
	{"Atomic/Concurrent", testAtomicConcurrent},

	{"Ordering/SendAfterWrites", testSendAfterWrites},
	{"Ordering/Fence", testFence},
	{"Ordering/FenceLocal", testFenceLocal},

	{"Protection/WrongLKey", testWrongLKey},
	{"Protection/LocalOutOfBounds", testLocalOutOfBounds},
	{"Protection/WrongRKey", testWrongRKey},
	{"Protection/RemotePastEnd", testRemotePastEnd},
	{"Protection/RemoteBelowStart", testRemoteBelowStart},
	{"Protection/NoRemoteWrite", testNoRemoteWrite},
	{"Protection/NoRemoteRead", testNoRemoteRead},
	{"Protection/NoRemoteAtomic", testNoRemoteAtomic},
	{"Protection/QPAccessKept", testQPAccessKept},

	{"Hostile/ForgedKey", testHostileForgedKey},
	{"Hostile/GuessedKeys", testHostileGuessedKeys},
	{"Hostile/StaleKey", testHostileStaleKey},
	{"Hostile/OutOfBounds", testHostileOutOfBounds},
	{"Hostile/Misaligned", testHostileMisaligned},
	{"Hostile/MissingRights", testHostileMissingRights},
	{"Hostile/AfterDisconnect", testHostileAfterDisconnect},
	{"Hostile/SendTooLarge", testHostileSendTooLarge},

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

	{"Completion/Unsignaled", testUnsignaled},
	{"Completion/Retirement", testRetirement},
	{"Completion/SigAll", testSigAll},
	{"Completion/BusyPoll", testBusyPoll},
	{"Completion/Wait", testWait},
	{"Completion/WaitIdleCPU", testWaitIdleCPU},
	{"Completion/WaitTogether", testWaitTogether},
	{"Completion/WaitBurst", testWaitBurst},
	{"Completion/WaitDestroyed", testWaitDestroyed},
	{"Completion/WaitContextClosed", testWaitContextClosed},
	{"Completion/EventDriven", testEventDriven},

	{"SRQ/SharedByQPs", testSRQShared},
	{"SRQ/LimitEvent", testSRQLimit},
	{"SRQ/OtherPD", testSRQOtherPD},
	{"SRQ/LastWQEReached", testSRQLastWQE},
	{"SRQ/LastWQEAfterPlacement", testSRQLastWQEAfterPlacement},
	{"SRQ/NoLastWQEAfterReset", testSRQNoLastWQEAfterReset},

	{"DataPath/ZeroAlloc", testZeroAlloc},

	{"PeerFailure/Kill", testPeerKilled},
	{"PeerFailure/Disconnect", testPeerDisconnect},
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
// the declared behaviour instead, or skip naming the capability.
func Run(t *testing.T, h Harness) {
	for i := 0; i < len(suite); {
		group, _, _ := strings.Cut(suite[i].name, "/")
		j := i
		for j < len(suite) && strings.HasPrefix(suite[j].name, group+"/") {
			j++
		}
		cases := suite[i:j]
		t.Run(group, func(t *testing.T) {
			for _, c := range cases {
				t.Run(strings.TrimPrefix(c.name, group+"/"), func(t *testing.T) { c.run(t, h) })
			}
		})
		i = j
	}
}
