package main

import (
	"github.com/goverbs/goverbs/internal/perftest"
	"github.com/goverbs/goverbs/verbs"
)

// kernelProvider is the provider of the kernel's RDMA devices (rxe0,
// siw0, mlx5_0, ...), reached through rdma-core.
const kernelProvider = "ibverbs"

// benchAddr is the cm address a self-contained run's server for device d
// listens on: for a kernel RDMA device, the rdma_cm address of its own
// network interface, so that the client's connection is routed back to
// the same device; for goverbs' own devices, their default address.
func benchAddr(d verbs.DeviceInfo) (string, error) {
	if d.Provider == kernelProvider {
		k, err := perftest.LookupKernelDevice(d.Name)
		if err != nil {
			return "", err
		}
		return k.Addr(0)
	}
	return defaultAddr(d.Transport, "goverbs-bench")
}

// kernelPlans returns, for each of devs that is a kernel RDMA device, the
// runs perftest's own programs repeat on it (plans[i] are devs[i]'s), and
// the devices perftest cannot be pointed at, with the reason.
func kernelPlans(devs []verbs.DeviceInfo, plans [][]perftest.Params) ([]perftest.KernelPlan, []perftest.Skip) {
	var (
		out     []perftest.KernelPlan
		skipped []perftest.Skip
	)
	for i, d := range devs {
		if d.Provider != kernelProvider {
			continue
		}
		k, err := perftest.LookupKernelDevice(d.Name)
		if err != nil {
			skipped = append(skipped, perftest.Skip{Peer: "perftest " + d.Name, Reason: err.Error()})
			continue
		}
		out = append(out, perftest.KernelPlan{Device: k, Params: plans[i]})
	}
	return out, skipped
}
