package perftest

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// KernelDevice is a kernel RDMA device (goverbs' ibverbs provider: rxe0,
// siw0, mlx5_0, ...) as perftest's ib_* tools and rdma_cm address it,
// read from /sys/class/infiniband.
type KernelDevice struct {
	// Name is the device's name ("rxe0").
	Name string
	// LinkLayer is port 1's link layer: "InfiniBand" or "Ethernet" (RoCE
	// and iWARP).
	LinkLayer string
	// IWARP: the device speaks iWARP, which perftest reaches only through
	// rdma_cm (-R).
	IWARP bool
	// Netdev is the network interface port 1 is bound to ("eth0"), or "".
	Netdev string
	// IP is the first IPv4 address of Netdev (or its first global IPv6
	// address), through which rdma_cm reaches the device; invalid if it
	// has none.
	IP netip.Addr
	// GIDIndex is the index of the GID of port 1 that carries IP (a RoCE
	// v2 GID, perftest's -x), or -1.
	GIDIndex int
}

// sysInfiniband is where Linux lists RDMA devices.
var sysInfiniband = "/sys/class/infiniband"

// LookupKernelDevice reads what perftest and rdma_cm need of the kernel
// RDMA device name from sysfs.
func LookupKernelDevice(name string) (KernelDevice, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return KernelDevice{}, fmt.Errorf("%q is not a device name", name)
	}
	dir := filepath.Join(sysInfiniband, name)
	port := filepath.Join(dir, "ports", "1")
	ll, err := os.ReadFile(filepath.Join(port, "link_layer"))
	if err != nil {
		return KernelDevice{}, fmt.Errorf("kernel RDMA device %s: %w (is it a device of this machine? see \"rdma link show\")", name, err)
	}
	d := KernelDevice{Name: name, LinkLayer: strings.TrimSpace(string(ll)), GIDIndex: -1}
	if nt, err := os.ReadFile(filepath.Join(dir, "node_type")); err == nil {
		// "4: RNIC" for an iWARP device, "1: CA" for InfiniBand and RoCE.
		d.IWARP = strings.Contains(string(nt), "RNIC")
	}
	if d.LinkLayer != "Ethernet" {
		return d, nil
	}
	d.Netdev = netdevOf(port)
	if d.Netdev == "" {
		return d, nil
	}
	d.IP = interfaceAddr(d.Netdev)
	if d.IP.IsValid() && !d.IWARP {
		d.GIDIndex = gidIndexOf(port, d.IP)
	}
	return d, nil
}

// transport names the device's transport as goverbs' ibverbs provider
// does: "iwarp", "roce" or "ib".
func (d KernelDevice) transport() string {
	switch {
	case d.IWARP:
		return "iwarp"
	case d.LinkLayer == "Ethernet":
		return "roce"
	}
	return "ib"
}

// viaCM reports whether perftest reaches the device through rdma_cm:
// an Ethernet device (RoCE, iWARP) with an IP address.
func (d KernelDevice) viaCM() bool { return d.IP.IsValid() && d.LinkLayer == "Ethernet" }

// Addr is the rdma_cm address of the device with port: rdma://IP:port.
func (d KernelDevice) Addr(port int) (string, error) {
	if !d.IP.IsValid() {
		why := "it is bound to no network interface"
		if d.Netdev != "" {
			why = "its network interface " + d.Netdev + " has no IP address"
		}
		if d.LinkLayer != "Ethernet" {
			why = "it is an InfiniBand device; rdma_cm reaches it through an IPoIB interface"
		}
		return "", fmt.Errorf("no rdma_cm address for %s: %s; give the server's rdma://host:port", d.Name, why)
	}
	return "rdma://" + net.JoinHostPort(d.IP.String(), strconv.Itoa(port)), nil
}

// netdevOf returns the interface the port's GIDs are bound to, or "".
func netdevOf(port string) string {
	for i := range 16 {
		b, err := os.ReadFile(filepath.Join(port, "gid_attrs", "ndevs", strconv.Itoa(i)))
		if err == nil {
			if s := strings.TrimSpace(string(b)); s != "" {
				return s
			}
		}
	}
	return ""
}

// interfaceAddr returns the first IPv4 address of the interface, else
// its first global IPv6 address.
func interfaceAddr(name string) netip.Addr {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}
	}
	var v6 netip.Addr
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr()
		switch {
		case ip.Is4():
			return ip
		case !v6.IsValid() && ip.IsGlobalUnicast():
			v6 = ip
		}
	}
	return v6
}

// gidIndexOf returns the index of the RoCE v2 GID of port that is ip (an
// IPv4 address as ::ffff:a.b.c.d), or -1.
func gidIndexOf(port string, ip netip.Addr) int {
	want := ip.As16() // an IPv4 address in its IPv4-mapped form
	for i := range 256 {
		b, err := os.ReadFile(filepath.Join(port, "gids", strconv.Itoa(i)))
		if err != nil {
			break
		}
		g, ok := parseGID(strings.TrimSpace(string(b)))
		if !ok || g != want {
			continue
		}
		t, err := os.ReadFile(filepath.Join(port, "gid_attrs", "types", strconv.Itoa(i)))
		if err == nil && strings.TrimSpace(string(t)) == "RoCE v2" {
			return i
		}
	}
	return -1
}

// parseGID reads a GID as sysfs prints it: eight groups of four hex
// digits separated by colons.
func parseGID(s string) ([16]byte, bool) {
	var g [16]byte
	parts := strings.Split(s, ":")
	if len(parts) != 8 {
		return g, false
	}
	for i, p := range parts {
		if len(p) != 4 {
			return g, false
		}
		v, err := strconv.ParseUint(p, 16, 16)
		if err != nil {
			return g, false
		}
		g[2*i], g[2*i+1] = byte(v>>8), byte(v)
	}
	return g, true
}
