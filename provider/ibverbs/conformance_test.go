package ibverbs_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/provider/ibverbs"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// The conformance suite runs on a real device when the environment names
// one (interop/ibverbs.sh does, in a VM with rxe0 and siw0):
//
//	GOVERBS_IBVERBS_DEVICE=rxe0 GOVERBS_IBVERBS_HOST=10.77.0.2
//
// HOST is an address of the device's network interface, which rdma_cm
// routes to it.
const (
	envDevice = "GOVERBS_IBVERBS_DEVICE"
	envHost   = "GOVERBS_IBVERBS_HOST"
)

func TestMain(m *testing.M) {
	verbstest.PeerMain()
	goleak.VerifyTestMain(m)
}

var pairs atomic.Int64

func harnessEnv(t *testing.T) (device string, addr func(testing.TB) string) {
	device, host := os.Getenv(envDevice), os.Getenv(envHost)
	if device == "" || host == "" {
		t.Skipf("no RDMA device named: set %s and %s (interop/ibverbs.sh runs this in a VM)", envDevice, envHost)
	}
	base := 20000 + os.Getpid()%200*100
	return device, func(testing.TB) string {
		return fmt.Sprintf("rdma://%s:%d", host, base+int(pairs.Add(1)))
	}
}

// TestConformance runs the whole suite with the two endpoints in two
// processes: B is this test binary, re-executed.
func TestConformance(t *testing.T) {
	device, addr := harnessEnv(t)
	verbstest.Run(t, verbstest.Harness{Device: device, Addr: addr, Remote: verbstest.SpawnPeer(device)})
}

// TestConformanceInProcess runs it with both endpoints in this process
// (the cases that need that run only here).
func TestConformanceInProcess(t *testing.T) {
	device, addr := harnessEnv(t)
	verbstest.Run(t, verbstest.Harness{Device: device, Addr: addr})
}

// TestDevicesOrWhyNot checks that the provider either lists devices or
// says why it lists none, and that each device it lists opens with the
// attributes ibv_query_device reports.
func TestDevicesOrWhyNot(t *testing.T) {
	var ours []verbs.DeviceInfo
	for _, d := range verbs.Devices() {
		if d.Provider == "ibverbs" {
			ours = append(ours, d)
		}
	}
	err := ibverbs.Available()
	if err != nil {
		if len(ours) > 0 {
			t.Fatalf("Available says %v, yet devices are listed: %v", err, ours)
		}
		t.Logf("no device: %v", err)
		return
	}
	if len(ours) == 0 {
		t.Fatal("Available says devices exist, yet none is listed")
	}
	for _, d := range ours {
		ctx, err := verbs.Open(d.Name)
		if err != nil {
			t.Fatalf("open %s: %v", d.Name, err)
		}
		a := ctx.QueryDevice()
		if a.MaxQP <= 0 || a.MaxCQE <= 0 || a.MaxSGE <= 0 || a.Name != d.Name {
			t.Errorf("%s: implausible attributes %+v", d.Name, a)
		}
		if err := ctx.Close(); err != nil {
			t.Errorf("close %s: %v", d.Name, err)
		}
	}
}
