#!/usr/bin/env bash
# interop/ibverbs.sh: goverbs' ibverbs provider on the kernel's own RDMA
# devices, in a VM (shared/vm/vm.sh: Debian's kernel under qemu, rdma-core
# from the host), as root:
#
#   for rxe0 (Soft-RoCE) and then siw0 (SoftiWARP), each in a VM booted
#   with only that link, so that rdma_cm routes the guest's address to it:
#     1. the conformance suite (verbs/verbstest) with its two endpoints in
#        two processes, and the cases that need both in one process;
#     2. `goverbs ping -d DEV` against librdmacm's rping, both directions,
#        100 pings whose data both ends check; on siw0 also against goverbs'
#        own iWARP (tcp0) on the host, both directions; and
#        examples/cmatose -d DEV against librdmacm's ucmatose (10
#        connections, 10 messages each way, either side serving) and its
#        rdma_server and rdma_client, both directions; and
#        examples/perftestpeer -d DEV against perftest's ib_send_lat -R,
#        ib_write_lat -R and ib_read_lat -R (rdma_cm), either side
#        serving, 100 iterations of 64 bytes: both exit 0, perftest's
#        client prints its result row and perftestpeer its count;
#     3. on rxe0, goverbs kv (put, one-sided get, delete) and an rlog of
#        three members;
#     3b. on rxe0, a Send with immediate data from goverbs to a peer that
#        is not goverbs (interop/imm_peer.py, rdma-core's pyverbs): the
#        number it reads is the one goverbs sent (siw has no immediate);
#     3c. on rxe0, bad days (provider/ibverbs/baddays_test.go), each on an
#        rxe device of its own on a veth pair, so rxe0 is left alone: the
#        device removed under a connection (EventDeviceFatal, CQ.Wait and
#        posting fail with ErrNoDevice, every Close returns, the kernel's
#        removal completes once the context is closed), its link taken
#        down and up (EventPortErr, a Send that completes or fails, never
#        hangs, EventPortActive), a connection and everything under it
#        closed while its link is down, its two ends on one device or on
#        two devices across the veth pair (idle, with Sends and receives
#        outstanding, with an RDMA Read under way; in a user's order, QPs
#        first, the context first, both connections at once, one side
#        before the link returns and the other after: every call returns
#        and the devices' `rdma resource show` counts are back to what
#        they were), and a region deregistered under a pending RDMA Read
#        and under a pending Write's target (no byte lands after the
#        deregistration); a peer process killed with WRs outstanding is
#        the conformance case PeerFailure/Killed;
#     4. `rdma resource show` afterwards: the same counts as before.
#
# Every case is listed PASS, SKIP (with the capability the device lacks)
# or FAIL. Some cases fail because the kernel device behaves otherwise
# than the verbs say (for instance rxe reports a remote operation error
# where the suite wants a remote invalid request); those are listed below
# in `deviations`, each with what the device does, and do not fail the
# run. Any other failure, or a listed deviation that starts passing, does.
#
# The VM's kernel, initramfs and siw.ko come from `vm.sh setup` (cached in
# /var/tmp/vm-rdma); this script boots its own VM from a directory of links
# to them ($VMH_DIR, default /var/tmp/vm-rdma-ib) with its own network
# namespace and tap, so that another VM may run beside it. Everything is
# torn down on exit. Exit status: 0 when every run passed.
#
# Knobs (environment), for running a part while diagnosing:
#   GOVERBS_IBVERBS_DEVICES  the devices, in order (default "rxe0 siw0")
#   GOVERBS_IBVERBS_STEPS    the steps (default "conformance ping kv rlog imm baddays");
#                            ping on siw0 includes tcp0 on the host; "bench"
#                            (not by default, about 2 minutes) runs goverbs bench
#                            --compare on rxe0 beside perftest's ib_* programs
#   GOVERBS_IBVERBS_BENCH_MD with "bench": also write the run's tables, over
#                            GOVERBS_IBVERBS_BENCH_REPEAT rounds (default 1), to
#                            this file; docs/performance-rxe.md is made so:
#                            GOVERBS_IBVERBS_DEVICES=rxe0 GOVERBS_IBVERBS_STEPS=bench \
#                            GOVERBS_IBVERBS_BENCH_MD=docs/performance-rxe.md \
#                            GOVERBS_IBVERBS_BENCH_REPEAT=3 interop/ibverbs.sh
#   GOVERBS_IBVERBS_RUN      a -test.run filter for the conformance cases,
#                            below TestConformance (e.g. 'Protection/WrongLKey')
#   GOVERBS_IBVERBS_LOGS     a directory to keep the runs' logs in
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
start_time=$(date +%s)

log() { echo "== interop/ibverbs.sh: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# record WHAT STATUS DETAIL [FILE...]: adds WHAT's outcome to the summary
# and logs it: "ok" with DETAIL when STATUS is 0, else "FAIL", the FILEs
# (the check's output) shown and the run marked failed.
record() {
	local what=$1 status=$2 detail=$3
	shift 3
	if [[ $status == 0 ]]; then
		summary+=("$what: ok${detail:+, $detail}")
	else
		summary+=("$what: FAIL")
		(($# == 0)) || cat "$@" >&2
		failed=1
	fi
	log "${summary[-1]}"
}

[[ $(id -u) == 0 ]] || die "needs root (network namespace, tap device, apt): run it with sudo"

vmsh=${GOVERBS_VMSH:-}
for c in "$repo/shared/vm/vm.sh" "$repo/../shared/vm/vm.sh" /work/shared/vm/vm.sh; do
	[[ -z $vmsh && -x $c ]] && vmsh=$c
done
[[ -n $vmsh && -x $vmsh ]] || die "cannot find vm.sh: set GOVERBS_VMSH to the path of shared/vm/vm.sh"

if ! command -v go >/dev/null 2>&1; then
	[[ -x /usr/local/go/bin/go ]] || die "no go command on PATH or in /usr/local/go/bin"
	export PATH="/usr/local/go/bin:$PATH"
fi

# Cases the kernel devices answer otherwise than the suite asks, as
# "device case" -> what the device does. A text that starts with
# "sometimes: " is a deviation that depends on timing: the case may pass.
declare -A deviations=(
	["rxe0 SendRecv/RecvTooSmall"]="rxe completes the Send with REM_OP_ERR, not REM_INV_REQ_ERR"
	["rxe0 RNR/Drain"]="rxe raises SQ_DRAINED while a Send is still being retried receiver-not-ready"
	["rxe0 Protection/WrongLKey"]="rxe completes a WR with a bad lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 Lifecycle/DeregLocalKey"]="rxe completes a WR with a deregistered lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 Lifecycle/CQOverrun"]="rxe rounds a CQ of 4 entries up and does not overrun"
	["rxe0 SRQ/LastWQEReached"]="rxe raises no LAST_WQE_REACHED when a QP on an SRQ moves to the error state"
	["rxe0 Completion/SolicitedOnlySendErrors"]="rxe raises no notification for an error completion on a CQ armed for solicited completions only"
	["rxe0 Hostile/Misaligned"]="rxe's ibv_post_send refuses a misaligned atomic with EINVAL, which this case does not accept"
	["rxe0 Hostile/SendTooLarge"]="rxe completes a Send longer than the QP's maximum message with LOC_QP_OP_ERR, not LOC_LEN_ERR"
	["rxe0 Lifecycle/Drain"]="rxe does not restart its send queue on SQD->RTS: a WR posted in SQD does not complete"
	["rxe0 PeerFailure/Silent"]="rxe answers RDMA Reads in the kernel, so stopping the peer's process leaves the Read answered"
	["rxe0 Protection/OtherPDLKey"]="rxe completes a WR whose lkey names a region of another PD with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 Protection/UnsignaledFault"]="rxe completes a WR with a bad lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 Protection/LocalWrap"]="rxe checks a local SGE only as it moves the data: one longer than its region completes with LOC_QP_OP_ERR, and a Read's goes to the responder, which answers REM_ACCESS_ERR"
	["rxe0 SendRecv/RecvBadLKey"]="rxe completes a receive with a bad lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 SendRecv/RecvNoLocalWrite"]="rxe completes a receive into a region without local write with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 SRQ/RecvBadLKey"]="rxe completes a receive with a bad lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["rxe0 RDMA/ReadsBeyondORD"]="rxe grants 128 outstanding Reads, more than the case's send queue of 64 WRs holds, so the case cannot post beyond it"
	["rxe0 Protection/QPAccessKept"]="rxe answers a Write to a QP without remote write with REM_INV_REQ_ERR, not REM_ACCESS_ERR"
	["rxe0 SRQ/Full"]="rxe's SRQ ring rounds up and takes more receives than the max_wr ibv_create_srq reports"
	["rxe0 SRQ/LastWQEAfterPlacement"]="rxe raises no LAST_WQE_REACHED when a QP on an SRQ moves to the error state"
	["rxe0 MemoryWindow/Type1"]="rxe checks an access through a window against the bounds of the whole region, not the window's: a Read past the window but inside the region succeeds"
	["rxe0 MemoryWindow/SendWithInvRefused"]="rxe's responder refuses the invalidation of a type 1 window but sends no NAK, so the Send completes successfully; and it invalidates a type 2 window bound to another QP of the PD"
	["rxe0 MemoryWindow/DeregRegion"]="rxe refuses to deregister a region with a window bound to it (EINVAL, reported as ErrBusy)"
	["siw0 SendRecv/RecvTooSmall"]="siw answers a receive too small with a Terminate, and the Send does not complete within the case's wait"
	["siw0 SendRecv/Solicited"]="siw raises no notification for a solicited Send on a CQ armed for solicited completions"
	["siw0 SendRecv/SolicitedOnly"]="siw raises no notification for a solicited Send on a CQ armed for solicited completions"
	["siw0 SendRecv/RecvBadLKey"]="siw completes a receive with a bad lkey with GENERAL_ERR, not LOC_PROT_ERR"
	["siw0 SendRecv/RecvNoLocalWrite"]="siw completes a receive into a region without local write with GENERAL_ERR, not LOC_PROT_ERR"
	["siw0 Completion/SolicitedOnlySendErrors"]="siw raises no notification for an error completion on a CQ armed for solicited completions only"
	["siw0 SRQ/RecvBadLKey"]="siw completes a receive with a bad lkey with GENERAL_ERR, not LOC_PROT_ERR"
	["siw0 RNR/RetryExceeded"]="siw completes a Send once TCP has taken it: a Send that meets no receive completes successfully before the peer ends the connection"
	["siw0 RNR/RetryForever"]="siw completes a Send once TCP has taken it: a Send that meets no receive completes successfully before the peer ends the connection"
	["siw0 RDMA/ReadMultiSGE"]="siw scatters an RDMA Read into one SGE (max_sge_rd 1): the provider refuses more with ErrUnsupported"
	["siw0 Protection/WrongLKey"]="siw completes a WR with a bad lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["siw0 Protection/LocalOutOfBounds"]="siw completes a WR reaching outside its local region with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["siw0 Protection/WrongRKey"]="siw completes an RDMA Write or Read the peer refuses successfully; the peer ends the connection afterwards"
	["siw0 Protection/RemotePastEnd"]="siw completes an RDMA Write or Read the peer refuses successfully; the peer ends the connection afterwards"
	["siw0 Protection/RemoteBelowStart"]="siw completes an RDMA Write or Read the peer refuses successfully; the peer ends the connection afterwards"
	["siw0 Protection/NoRemoteWrite"]="siw completes an RDMA Write or Read the peer refuses successfully; the peer ends the connection afterwards"
	["siw0 Protection/NoRemoteRead"]="siw serves an RDMA Read of a region that grants no remote read: the Read completes successfully with the data"
	["siw0 Protection/RemoteWrap"]="siw completes an RDMA Write the peer refuses successfully (or not before the peer's Terminate ends the connection), and a Read after it never completes before the Write behind it"
	["siw0 Protection/OtherPDRKey"]="siw completes an RDMA Write the peer refuses successfully (or not before the peer's Terminate ends the connection), and a Read after it never completes before the Write behind it"
	["siw0 Protection/UnsignaledFault"]="siw completes a WR with a bad lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR, and a Write the peer refuses successfully"
	["siw0 Protection/OtherPDLKey"]="siw completes a WR whose lkey names a region of another PD with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["siw0 Protection/LocalWrap"]="siw completes a WR whose local SGE wraps or exceeds its region with LOC_QP_OP_ERR or GENERAL_ERR, not LOC_PROT_ERR"
	["siw0 Protection/QPNoRemoteRights"]="siw serves RDMA Reads and Writes to a QP granted no remote rights, and the QP stays in RTS"
	["siw0 Hostile/ForgedKey"]="siw completes an RDMA Write with a forged rkey successfully (the peer ends the connection afterwards) and serves a Read with a private region's key"
	["siw0 Hostile/GuessedKeys"]="siw completes an RDMA Write with a guessed rkey successfully; the peer ends the connection afterwards"
	["siw0 Hostile/StaleKey"]="siw completes an RDMA Write with a deregistered region's rkey successfully; the peer ends the connection afterwards"
	["siw0 Hostile/OutOfBounds"]="siw completes an RDMA Write outside the region successfully (the peer ends the connection afterwards); a Read there is flushed, not failed with REM_ACCESS_ERR"
	["siw0 Hostile/MissingRights"]="siw completes an RDMA Write to a region without remote write successfully, and serves a Read of a region without remote read"
	["siw0 Hostile/AfterDisconnect"]="siw flushes a WR posted to a QP in the error state only when the kernel posts it (siw_post_send): a user QP's WR stays in its mapped send queue and never completes"
	["siw0 PeerFailure/Silent"]="sometimes: siw completes an RDMA Write once it is sent and a Read when its response arrives: the Write posted after a Read completes first, out of the send queue's order"
	["siw0 Protection/ManyRegions"]="an RDMA Write with a deregistered region's rkey (after thousands of regions came and went) draws the peer's Terminate (DDP tagged buffer, invalid STag); siw moves the QP to the error state but neither completes nor flushes that Write or the one behind it"
	["siw0 Hostile/SendTooLarge"]="siw completes a Send larger than the peer's receive successfully; the peer ends the connection afterwards"
	["siw0 Lifecycle/DeregLocalKey"]="siw completes a WR with a deregistered lkey with LOC_QP_OP_ERR, not LOC_PROT_ERR"
	["siw0 SRQ/NoLastWQEAfterReset"]="siw keeps a QP in ERR for good and takes a move to RESET without making it: the provider refuses that move (ErrUnsupported)"
	["siw0 Lifecycle/Reuse"]="siw keeps a QP that was connected in RTS or ERR for good and takes a move to RESET without making it: the provider refuses that move (ErrUnsupported), and a QP is connected once"
	["siw0 Protection/QPAccessKept"]="siw serves an RDMA Write to a QP granted no remote write: the Write completes successfully"
	["siw0 Lifecycle/DeregMR"]="siw completes an RDMA Write to a deregistered region successfully; the peer ends the connection afterwards"
	["siw0 Lifecycle/CQOverrun"]="siw does not overrun a CQ of 4 entries nor move the QP to the error state"
	["siw0 SRQ/LastWQEReached"]="siw raises no LAST_WQE_REACHED when a QP on an SRQ moves to the error state"
	["siw0 SRQ/LastWQEAfterPlacement"]="siw raises no LAST_WQE_REACHED when a QP on an SRQ moves to the error state"
)

base=${GOVERBS_VM_BASE:-/var/tmp/vm-rdma}
export VMH_DIR=${VMH_DIR:-/var/tmp/vm-rdma-ib}
export VMH_NS=${VMH_NS:-gvib$$} VMH_TAP=${VMH_TAP:-gvibtap$$} VMH_TIMEOUT=${VMH_TIMEOUT:-3600}
guest=${VMH_GUEST_IP:-10.77.0.2}
work=$(mktemp -d /tmp/goverbs-ibverbs.XXXXXX)
cleanup() {
	set +e
	if [[ -n ${GOVERBS_IBVERBS_LOGS:-} ]]; then
		mkdir -p "$GOVERBS_IBVERBS_LOGS" && cp "$work"/*.log* "$work"/*.out "$GOVERBS_IBVERBS_LOGS"/ 2>/dev/null
	fi
	"$vmsh" stop >/dev/null 2>&1
	"$vmsh" net-down >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building goverbs and the provider's test binary (CGO_ENABLED=0)"
CGO_ENABLED=0 go build -buildvcs=false -o "$work/goverbs" ./cmd/goverbs
CGO_ENABLED=0 go build -buildvcs=false -o "$work/cmatose" ./examples/cmatose
CGO_ENABLED=0 go build -buildvcs=false -o "$work/perftestpeer" ./examples/perftestpeer
CGO_ENABLED=0 go test -buildvcs=false -c -o "$work/ibverbs.test" ./provider/ibverbs

log "vm.sh setup in $base (packages, kernel, siw.ko)"
VMH_DIR=$base "$vmsh" setup >"$work/setup.log" 2>&1 || { tail -30 "$work/setup.log" >&2; die "vm.sh setup failed"; }
mkdir -p "$VMH_DIR"
for f in "$base"/*; do
	[[ $(basename "$f") == state ]] && continue
	ln -sfn "$f" "$VMH_DIR/$(basename "$f")"
done

devices=${GOVERBS_IBVERBS_DEVICES:-rxe0 siw0}
steps=" ${GOVERBS_IBVERBS_STEPS:-conformance ping kv rlog imm baddays} "
runfilter=${GOVERBS_IBVERBS_RUN:-}
step() { [[ $steps == *" $1 "* ]]; }

failed=0
summary=()

# conformance DEV: the suite on DEV; prints a line per case and counts.
conformance() {
	local dev=$1 out=$work/conformance-$1.log
	log "$dev: conformance suite (two processes)"
	local remote='^TestConformance$' inproc='^TestConformanceInProcess$/^(SRQ|Protection)$/^(LastWQEAfterPlacement|NoLastWQEAfterReset|QPAccessKept)$'
	if [[ -n $runfilter ]]; then
		remote="^TestConformance\$/$runfilter"
		inproc="^TestConformanceInProcess\$/$runfilter"
	fi
	"$vmsh" exec "cd /tmp && GOVERBS_IBVERBS_DEVICE=$dev GOVERBS_IBVERBS_HOST=$guest timeout 1800 $work/ibverbs.test -test.run '$remote' -test.v -test.timeout 30m 2>&1" >"$out" 2>&1 || true
	log "$dev: the cases that need both endpoints in one process"
	"$vmsh" exec "cd /tmp && GOVERBS_IBVERBS_DEVICE=$dev GOVERBS_IBVERBS_HOST=$guest timeout 600 $work/ibverbs.test -test.run '$inproc' -test.v -test.timeout 10m 2>&1" >"$out.inproc" 2>&1 || true
	local pass=0 skip=0 fail=0 dev_fail=0 line res name reason key others=()
	# A case is "TestConformance/Group/Name"; the in-process run stands
	# for the remote run's skips of the cases it runs.
	declare -A result=() why=()
	for f in "$out" "$out.inproc"; do
		while read -r line; do
			res=${line%%:*}
			name=$(sed -E 's/^[A-Z]+: TestConformance(InProcess)?\/([^ ]+) .*/\2/' <<<"$line")
			# The in-process run stands in only for cases the remote run
			# skipped or did not run.
			[[ $f == "$out.inproc" && -n ${result[$name]:-} && ${result[$name]} != SKIP ]] && continue
			result[$name]=$res
		done < <(grep -E '^\s*--- (PASS|FAIL|SKIP): TestConformance(InProcess)?/[^/ ]+/[^/ ]+ ' "$f" | sed -E 's/^\s*--- //')
		# The reason of each skip: the first log line of its run.
		while read -r name; do
			why[$name]=$(grep -A3 -E "^=== RUN\s+TestConformance(InProcess)?/$name\$" "$f" | grep -m1 -E '\.go:[0-9]+:' | sed -E 's/^\s*[a-z_]+\.go:[0-9]+: //')
		done < <(grep -E '^\s*--- SKIP: TestConformance(InProcess)?/[^/ ]+/[^/ ]+ ' "$f" | sed -E 's/^\s*--- SKIP: TestConformance(InProcess)?\/([^ ]+) .*/\2/')
	done
	[[ ${#result[@]} -gt 0 ]] || { tail -40 "$out" >&2; log "FAIL: $dev: the suite reported no case"; failed=1; return; }
	for name in $(printf '%s\n' "${!result[@]}" | sort); do
		res=${result[$name]}
		key="$dev $name"
		case $res in
		PASS)
			pass=$((pass + 1))
			if [[ ${deviations[$key]:-} == "sometimes: "* ]]; then
				echo "  PASS $name (the device deviates here only sometimes)"
			elif [[ -n ${deviations[$key]:-} ]]; then
				echo "  PASS $name (listed as a deviation of $dev: remove it from the list)"
				failed=1
			else
				echo "  PASS $name"
			fi
			;;
		SKIP)
			skip=$((skip + 1))
			echo "  SKIP $name: ${why[$name]:-}"
			;;
		FAIL)
			if [[ -n ${deviations[$key]:-} ]]; then
				dev_fail=$((dev_fail + 1))
				echo "  FAIL $name (device deviation: ${deviations[$key]})"
			else
				fail=$((fail + 1))
				others+=("$name")
				echo "  FAIL $name"
				grep -A4 -E "^=== RUN\s+TestConformance(InProcess)?/$name\$" "$out" "$out.inproc" | grep -E '\.go:[0-9]+:' | head -3 | sed 's/^/       /' || true
				failed=1
			fi
			;;
		esac
	done
	summary+=("$dev conformance: $pass passed, $skip skipped, $dev_fail failed as the device deviates, $fail failed otherwise${others[*]:+ (${others[*]})}")
	log "${summary[-1]}"
}

# abandoned_accept DEV: after an accept whose requester gave up, the QP
# reports a true state (on siw, accepting again on a QP in ERR upsets the kernel).
abandoned_accept() {
	local dev=$1 out=$work/accept-$1.log
	local st=0
	# (set -e: a failing exec must be recorded, not end the script.)
	"$vmsh" exec "cd /tmp && GOVERBS_IBVERBS_DEVICE=$dev GOVERBS_IBVERBS_HOST=$guest timeout 300 $work/ibverbs.test -test.run '^TestAcceptAbandonedQPStateHolds\$' -test.v -test.timeout 4m 2>&1" >"$out" 2>&1 || st=$?
	grep -q '^--- PASS: TestAcceptAbandonedQPStateHolds' "$out" || st=1
	record "$dev accept abandoned by its requester" $st "" "$out"
}

# cm_tool DEV NAME SERVER CLIENT [CHECK]: SERVER and then CLIENT run in
# the guest on DEV (PORT in each is replaced), one of them a librdmacm
# program and the other goverbs through this provider; both must exit 0,
# and then CHECK, a command that may read their outputs (/tmp/cms.out,
# /tmp/cmc.out), must succeed. The last line printed (by CHECK, else the
# client's) is the summary's detail. Each call takes the next port.
cm_port=$((7300 + RANDOM % 50))
cm_tool() {
	local dev=$1 name="$dev: $2" check=${5:-tail -1 /tmp/cmc.out} port=$((cm_port++)) rc
	log "$name"
	if "$vmsh" exec "rm -f /tmp/cms.rc; (timeout 120 ${3//PORT/$port} >/tmp/cms.out 2>&1; echo \$? >/tmp/cms.rc) >/dev/null 2>&1 &
		for i in \$(seq 50); do rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN' && break; sleep 0.1; done
		timeout 120 ${4//PORT/$port} >/tmp/cmc.out 2>&1 || { echo client failed; tail -5 /tmp/cmc.out; exit 1; }
		for i in \$(seq 300); do [ -f /tmp/cms.rc ] && break; sleep 0.1; done
		[ \"\$(cat /tmp/cms.rc 2>/dev/null)\" = 0 ] || { echo server failed; tail -5 /tmp/cms.out; exit 1; }
		$check" >"$work/cmtool.out" 2>&1; then rc=0; else rc=$?; fi
	record "$name" $rc "$(tail -1 "$work/cmtool.out")" "$work/cmtool.out"
}

# cmatose_both DEV: examples/cmatose -d DEV against librdmacm's ucmatose
# (10 connections, 10 messages each way, either side serving) and its
# rdma_server and rdma_client.
cmatose_both() {
	local dev=$1 c="$work/cmatose -d $1"
	cm_tool "$dev" "ucmatose -b <- cmatose -s, 10 connections x 10 messages" \
		"ucmatose -b $guest -p PORT -c 10 -C 10" "$c -s $guest -p PORT -c 10 -C 10"
	cm_tool "$dev" "cmatose -b <- ucmatose -s, 10 connections x 10 messages" \
		"$c -b $guest -p PORT -c 10 -C 10" "ucmatose -s $guest -p PORT -c 10 -C 10"
	cm_tool "$dev" "rdma_server <- cmatose -answer -s" \
		"rdma_server -s $guest -p PORT" "$c -answer -s $guest -p PORT -c 1 -C 1 -S 16"
	cm_tool "$dev" "cmatose -answer -b <- rdma_client" \
		"$c -answer -b $guest -p PORT -c 1 -C 1 -S 16" "rdma_client -s $guest -p PORT"
}

# perftest_both DEV: examples/perftestpeer -d DEV against perftest's
# latency tools with -R on DEV, either side serving, 100 iterations of
# 64 bytes. perftest's client prints a result row (#bytes #iterations
# t_min t_max t_typical ...), which must be there, with figures or,
# when perftest could not calibrate its clock (in the emulated guest it
# sometimes cannot, against itself too), "inf"; perftestpeer prints the
# count it checked (a server of read_lat, which sees no Read, that it
# served them).
perftest_both() {
	local dev=$1 n=100 size=64 t
	local p="$work/perftestpeer -d $1 -n $n -size $size"
	local row="awk '/^ *$size +$n +/ {t = \$5 == \"inf\" ? \"inf (uncalibrated clock)\" : \$5 \" us\"; print \"perftest t_typical \" t; ok=1} END {exit !ok}'"
	for t in send_lat write_lat read_lat; do
		if [[ $t == read_lat ]]; then
			# perftest's read_lat server prints no result row.
			cm_tool "$dev" "ib_$t -R <- perftestpeer $t, $n iterations of $size bytes" \
				"ib_$t -R -d $dev -n $n -s $size -p PORT" "$p -s $guest -p PORT $t" \
				"grep '$n iterations of $size bytes: ok' /tmp/cmc.out"
		else
			cm_tool "$dev" "ib_$t -R <- perftestpeer $t, $n iterations of $size bytes" \
				"ib_$t -R -d $dev -n $n -s $size -p PORT" "$p -s $guest -p PORT $t" \
				"grep -q '$n iterations of $size bytes: ok' /tmp/cmc.out && $row /tmp/cms.out"
		fi
		local done="grep -q '$n iterations of $size bytes: ok' /tmp/cms.out"
		[[ $t == read_lat ]] && done="grep -q 'served the client.s Reads of $size bytes: ok' /tmp/cms.out"
		cm_tool "$dev" "perftestpeer $t <- ib_$t -R, $n iterations of $size bytes" \
			"$p -b $guest -p PORT $t" "ib_$t -R -d $dev -n $n -s $size -p PORT $guest" \
			"$done && $row /tmp/cmc.out"
	done
}

# ping_both DEV: goverbs ping -d DEV against rping on DEV, both
# directions, 100 pings whose data both ends check.
ping_both() {
	local dev=$1 count=100 size=64
	cm_tool "$dev" "rping -s <- goverbs ping -c, $count pings of $size bytes" \
		"rping -s -a $guest -p PORT -v -C $count -S $size" \
		"$work/goverbs ping -d $dev -c -a $guest -p PORT -C $count -S $size -v" \
		"[ \$(grep -c '^ping data: rdma-ping-' /tmp/cmc.out) = $count ] && [ \$(grep -c '^server ping data: rdma-ping-' /tmp/cms.out) = $count ] && tail -1 /tmp/cmc.out"
	cm_tool "$dev" "goverbs ping -s <- rping -c, $count pings of $size bytes" \
		"$work/goverbs ping -d $dev -s -a $guest -p PORT -C $count -S $size" \
		"rping -c -a $guest -p PORT -v -V -C $count -S $size" \
		"[ \$(grep -c '^ping data: rdma-ping-' /tmp/cmc.out) = $count ] && tail -1 /tmp/cms.out"
}

# ping_tcp0: goverbs on siw0 (this provider, the kernel's iWARP) against
# goverbs tcp0 on the host (goverbs' own iWARP), both directions.
ping_tcp0() {
	local count=100 size=64 port=$((7500 + RANDOM % 100)) host=${VMH_HOST_IP:-10.77.0.1} rc
	log "siw0: goverbs ping -d siw0 -s <- goverbs ping -c (tcp0 on the host)"
	"$vmsh" exec "(timeout 120 $work/goverbs ping -d siw0 -s -a $guest -p $port -C $count -S $size >/tmp/gs.out 2>&1; echo \$? >/tmp/gs.rc) >/dev/null 2>&1 &
		for i in \$(seq 50); do rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN' && break; sleep 0.1; done"
	if "$vmsh" hostns "timeout 120 $work/goverbs ping -c -a $guest -p $port -C $count -S $size -v" >"$work/tcp0c.out" 2>&1 &&
		[[ $(grep -c '^ping data: rdma-ping-' "$work/tcp0c.out") == "$count" ]] &&
		"$vmsh" exec "for i in \$(seq 100); do [ -f /tmp/gs.rc ] && break; sleep 0.1; done; [ \"\$(cat /tmp/gs.rc)\" = 0 ]"; then rc=0; else rc=$?; fi
	record "siw0 server, tcp0 client" $rc "$(tail -1 "$work/tcp0c.out")" "$work/tcp0c.out"
	port=$((port + 1))
	log "siw0: goverbs ping -s (tcp0 on the host) <- goverbs ping -d siw0 -c"
	"$vmsh" hostns "timeout 120 $work/goverbs ping -s -a $host -p $port -C $count -S $size" >"$work/tcp0s.out" 2>&1 &
	local srv=$!
	"$vmsh" hostns "for i in \$(seq 100); do ss -ltn | grep -q ':$port ' && exit 0; sleep 0.1; done; exit 1" || true
	if "$vmsh" exec "timeout 120 $work/goverbs ping -d siw0 -c -a $host -p $port -C $count -S $size -v >/tmp/gc.out 2>&1 || exit 1
		[ \"\$(grep -c '^ping data: rdma-ping-' /tmp/gc.out)\" = $count ] && tail -1 /tmp/gc.out" >"$work/siwc.out" 2>&1 && wait "$srv"; then rc=0; else rc=$?; fi
	record "tcp0 server, siw0 client" $rc "$(tail -1 "$work/siwc.out")" "$work/siwc.out" "$work/tcp0s.out"
}

# kv: goverbs kv (server and client, GET by one-sided RDMA Read) on rxe0.
kv() {
	local rc a=rdma://$guest:$((7700 + RANDOM % 50))
	log "rxe0: goverbs kv serve, put, get, del"
	if "$vmsh" exec "G=$work/goverbs
		(timeout 120 \$G kv serve -l $a >/tmp/kvs.out 2>&1; echo \$? >/tmp/kvs.rc) >/dev/null 2>&1 &
		for i in \$(seq 150); do grep -q serving /tmp/kvs.out && break; [ -f /tmp/kvs.rc ] && break; sleep 0.2; done
		grep -q serving /tmp/kvs.out || { cat /tmp/kvs.out; exit 1; }
		\$G kv put -a $a alpha 'value one' || exit 1
		[ \"\$(\$G kv get -a $a alpha)\" = 'value one' ] || exit 1
		big=\$(head -c 3000 /dev/zero | tr '\\0' x); \$G kv put -a $a beta \"\$big\" || exit 1
		[ \"\$(\$G kv get -a $a beta)\" = \"\$big\" ] || exit 1
		\$G kv del -a $a alpha || exit 1
		\$G kv get -a $a alpha 2>&1 | grep -q 'key not found'" >"$work/kv.out" 2>&1; then rc=0; else rc=$?; fi
	record "rxe0 kv" $rc "put, one-sided get of 9 and 3000 bytes, delete" "$work/kv.out"
}

# rlog: a replicated log of three members on rxe0, sharing a secret.
rlog() {
	local rc p=$((7760 + RANDOM % 30))
	local m=rdma://$guest:$p,rdma://$guest:$((p + 1)),rdma://$guest:$((p + 2))
	head -c 32 /dev/urandom >"$work/secret"
	chmod 600 "$work/secret"
	log "rxe0: an rlog of three members, five records appended"
	if "$vmsh" exec "G=$work/goverbs; S='--members $m --secret-file $work/secret'; rm -rf /tmp/rl1 /tmp/rl2 /tmp/rl3 /tmp/rl*.rc
		up() { grep -q serving /tmp/rl\$1.out || { [ -f /tmp/rl\$1.rc ] && { cat /tmp/rl\$1.out; exit 1; }; return 1; }; }
		for i in 2 3; do mkdir -p /tmp/rl\$i; (timeout 120 \$G log serve --data /tmp/rl\$i --listen rdma://$guest:\$(($p + i - 1)) \$S >/tmp/rl\$i.out 2>&1; echo \$? >/tmp/rl\$i.rc) >/dev/null 2>&1 & done
		for i in \$(seq 150); do up 2 && up 3 && break; sleep 0.2; done
		mkdir -p /tmp/rl1; (timeout 120 \$G log serve --data /tmp/rl1 --listen rdma://$guest:$p \$S --primary -v >/tmp/rl1.out 2>&1; echo \$? >/tmp/rl1.rc) >/dev/null 2>&1 &
		for i in \$(seq 300); do [ \$(grep -c 'connected' /tmp/rl1.out) -ge 2 ] && break; up 1 >/dev/null; sleep 0.2; done
		\$G log append --addr $m one two three four five || { cat /tmp/rl1.out; exit 1; }
		for i in 1 2 3; do \$G log tail --data /tmp/rl\$i -n 5 | grep -q '\"five\"' || { echo member \$i lacks the records; exit 1; }; done" >"$work/rlog.out" 2>&1; then rc=0; else rc=$?; fi
	record "rxe0 rlog" $rc "three members, five records on each" "$work/rlog.out"
}

# imm: goverbs' Send with immediate data, read by rdma-core's C API
# through pyverbs on rxe0.
imm() {
	local port=$((7800 + RANDOM % 50)) rc
	log "rxe0: goverbs Send with immediate 0x11223344 -> interop/imm_peer.py (pyverbs)"
	if "$vmsh" exec "(timeout 120 /usr/bin/python3 $repo/interop/imm_peer.py $guest $port >/tmp/imm.out 2>&1; echo \$? >/tmp/imm.rc) >/dev/null 2>&1 &
		for i in \$(seq 100); do grep -q listening /tmp/imm.out && break; [ -f /tmp/imm.rc ] && break; sleep 0.2; done
		GOVERBS_IBVERBS_DEVICE=rxe0 GOVERBS_IBVERBS_IMM_PEER=rdma://$guest:$port timeout 120 $work/ibverbs.test -test.run '^TestImmediateToPeer\$' -test.v 2>&1 || exit 1
		for i in \$(seq 100); do [ -f /tmp/imm.rc ] && break; sleep 0.2; done
		cat /tmp/imm.out; [ \"\$(cat /tmp/imm.rc)\" = 0 ] && grep -q '^imm 0x11223344 ' /tmp/imm.out" >"$work/imm.out" 2>&1; then rc=0; else rc=$?; fi
	record "rxe0 immediate data" $rc "$(grep '^imm ' "$work/imm.out" || true)" "$work/imm.out"
}

# baddays: the bad-day cases on rxe devices of their own, each in a
# process of its own (librdmacm keeps a context on each device the
# process used until it exits, and the removal of a device waits for
# that); prints each case's outcome and what it observed, and checks
# that its device and veth pair are gone once its process has exited.
baddays() {
	local out=$work/baddays.log pass=0 fail=0 c
	log "rxe0: bad days (a device removed, a link down, closing with the link down, regions deregistered under transfers)"
	: >"$out"
	# A hang is caught by the case's own bounds (it prints every
	# goroutine's stack and the kernel's stack of every thread), then by
	# -test.timeout, then by SIGQUIT, which makes Go print the stacks.
	for c in DeviceRemoved PortDown CloseWithPortDown DeregUnderRead DeregUnderWrite; do
		if "$vmsh" exec "cd /tmp && GOVERBS_IBVERBS_BADDAYS=1 GOTRACEBACK=all timeout -s QUIT 600 $work/ibverbs.test -test.run '^TestBadDay$c\$' -test.v -test.timeout 9m 2>&1" >"$out.$c" 2>&1 &&
			grep -q -- "--- PASS: TestBadDay$c " "$out.$c" &&
			"$vmsh" exec "for i in \$(seq 240); do rdma link show | grep -q rxe_bad || ip -br link | grep -q gvbad || exit 0; sleep 0.5; done; rdma link show; ip -br link; exit 1" >>"$out.$c" 2>&1; then
			pass=$((pass + 1))
			echo "  PASS $c"
		else
			fail=$((fail + 1))
			failed=1
			echo "  FAIL $c"
		fi
		grep -E '^\s+baddays_test\.go:[0-9]+:' "$out.$c" | sed -E 's/^\s+/       /' || true
		cat "$out.$c" >>"$out"
	done
	summary+=("rxe0 bad days: $pass passed, $fail failed")
	log "${summary[-1]}"
}

# bench: goverbs bench on rxe0 with perftest's ib_write_lat, ib_read_lat,
# ib_send_lat and ib_write_bw on the same device (one round of 5,000
# iterations of 8 B): each test gives goverbs' figure and perftest's, or
# the reason perftest gave none. The ratios are printed, not judged: the
# guest is emulated, and docs/performance.md has a longer run.
bench() {
	log "rxe0: goverbs bench --compare beside perftest: write_lat read_lat send_lat write_bw, 8 B"
	local tests='["read_lat","send_lat","write_bw","write_lat"]'
	local md="" repeat=${GOVERBS_IBVERBS_BENCH_REPEAT:-1}
	if [[ -n ${GOVERBS_IBVERBS_BENCH_MD:-} ]]; then
		md="--markdown /tmp/performance-rxe.md"
	fi
	# A guest job's stderr reaches the host mixed into its stdout, so
	# goverbs' own stderr is kept in the guest: the JSON stays JSON, and a
	# failure shows both.
	if "$vmsh" exec "timeout $((600 * repeat)) $work/goverbs bench -d rxe0 write_lat read_lat send_lat write_bw -s 8 -n 5000 -I 0 --compare --repeat $repeat --json $md 2>/tmp/bench.err" >"$work/bench.json" 2>"$work/bench.err" &&
		jq -e "([.results[] | select(.device == \"rxe0\") | .test] | unique) == $tests and
			([(.comparisons // [])[] | select(.peer == \"perftest rxe0\") | .test] + [(.skipped // [])[] | select(.peer == \"perftest rxe0\") | .test | sub(\"^ib_\"; \"\")] | unique) == $tests" "$work/bench.json" >/dev/null; then
		summary+=("rxe0 bench against perftest: ok, goverbs' speed $(jq -r '[.comparisons[] | select(.peer == "perftest rxe0") | "\(.test) \(.speedup * 100 | round / 100)x"] | join(", ")' "$work/bench.json")$(jq -r '[(.skipped // [])[] | select(.peer == "perftest rxe0") | "; no perftest \(.test): \(.reason)"] | join("")' "$work/bench.json")")
		if [[ -n $md ]]; then
			# The page says how this script, not the guest's command, makes
			# it; a relative path is from the repository's root.
			local out=$GOVERBS_IBVERBS_BENCH_MD
			[[ $out == /* ]] || out=$repo/$out
			"$vmsh" exec "cat /tmp/performance-rxe.md" |
				sed '1s/.*/# goverbs on rxe0 beside perftest, in a VM/' |
				sed "3s|^This document is generated: .* wrote it, at|This document is generated: \\\`GOVERBS_IBVERBS_DEVICES=rxe0 GOVERBS_IBVERBS_STEPS=bench GOVERBS_IBVERBS_BENCH_MD=${GOVERBS_IBVERBS_BENCH_MD} GOVERBS_IBVERBS_BENCH_REPEAT=$repeat interop/ibverbs.sh\\\` wrote it, in the VM of shared/vm (Linux's Soft-RoCE device rxe0 under qemu's TCG emulation: absolute figures there mean nothing, the ratios of runs seconds apart on the same device are what counts), at|" >"$out.tmp" && mv "$out.tmp" "$out"
		fi
	else
		summary+=("rxe0 bench against perftest: FAIL")
		cat "$work/bench.err" >&2
		"$vmsh" exec "cat /tmp/bench.err" >&2 || true
		tail -c 2000 "$work/bench.json" >&2
		failed=1
	fi
	log "${summary[-1]}"
}

# pyverbs is the peer of the immediate-data check.
if step imm && ! /usr/bin/python3 -c 'import pyverbs.cmid' 2>/dev/null; then
	log "installing python3-pyverbs (rdma-core's Python binding, the immediate-data peer)"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pyverbs >/dev/null
fi

for dev in $devices; do
	link=${dev%0}
	log "booting the VM with $dev only"
	VMH_LINKS=$link "$vmsh" start >"$work/start.log" 2>&1 || { cat "$work/start.log" >&2; die "vm.sh start failed"; }
	"$vmsh" wait-ready 300 >"$work/ready.log" 2>&1 || { cat "$work/ready.log" >&2; die "the VM did not come up"; }
	"$vmsh" exec "rdma link show" >"$work/links" 2>&1 && grep -q "$dev.*ACTIVE" "$work/links" || { cat "$work/links" >&2; die "no active $dev link in the VM"; }
	"$vmsh" exec "rdma resource show" >"$work/res-before" 2>&1 || true
	"$vmsh" exec "$work/goverbs devices -v -d $dev" >&2 || { log "FAIL: goverbs devices -v -d $dev"; failed=1; }
	if step conformance; then conformance "$dev"; fi
	if step conformance; then abandoned_accept "$dev"; fi
	if step ping; then ping_both "$dev"; fi
	if step ping; then cmatose_both "$dev"; fi
	if step ping; then perftest_both "$dev"; fi
	if step ping && [[ $dev == siw0 ]]; then ping_tcp0; fi
	if step kv && [[ $dev == rxe0 ]]; then kv; fi
	if step rlog && [[ $dev == rxe0 ]]; then rlog; fi
	if step imm && [[ $dev == rxe0 ]]; then imm; fi
	if step baddays && [[ $dev == rxe0 ]]; then baddays; fi
	if step bench && [[ $dev == rxe0 ]]; then bench; fi
	# Stop the servers still running (kv, the rlog members; every check
	# is done) and let them exit before counting what is left.
	"$vmsh" exec "for p in \$(pgrep -f '$work/goverbs'); do kill \$p; done; for i in \$(seq 100); do pgrep -f '$work/goverbs' >/dev/null || break; sleep 0.2; done" || true
	# Every process has exited: the kernel objects they made are gone.
	"$vmsh" exec "rdma resource show" >"$work/res-after" 2>&1 || true
	if diff "$work/res-before" "$work/res-after" >&2; then
		summary+=("$dev rdma resource show: as before the run ($(grep "$dev" "$work/res-after" | tr -s ' '))")
	else
		summary+=("$dev rdma resource show: FAIL, kernel objects left behind")
		failed=1
	fi
	"$vmsh" exec 'dmesg' >"$work/dmesg-$dev.log" 2>&1 || true
	if grep -E 'BUG|Oops|WARNING: CPU' "$work/dmesg-$dev.log" >"$work/dmesg.bad"; then
		# The report and the first frames of its call trace, in the
		# summary too: CI may show only the end of the output.
		grep -E -A12 'BUG|Oops|WARNING: CPU' "$work/dmesg-$dev.log" >&2
		summary+=("$dev: FAIL, the guest kernel logged a bug: $(head -1 "$work/dmesg.bad")")
		while read -r line; do summary+=("    $line"); done < <(grep -E -A8 'BUG|Oops|WARNING: CPU' "$work/dmesg-$dev.log" | grep -E 'RIP|Call Trace| [a-z_0-9]+\+0x' | head -8)
		failed=1
	fi
	"$vmsh" stop >/dev/null 2>&1 || true
done

log "summary ($(($(date +%s) - start_time)) s):"
printf '  %s\n' "${summary[@]}" >&2
[[ $failed == 0 ]] || die "some runs failed"
log "PASS"
