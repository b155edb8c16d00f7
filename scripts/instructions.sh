#!/usr/bin/env bash
# scripts/instructions.sh counts the instructions shm0's data path executes
# per operation, with callgrind (valgrind --tool=callgrind) on
# provider/shm's benchmarks, both endpoints in one process. Instruction
# counts do not drift with the machine's load as times do.
#
# Each benchmark runs twice, N and 2N iterations (-test.benchtime=Nx);
# the difference of the two runs' totals divided by N is the count per
# iteration, with the setup (process start, connection, teardown)
# subtracted. GOMAXPROCS=1 keeps idle runtime threads from spinning for
# work (valgrind runs one thread at a time, so a spinning thread adds
# instructions in proportion to wall time); GOGC=off keeps the collector
# out; asyncpreemptoff keeps preemption signals out.
#
# An iteration of PostSendPoll is one PostSend of a signaled WR and the
# Poll that takes its completion; of SendRecv (64 B; SendRecvN, N bytes),
# one Send, the Poll of its receive completion and the PostRecv of the
# next receive (one Send in 64 is signaled and its completion polled):
# up to 96 B the message travels in its completion (provider/shm's
# package doc, "Small Sends"), from 97 B the sender places it; of
# WriteRate, one PostSend of a
# list of 1 or 16 8-byte Writes, one in 16 signaled, and the Polls that
# keep the send queue from filling, shown per Write. FloorWritePoll
# (provider/shm's floor_internal_test.go) is the least a Write and its
# Poll can do through the same interface calls on the same memory: one
# lock each, one copy, one completion stored and loaded, no checks.
#
# Usage: scripts/instructions.sh [N, default 20000] [benchmark regexp]
# Output: a Markdown table, one row per benchmark. Needs Go and valgrind
# (apt-get install valgrind).
set -euo pipefail

cd "$(dirname "$0")/.."

n="${1:-20000}"
filter="${2:-.}"
benches=(
	"BenchmarkPostSendPoll/Write8$|8 B RDMA Write + Poll"
	"BenchmarkPostSendPoll/Read8$|8 B RDMA Read + Poll"
	"BenchmarkPostSendPoll/FetchAdd$|FetchAndAdd + Poll"
	"BenchmarkFloorWritePoll$|floor: 8 B Write + Poll with no checks"
	"BenchmarkSendRecv8$|8 B Send + receive Poll + PostRecv"
	"BenchmarkSendRecv32$|32 B Send + receive Poll + PostRecv"
	"BenchmarkSendRecv$|64 B Send + receive Poll + PostRecv"
	"BenchmarkSendRecv96$|96 B Send + receive Poll + PostRecv"
	"BenchmarkSendRecv97$|97 B Send + receive Poll + PostRecv"
	"BenchmarkSendRecv128$|128 B Send + receive Poll + PostRecv"
	"BenchmarkSendRecv256$|256 B Send + receive Poll + PostRecv"
	"BenchmarkWriteRate/List1$|8 B Write stream, 1 WR per PostSend, per Write|1"
	"BenchmarkWriteRate/List16$|8 B Write stream, 16 WRs per PostSend, per Write|16"
)

if ! command -v valgrind >/dev/null 2>&1; then
	echo "instructions.sh: valgrind is not installed (apt-get install valgrind)" >&2
	exit 2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

go test -c -o "$tmp/shm.test" ./provider/shm

# count runs benchmark $1 for $2 iterations under callgrind and prints the
# total instructions executed.
count() {
	GOMAXPROCS=1 GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off \
		valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" \
		"$tmp/shm.test" -test.run='^$' -test.bench="^$1" -test.benchtime="$2x" \
		>"$tmp/bench.out" 2>"$tmp/vg.out" || {
		cat "$tmp/bench.out" "$tmp/vg.out" >&2
		exit 2
	}
	grep -q "^PASS" "$tmp/bench.out" || {
		cat "$tmp/bench.out" >&2
		exit 2
	}
	sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/vg.out"
}

echo "| operation | instructions per iteration |"
echo "|---|---:|"
for b in "${benches[@]}"; do
	IFS='|' read -r re name per <<<"$b"
	per="${per:-1}"
	[[ "$re" =~ $filter ]] || continue
	one="$(count "$re" "$n")"
	two="$(count "$re" "$((2 * n))")"
	echo "| $name | $(((two - one) / n / per)) |"
done
