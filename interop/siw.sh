#!/usr/bin/env bash
# interop/siw.sh: goverbs' iWARP provider (device tcp0) against Linux siw,
# the kernel's SoftiWARP, with librdmacm's rping at the other end:
#
#   1. rping -s in a VM running siw, `goverbs ping -c` on the host;
#   2. `goverbs ping -s` on the host, rping -c in the VM;
#
# each with 100 pings whose data both ends check, once with MPA CRC off and
# once with it on. siw never asks for CRC itself (its mpa_crc_required is a
# compile-time false in Linux, not a module parameter) but uses it when the
# peer asks, as RFC 5044 says, so goverbs' --crc turns it on for both ends;
# the goverbs side logs what was negotiated and the script checks it.
#
# The VM comes from vm.sh (shared/vm/vm.sh beside this repository, or
# $GOVERBS_VMSH): Debian's kernel under qemu with siw built from the
# matching source. `vm.sh setup` installs everything on a fresh machine
# (about a minute the first time, then cached in /var/tmp/vm-rdma). Needs
# root (network namespace, tap device, apt). Everything is torn down on
# exit, however the script ends. Exit status: 0 when every run passed.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)

log() { echo "== interop/siw.sh: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

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

# A namespace and tap of our own, so that nothing else's VM is touched.
export VMH_NS=${VMH_NS:-gvsiw$$} VMH_TAP=${VMH_TAP:-gvsiwtap$$} VMH_LINKS=siw
export VMH_DIR=${VMH_DIR:-/var/tmp/vm-rdma}
work=$(mktemp -d /tmp/goverbs-siw.XXXXXX)
cleanup() {
	set +e
	"$vmsh" stop >/dev/null 2>&1
	"$vmsh" net-down >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building goverbs"
CGO_ENABLED=0 go build -buildvcs=false -o "$work/goverbs" ./cmd/goverbs

log "vm.sh setup (packages, kernel, siw.ko)"
"$vmsh" setup >"$work/setup.log" 2>&1 || { tail -30 "$work/setup.log" >&2; die "vm.sh setup failed"; }

log "booting the VM with siw"
"$vmsh" start >"$work/start.log" 2>&1 || { cat "$work/start.log" >&2; die "vm.sh start failed"; }
"$vmsh" wait-ready 300 >"$work/ready.log" 2>&1 || { cat "$work/ready.log" >&2; die "the VM did not come up"; }
"$vmsh" exec "rdma link show" >"$work/links" 2>&1 && grep -q "siw0.*ACTIVE" "$work/links" || { cat "$work/ready.log" "$work/links" >&2; die "no active siw0 link in the VM"; }

host=${VMH_HOST_IP:-10.77.0.1}
guest=${VMH_GUEST_IP:-10.77.0.2}
count=100
size=256
failed=0
port=7174

# The guest's kernel log must show no oops (a Linux bug a peer can
# trigger is still worth knowing about).
check_guest_kernel() {
	if "$vmsh" exec 'dmesg' | grep -E 'BUG|Oops|WARNING: CPU' >"$work/dmesg.bad"; then
		cat "$work/dmesg.bad" >&2
		die "the guest kernel logged a bug"
	fi
}

# checkcrc FILE ON: the goverbs log in FILE shows CRC as wanted.
checkcrc() {
	if ! grep -q "CRC $2" "$1"; then
		cat "$1" >&2
		return 1
	fi
}

for crc in off on; do
	crcflag=()
	[[ $crc == on ]] && crcflag=(--crc)

	# 1. rping server in the guest, goverbs client on the host.
	port=$((port + 1))
	log "CRC $crc: rping -s (siw) <- goverbs ping -c, $count pings of $size bytes"
	"$vmsh" exec "rm -f /tmp/rping.rc; (timeout 120 rping -s -a $guest -p $port -v -C $count -S $size >/tmp/rping.out 2>/tmp/rping.err; echo \$? >/tmp/rping.rc) >/dev/null 2>&1 &"
	"$vmsh" exec "for i in \$(seq 100); do ss -ltn | grep -q ':$port ' && exit 0; sleep 0.1; done; exit 1" ||
		die "rping -s did not start listening in the VM"
	if "$vmsh" hostns "GOVERBS_IWARP_DEBUG=1 timeout 120 $work/goverbs ping -c -a $guest -p $port -C $count -S $size -v ${crcflag[*]}" \
		>"$work/client.out" 2>"$work/client.err" && checkcrc "$work/client.err" "$crc"; then
		n=$(grep -c '^ping data: rdma-ping-' "$work/client.out" || true)
		"$vmsh" exec "for i in \$(seq 300); do [ -f /tmp/rping.rc ] && break; sleep 0.1; done; cat /tmp/rping.rc; cat /tmp/rping.out" >"$work/rping.out"
		m=$(grep -c '^server ping data: rdma-ping-' "$work/rping.out" || true)
		if [[ $(head -1 "$work/rping.out") == 0 && $n == "$count" && $m == "$count" ]]; then
			log "ok: $n pings, data checked by both ends ($(tail -1 "$work/client.out"))"
		else
			log "FAIL: goverbs saw $n pings, rping $m; rping exit $(head -1 "$work/rping.out")"
			tail -2 "$work/rping.out" | cut -c1-100 >&2
			"$vmsh" exec "cat /tmp/rping.err" >&2 || true
			failed=1
		fi
	else
		log "FAIL: goverbs ping -c failed"
		cat "$work/client.err" >&2
		"$vmsh" exec "cat /tmp/rping.out" >&2 || true
		failed=1
	fi
	check_guest_kernel

	# 2. goverbs server on the host, rping client (siw) in the guest.
	port=$((port + 1))
	log "CRC $crc: goverbs ping -s <- rping -c (siw), $count pings of $size bytes"
	"$vmsh" hostns "GOVERBS_IWARP_DEBUG=1 timeout 120 $work/goverbs ping -s -a $host -p $port -C $count -S $size ${crcflag[*]}" \
		>"$work/server.out" 2>"$work/server.err" &
	srv=$!
	"$vmsh" hostns "for i in \$(seq 100); do ss -ltn | grep -q ':$port ' && exit 0; sleep 0.1; done; exit 1" ||
		die "goverbs ping -s did not start listening"
	"$vmsh" exec "timeout 120 rping -c -a $host -p $port -v -V -C $count -S $size >/tmp/rping-c.out 2>/tmp/rping-c.err; echo \$? >/tmp/rping-c.rc" >/dev/null 2>&1 || true
	"$vmsh" exec "cat /tmp/rping-c.out" >"$work/rping-c.out" 2>&1
	rc=$("$vmsh" exec "cat /tmp/rping-c.rc")
	n=$(grep -c '^ping data: rdma-ping-' "$work/rping-c.out" || true)
	if wait "$srv" && [[ $rc == 0 && $n == "$count" ]] && checkcrc "$work/server.err" "$crc"; then
		log "ok: $n pings, data checked by both ends ($(tail -1 "$work/server.out"))"
	else
		log "FAIL: rping -c exit $rc after $n pings"
		tail -2 "$work/rping-c.out" | cut -c1-100 >&2
		"$vmsh" exec "cat /tmp/rping-c.err" >&2 || true
		cat "$work/server.out" "$work/server.err" >&2
		failed=1
	fi
	check_guest_kernel
done

if [[ $failed != 0 ]]; then
	die "some runs failed"
fi
log "PASS: goverbs tcp0 and Linux siw ping each other both ways, CRC off and on"
