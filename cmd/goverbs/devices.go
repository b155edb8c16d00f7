package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/goverbs/goverbs/verbs"
)

// noHardware, when set, says why no hardware RDMA device is listed (nil
// when some is); providers_ibverbs.go sets it.
var noHardware func() error

func runDevices(_ context.Context, e *env, args []string) error {
	var (
		device  string
		verbose bool
	)
	fs := newFlagSet("devices", "", `Devices lists the RDMA devices of every provider built into goverbs, as
ibv_devices does. With -v it opens each device, queries its attributes and
closes it again, as ibv_devinfo -v does.`, e)
	fs.String(&device, "device", "d", "", "show only this device")
	fs.Bool(&verbose, "verbose", "v", "open each device and print its attributes")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}

	devs := verbs.Devices()
	if len(devs) == 0 {
		return fmt.Errorf("no RDMA devices found: goverbs was built without providers (registered drivers: %v)", verbs.Drivers())
	}
	if device != "" {
		info, err := findDevice(device)
		if err != nil {
			return err
		}
		devs = []verbs.DeviceInfo{info}
	}

	if !verbose {
		tw := tabwriter.NewWriter(e.stdout, 0, 8, 3, ' ', 0)
		fmt.Fprintf(tw, "DEVICE\tPROVIDER\tTRANSPORT\tNODE GUID\n")
		for _, d := range devs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%016x\n", d.Name, d.Provider, d.Transport, d.GUID)
		}
		return tw.Flush()
	}
	for i, d := range devs {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		if err := printDeviceAttr(e.stdout, d); err != nil {
			return err
		}
	}
	if device == "" {
		if noHardware == nil {
			fmt.Fprintln(e.stdout, "\nno hardware RDMA devices: goverbs was built without the ibverbs provider (-tags noibverbs)")
		} else if err := noHardware(); err != nil {
			fmt.Fprintf(e.stdout, "\nno hardware RDMA devices: %v\n", err)
		}
	}
	return nil
}

// findDevice returns the device called name, or an error that lists the
// devices there are.
func findDevice(name string) (verbs.DeviceInfo, error) {
	var names []string
	for _, d := range verbs.Devices() {
		if d.Name == name {
			return d, nil
		}
		names = append(names, d.Name)
	}
	return verbs.DeviceInfo{}, fmt.Errorf("no RDMA device %q (devices: %s); run \"goverbs devices\" to list them",
		name, strings.Join(names, ", "))
}

// printDeviceAttr opens d, queries its attributes, closes it and prints
// them in the manner of ibv_devinfo -v.
func printDeviceAttr(w io.Writer, d verbs.DeviceInfo) error {
	ctx, err := verbs.Open(d.Name)
	if err != nil {
		return err
	}
	a := ctx.QueryDevice()
	if err := ctx.Close(); err != nil {
		return fmt.Errorf("close device %s: %w", d.Name, err)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "\t%s:\t%v\n", k, v) }
	fmt.Fprintf(tw, "hca_id:\t%s\n", d.Name)
	row("provider", d.Provider)
	row("transport", a.Transport)
	row("fw_ver", orNone(a.FWVersion))
	row("node_guid", guid(d.GUID))
	row("max_mr_size", fmt.Sprintf("%#x", a.MaxMRSize))
	row("max_msg_sz", fmt.Sprintf("%#x", a.MaxMsgSize))
	row("max_qp", a.MaxQP)
	row("max_qp_wr", a.MaxQPWR)
	row("max_sge", a.MaxSGE)
	row("max_inline_data", a.MaxInlineData)
	row("max_cq", a.MaxCQ)
	row("max_cqe", a.MaxCQE)
	row("max_mr", a.MaxMR)
	row("max_pd", a.MaxPD)
	row("max_qp_rd_atom", a.MaxQPRdAtom)
	row("max_qp_init_rd_atom", a.MaxQPInitRdAtom)
	row("max_srq", a.MaxSRQ)
	row("max_srq_wr", a.MaxSRQWR)
	row("max_srq_sge", a.MaxSRQSGE)
	row("max_private_data", a.MaxPrivateData)
	row("atomic_cap", atomicCap(a.AtomicCap))
	row("capabilities", caps(a.Caps))
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// guid formats a GUID as ibv_devinfo does: four groups of four hex digits.
func guid(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func atomicCap(c verbs.AtomicCap) string {
	switch c {
	case verbs.AtomicNone:
		return "ATOMIC_NONE"
	case verbs.AtomicHCA:
		return "ATOMIC_HCA"
	case verbs.AtomicGlob:
		return "ATOMIC_GLOB"
	}
	return fmt.Sprintf("AtomicCap(%d)", c)
}

var capNames = []struct {
	c    verbs.DeviceCaps
	name string
}{
	{verbs.CapRNRRetry, "RNR_RETRY"},
	{verbs.CapSRQ, "SRQ"},
	{verbs.CapImmData, "IMM_DATA"},
	{verbs.CapAtomics, "ATOMICS"},
	{verbs.CapMemoryWindows, "MEMORY_WINDOWS"},
	{verbs.CapCrossProcess, "CROSS_PROCESS"},
	{verbs.CapAckedCompletion, "ACKED_COMPLETION"},
	{verbs.CapModifyConnect, "MODIFY_CONNECT"},
	{verbs.CapRecvNoSGE, "RECV_NO_SGE"},
	{verbs.CapSQD, "SQD"},
	{verbs.CapAtomicResultSGList, "ATOMIC_RESULT_SG_LIST"},
	{verbs.CapQPErrorEvents, "QP_ERROR_EVENTS"},
	{verbs.CapTransportRetry, "TRANSPORT_RETRY"},
}

func caps(c verbs.DeviceCaps) string {
	var names []string
	for _, n := range capNames {
		if c&n.c != 0 {
			names = append(names, n.name)
			c &^= n.c
		}
	}
	if c != 0 {
		names = append(names, fmt.Sprintf("%#x", uint32(c)))
	}
	if len(names) == 0 {
		return "(none)"
	}
	return strings.Join(names, " ")
}
