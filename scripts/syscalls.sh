#!/usr/bin/env bash
# scripts/syscalls.sh shows the kernel bypass of provider/shm: it runs the
# mix workload of provider/shm's TestKernelBypassMix in two processes —
# each issuing RDMA Writes, RDMA Reads, FetchAndAdds and Sends against the
# other, receiving the other's Sends and reposting the receives, all with
# busy polling — each process under its own `strace -f -c`, and checks
# that each process makes fewer than one system call per 100 operations.
#
# Everything is counted: the Go runtime's start and its background work
# (sysmon, preemption signals), connection setup and teardown, not only
# the data path. The operations counted are the send-queue work requests
# each process posts and completes; the receives it posts are extra.
#
# Usage: scripts/syscalls.sh [operations per process, default 1000000]
# It needs Go and strace (apt-get install strace). Exit status: 0 if both
# processes stay under the bound, 1 if either breaks it, 2 on any other
# failure.
set -euo pipefail

cd "$(dirname "$0")/.."

ops="${1:-1000000}"
per_round=64 # mixPerRound in provider/shm/bypass_internal_test.go
rounds=$(((ops + per_round - 1) / per_round))
limit=600 # seconds any step may take

if ! command -v strace >/dev/null 2>&1; then
	echo "syscalls.sh: strace is not installed (apt-get install strace)" >&2
	exit 2
fi

tmp="$(mktemp -d)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill -KILL "$p" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

echo "== building the provider/shm test binary"
go test -c -o "$tmp/shm.test" ./provider/shm

addr="shm://@goverbs-syscalls-$$"
mkfifo "$tmp/listener.out"

# The listening side first; it says "listening" when it is ready to accept.
GOVERBS_SHM_CHILD=bypass GOVERBS_SHM_MIX_ROLE=listen GOVERBS_SHM_MIX_ADDR="$addr" GOVERBS_SHM_MIX_ROUNDS="$rounds" \
	timeout "$limit" strace -f -c -o "$tmp/listener.strace" "$tmp/shm.test" >"$tmp/listener.out" 2>"$tmp/listener.err" &
pids+=($!)
lpid=$!
exec 3<"$tmp/listener.out"
if ! read -r -t 60 -u 3 line || [ "$line" != listening ]; then
	echo "syscalls.sh: the listening side did not start: ${line:-nothing}" >&2
	cat "$tmp/listener.err" >&2
	exit 2
fi

echo "== $rounds rounds of $per_round operations a side, each process under strace -f -c"
GOVERBS_SHM_CHILD=bypass GOVERBS_SHM_MIX_ROLE=dial GOVERBS_SHM_MIX_ADDR="$addr" GOVERBS_SHM_MIX_ROUNDS="$rounds" \
	timeout "$limit" strace -f -c -o "$tmp/dialler.strace" "$tmp/shm.test" >"$tmp/dialler.out" 2>"$tmp/dialler.err" &
pids+=($!)
dpid=$!

status=0
wait "$dpid" || status=$?
wait "$lpid" || status=$?
cat <&3 >>"$tmp/listener.out.rest"
exec 3<&-
if [ "$status" != 0 ]; then
	echo "syscalls.sh: the workload failed (exit status $status)" >&2
	cat "$tmp/dialler.out" "$tmp/listener.out.rest" "$tmp/dialler.err" "$tmp/listener.err" >&2
	exit 2
fi

# report SIDE OUTPUT STRACE: prints the figure and returns 1 if the bound
# is broken.
report() {
	local side="$1" out="$2" trace="$3"
	local done calls
	done="$(awk '$1 == "ops" { print $2 }' "$out")"
	calls="$(awk '$NF == "total" { print $4 }' "$trace")"
	if [ -z "$done" ] || [ -z "$calls" ]; then
		echo "syscalls.sh: no figures for the $side" >&2
		cat "$out" "$trace" >&2
		exit 2
	fi
	echo
	echo "== $side: $(cat "$out" | grep '^ops')"
	head -n 12 "$trace"
	awk -v side="$side" -v calls="$calls" -v ops="$done" 'BEGIN {
		per = 100 * calls / ops
		printf "%s: %d system calls for %d operations: %.4f per 100 operations (bound: under 1)\n", side, calls, ops, per
		exit !(per < 1)
	}'
}

fail=0
report dialler "$tmp/dialler.out" "$tmp/dialler.strace" || fail=1
report listener "$tmp/listener.out.rest" "$tmp/listener.strace" || fail=1
if [ "$fail" != 0 ]; then
	echo "syscalls.sh: FAIL: a process made 1 or more system calls per 100 operations" >&2
	exit 1
fi
echo "syscalls.sh: PASS"
