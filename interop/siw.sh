#!/usr/bin/env bash
# interop/siw.sh: goverbs' iWARP provider (device tcp0) against Linux siw,
# the kernel's SoftiWARP, with librdmacm's tools at the other end. Each
# case runs both ways (the Linux tool in a VM running siw as server and
# goverbs on the host as client, then the other way round), once with MPA
# CRC off and once with it on:
#
#   rping         rping against `goverbs ping`: 200 pings of 1,001, 4,000
#                 and 65,535 bytes, the data checked by both ends;
#   ucmatose      ucmatose against examples/cmatose: 10 connections, 10
#                 messages of 100 bytes each way on each (the server sends
#                 first, the client only after it has received everything);
#   rdma_server   rdma_server and rdma_client against examples/cmatose
#                 -answer (one 16-byte message each way, sent inline by the
#                 Linux tools).
#
# After each case the guest's kernel log must hold no BUG, oops or
# warning (WARNING, or any message of level warn or above but two an
# emulated machine logs all the time: a late timer interrupt, and the
# virtual NIC's unknown speed, which the RDMA core asks for at every
# connection), and no guest socket of the case may
# be left with unread bytes. siw never asks for CRC itself
# (mpa_crc_required is a compile-time false in Linux, not a module
# parameter) but uses it when the peer asks, as RFC 5044 says, so
# goverbs' --crc turns it on for both ends; the goverbs side logs what was
# negotiated and the script checks it.
#
# The VM comes from vm.sh (shared/vm/vm.sh beside this repository, or
# $GOVERBS_VMSH): Debian's kernel under qemu with siw built from the
# matching source. `vm.sh setup` installs everything on a fresh machine
# (about a minute the first time, then cached in /var/tmp/vm-rdma). Needs
# root (network namespace, tap device, apt). Everything is torn down on
# exit, however the script ends. Exit status: 0 when every case passed.
# The whole run takes 3 to 8 minutes on a shared 2-core machine.
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
export VMH_DIR=${VMH_DIR:-/var/tmp/vm-rdma} VMH_TIMEOUT=${VMH_TIMEOUT:-1800}
work=$(mktemp -d /tmp/goverbs-siw.XXXXXX)
cleanup() {
	set +e
	"$vmsh" stop >/dev/null 2>&1
	"$vmsh" net-down >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$(date +%s)
log "building goverbs and examples/cmatose"
CGO_ENABLED=0 go build -buildvcs=false -o "$work/goverbs" ./cmd/goverbs
CGO_ENABLED=0 go build -buildvcs=false -o "$work/cmatose" ./examples/cmatose

log "vm.sh setup (packages, kernel, siw.ko)"
"$vmsh" setup >"$work/setup.log" 2>&1 || { tail -30 "$work/setup.log" >&2; die "vm.sh setup failed"; }

log "booting the VM with siw"
"$vmsh" start >"$work/start.log" 2>&1 || { cat "$work/start.log" >&2; die "vm.sh start failed"; }
"$vmsh" wait-ready 300 >"$work/ready.log" 2>&1 || { cat "$work/ready.log" >&2; die "the VM did not come up"; }
"$vmsh" exec "rdma link show" >"$work/links" 2>&1 && grep -q "siw0.*ACTIVE" "$work/links" || { cat "$work/ready.log" "$work/links" >&2; die "no active siw0 link in the VM"; }
for tool in rping ucmatose rdma_server rdma_client; do
	"$vmsh" exec "command -v $tool" >/dev/null || die "$tool is missing: apt-get install rdmacm-utils"
done

host=${VMH_HOST_IP:-10.77.0.1}
guest=${VMH_GUEST_IP:-10.77.0.2}
pings=200
conns=10
msgs=10
port=7200
failed=0
results=()

# The boot's log may hold warnings of its own (an unsigned siw.ko, for
# one), but no bug; the cases start from an empty log.
"$vmsh" exec 'dmesg -c' >"$work/dmesg.boot"
if grep -E 'BUG|Oops|WARNING' "$work/dmesg.boot" >&2; then
	die "the guest kernel logged a bug while booting"
fi

# check_guest NAME PORT: the guest's kernel logged nothing of note since
# the last check (a Linux bug a peer can trigger is still worth knowing
# about), and no guest socket on PORT keeps unread bytes (a connection
# left half set up); it clears the log.
check_guest() {
	"$vmsh" exec 'dmesg -c -x' >"$work/dmesg" || die "cannot read the guest's kernel log"
	if grep -E 'BUG|Oops|WARNING|:(emerg|alert|crit|err|warn) *:' "$work/dmesg" | grep -v -E 'hrtimer: interrupt took|speed is unknown, defaulting' >"$work/dmesg.bad"; then
		cat "$work/dmesg.bad" >&2
		fail "$1: the guest kernel logged the lines above"
	fi
	"$vmsh" exec "ss -tanH '( sport = :$2 or dport = :$2 )'" >"$work/ss" || true
	if awk '$2 != 0' "$work/ss" | grep . >&2; then
		fail "$1: guest sockets keep unread bytes"
	fi
}

fail() {
	log "FAIL: $*"
	failed=1
	[[ $casefail == 1 ]] || casewhy=$* # the first reason, for the summary
	casefail=1
}

# checkcrc FILE ON: the goverbs log in FILE shows CRC as wanted on every
# connection it set up.
checkcrc() {
	local want=$2 other=on
	[[ $want == on ]] && other=off
	if ! grep -q "CRC $want" "$1" || grep -q "CRC $other" "$1"; then
		cat "$1" >&2
		return 1
	fi
}

# guest_listen PORT: wait until something in the guest listens on PORT.
guest_listen() {
	"$vmsh" exec "for i in \$(seq 100); do ss -ltnH | grep -q ':$1 ' && exit 0; sleep 0.1; done; exit 1"
}

# host_listen PORT: the same on the host's side of the link.
host_listen() {
	"$vmsh" hostns "for i in \$(seq 100); do ss -ltnH | grep -q ':$1 ' && exit 0; sleep 0.1; done; exit 1"
}

# record NAME: the outcome of the case just run.
record() {
	local took=$(($(date +%s) - casestart))
	if [[ $casefail == 0 ]]; then
		log "ok: $1 (${took}s)"
		results+=("ok    $1 (${took}s)")
	else
		results+=("FAIL  $1 (${took}s): ${casewhy#"$1: "}")
	fi
}

# rping_siw_server SIZE CRC: rping -s in the guest, goverbs ping -c here.
rping_siw_server() {
	local size=$1 crc=$2 name="rping -s (siw) <- goverbs ping -c, $pings pings of $1 bytes, CRC $2"
	casefail=0 casestart=$(date +%s) port=$((port + 1))
	log "$name"
	"$vmsh" exec "rm -f /tmp/rping.rc; (timeout 300 rping -s -a $guest -p $port -v -C $pings -S $size >/tmp/rping.out 2>/tmp/rping.err; echo \$? >/tmp/rping.rc) >/dev/null 2>&1 &"
	guest_listen $port || die "rping -s did not start listening in the VM"
	if "$vmsh" hostns "GOVERBS_IWARP_DEBUG=1 timeout 300 $work/goverbs ping -c -a $guest -p $port -C $pings -S $size -v ${crcflag[*]}" \
		>"$work/client.out" 2>"$work/client.err" && checkcrc "$work/client.err" "$crc"; then
		local n m rc
		n=$(grep -c '^ping data: rdma-ping-' "$work/client.out" || true)
		"$vmsh" exec "for i in \$(seq 300); do [ -f /tmp/rping.rc ] && break; sleep 0.1; done; cat /tmp/rping.rc; grep -c '^server ping data: rdma-ping-' /tmp/rping.out" >"$work/rping.res" || true
		rc=$(sed -n 1p "$work/rping.res") m=$(sed -n 2p "$work/rping.res")
		if [[ $rc != 0 || $n != "$pings" || $m != "$pings" ]]; then
			fail "$name: goverbs saw $n pings, rping $m; rping exit $rc"
			"$vmsh" exec "tail -3 /tmp/rping.err" >&2 || true
		fi
	else
		fail "$name: goverbs ping -c failed"
		tail -n 5 "$work/client.err" >&2 || true
		"$vmsh" exec "tail -3 /tmp/rping.err" >&2 || true
	fi
	check_guest "$name" $port
	record "$name"
}

# rping_siw_client SIZE CRC: goverbs ping -s here, rping -c in the guest.
rping_siw_client() {
	local size=$1 crc=$2 name="goverbs ping -s <- rping -c (siw), $pings pings of $1 bytes, CRC $2"
	casefail=0 casestart=$(date +%s) port=$((port + 1))
	log "$name"
	"$vmsh" hostns "GOVERBS_IWARP_DEBUG=1 timeout 300 $work/goverbs ping -s -a $host -p $port -C $pings -S $size ${crcflag[*]}" \
		>"$work/server.out" 2>"$work/server.err" &
	local srv=$! rc n
	host_listen $port || die "goverbs ping -s did not start listening"
	"$vmsh" exec "timeout 300 rping -c -a $host -p $port -v -V -C $pings -S $size >/tmp/rping-c.out 2>/tmp/rping-c.err; echo \$?; grep -c '^ping data: rdma-ping-' /tmp/rping-c.out" >"$work/rping.res" 2>&1 || true
	rc=$(sed -n 1p "$work/rping.res") n=$(sed -n 2p "$work/rping.res")
	if wait "$srv" && [[ $rc == 0 && $n == "$pings" ]] && checkcrc "$work/server.err" "$crc"; then
		:
	else
		fail "$name: rping -c exit $rc after $n pings"
		"$vmsh" exec "tail -3 /tmp/rping-c.err" >&2 || true
		tail -n 5 "$work/server.out" "$work/server.err" >&2 || true
	fi
	check_guest "$name" $port
	record "$name"
}

# siw_server NAME GUESTCMD HOSTCMD CRC: the Linux tool GUESTCMD serves in
# the guest (PORT in it is replaced), the goverbs HOSTCMD connects.
siw_server() {
	local name="$1, CRC $4" rc
	casefail=0 casestart=$(date +%s) port=$((port + 1))
	log "$name"
	"$vmsh" exec "rm -f /tmp/srv.rc; (timeout 120 ${2//PORT/$port} >/tmp/srv.out 2>&1; echo \$? >/tmp/srv.rc) >/dev/null 2>&1 &"
	guest_listen $port || die "$name: the server did not start listening in the VM"
	if ! "$vmsh" hostns "GOVERBS_IWARP_DEBUG=1 timeout 120 ${3//PORT/$port} ${crcflag[*]}" >"$work/host.out" 2>"$work/host.err"; then
		fail "$name: the goverbs client failed"
		tail -n 5 "$work/host.out" "$work/host.err" >&2 || true
	elif ! checkcrc "$work/host.err" "$4"; then
		fail "$name: CRC is not $4"
	fi
	"$vmsh" exec "for i in \$(seq 300); do [ -f /tmp/srv.rc ] && break; sleep 0.1; done; cat /tmp/srv.rc" >"$work/srv.rc" 2>&1 || true
	rc=$(cat "$work/srv.rc")
	if [[ $rc != 0 ]]; then
		fail "$name: the Linux server exited with $rc"
		"$vmsh" exec "tail -5 /tmp/srv.out" >&2 || true
	fi
	check_guest "$name" $port
	record "$name"
}

# siw_client NAME HOSTCMD GUESTCMD CRC: the goverbs HOSTCMD serves, the
# Linux tool GUESTCMD connects from the guest.
siw_client() {
	local name="$1, CRC $4" rc
	casefail=0 casestart=$(date +%s) port=$((port + 1))
	log "$name"
	"$vmsh" hostns "GOVERBS_IWARP_DEBUG=1 timeout 120 ${2//PORT/$port} ${crcflag[*]}" >"$work/host.out" 2>"$work/host.err" &
	local srv=$!
	host_listen $port || die "$name: the goverbs server did not start listening"
	"$vmsh" exec "timeout 120 ${3//PORT/$port} >/tmp/cli.out 2>&1; echo \$?" >"$work/cli.rc" 2>&1 || true
	rc=$(tail -1 "$work/cli.rc")
	if ! wait "$srv"; then
		fail "$name: the goverbs server failed"
		tail -n 5 "$work/host.out" "$work/host.err" >&2 || true
	elif ! checkcrc "$work/host.err" "$4"; then
		fail "$name: CRC is not $4"
	fi
	if [[ $rc != 0 ]]; then
		fail "$name: the Linux client exited with $rc"
		"$vmsh" exec "tail -5 /tmp/cli.out" >&2 || true
	fi
	check_guest "$name" $port
	record "$name"
}

for crc in off on; do
	crcflag=()
	[[ $crc == on ]] && crcflag=(--crc)
	for size in 1001 4000 65535; do
		rping_siw_server $size $crc
		rping_siw_client $size $crc
	done
	siw_server "ucmatose -b (siw) <- cmatose -s, $conns connections x $msgs messages" \
		"ucmatose -b $guest -p PORT -c $conns -C $msgs" "$work/cmatose -s $guest -p PORT -c $conns -C $msgs" $crc
	siw_client "cmatose -b (speaks first) <- ucmatose -s (siw), $conns connections x $msgs messages" \
		"$work/cmatose -b $host -p PORT -c $conns -C $msgs" "ucmatose -s $host -p PORT -c $conns -C $msgs" $crc
	siw_server "rdma_server (siw) <- cmatose -answer" \
		"rdma_server -p PORT" "$work/cmatose -answer -s $guest -p PORT -c 1 -C 1 -S 16" $crc
	siw_client "cmatose -answer -b <- rdma_client (siw)" \
		"$work/cmatose -answer -b $host -p PORT -c 1 -C 1 -S 16" "rdma_client -s $host -p PORT" $crc
done

log "results (CRC off, then on), $(($(date +%s) - started))s in all:"
printf '   %s\n' "${results[@]}" >&2
if [[ $failed != 0 ]]; then
	die "some cases failed"
fi
log "PASS: goverbs tcp0 and Linux siw interoperate in every case, both ways, CRC off and on"
