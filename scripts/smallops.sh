#!/usr/bin/env bash
# scripts/smallops.sh measures shm0's small operations against UCX's
# shared-memory transport (UCX_TLS=sm,self ucx_perftest) with
# `goverbs bench --compare --repeat`, and counts their instructions with
# scripts/instructions.sh, and writes both into a Markdown document:
# 8 B RDMA Read, FetchAndAdd and RDMA Write latency, the 64 B Send
# ping-pong, and the 8 B RDMA Write message rate with one work request per
# PostSend and with 16 (perftest's --post_list), one in 16 signaled; and
# tcp0's 8 B RDMA Write message rate against UCX over TCP (UCX_TLS=tcp).
#
# Usage: scripts/smallops.sh [rounds, default 3] [output, default
# docs/performance-small.md]
# It needs Go, ucx_perftest (apt-get install ucx-utils) and valgrind
# (apt-get install valgrind). Run it from an otherwise idle machine where
# you can: the ratios compare runs seconds apart, but a loaded machine
# widens their range.
set -euo pipefail

cd "$(dirname "$0")/.."

rounds="${1:-3}"
out="${2:-docs/performance-small.md}"

if ! command -v ucx_perftest >/dev/null 2>&1; then
	echo "smallops.sh: ucx_perftest is not installed (apt-get install ucx-utils)" >&2
	exit 2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/goverbs" ./cmd/goverbs

# compare runs one goverbs bench comparison on a device (shm0 or tcp0) and
# prints its table of ratios against UCX over the same medium.
compare() {
	local dev="$1" peer
	shift
	case "$dev" in
	shm0) peer='ucx sm' ;;
	tcp0) peer='ucx tcp' ;;
	esac
	echo "\$ goverbs bench -d $dev --compare --repeat $rounds $*"
	"$tmp/goverbs" bench -d "$dev" --compare --repeat "$rounds" "$@" >"$tmp/bench.out" 2>&1 || {
		cat "$tmp/bench.out" >&2
		exit 2
	}
	sed -n '/^Compared in the same run/,/^$/p' "$tmp/bench.out" | grep -E "^(Compared|Over| test | .* $peer )"
	echo
}

{
	compare shm0 -s 8 read_lat atomic_lat write_lat
	compare shm0 -s 8 -Q 16 write_bw
	compare shm0 -s 8 -Q 16 --post-list 16 write_bw
	compare shm0 -s 64 send_lat
} >"$tmp/ratios"
compare tcp0 -s 8 -Q 16 write_bw >"$tmp/ratios-tcp"

scripts/instructions.sh 20000 'PostSendPoll|WriteRate|Floor' >"$tmp/instructions"

load="$(cut -d' ' -f1-3 /proc/loadavg)"
{
	cat <<DOC
# Small operations on shm0 and tcp0

This document is generated: \`scripts/smallops.sh $rounds $out\` wrote it, at
$(date -u +%Y-%m-%dT%H:%M:%SZ), on $(uname -s | tr A-Z a-z)/$(uname -m), $(nproc) CPUs,
load average $load. Run the script again to make it again; do not edit it
by hand.

## Against UCX

\`goverbs bench --compare\` runs each test on shm0 and, seconds after, its
counterpart in \`UCX_TLS=sm,self ucx_perftest\`, $rounds rounds of each; the
speed is how many times faster goverbs is (latency: the median of its
round trips; message rate: the average), the median of the rounds' own
ratios, and the range is their lowest and highest. The machine these
figures come from is shared with other work and loaded (the load average
above): times drift 2–4× over minutes on it, and the range shows how much
within one run; compare figures of one run only.

\`\`\`text
$(cat "$tmp/ratios")
\`\`\`

Over TCP, tcp0's 8 B RDMA Write message rate against
\`UCX_TLS=tcp ucx_perftest\`'s \`ucp_put_bw\`, one work request per PostSend:

\`\`\`text
$(cat "$tmp/ratios-tcp")
\`\`\`

## Instructions per operation

Instruction counts do not drift with the machine's load: \`scripts/instructions.sh\`
(docs/instructions.md says how it counts, and where the instructions go)
counts, for each iteration of provider/shm's benchmarks, everything the
process executes.

$(cat "$tmp/instructions")
DOC
} >"$out"
echo "smallops.sh: wrote $out"
