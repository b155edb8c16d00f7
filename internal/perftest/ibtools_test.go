package perftest

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// The rxe0_ib_* outputs under testdata were captured from perftest 4.5
// (Debian perftest 4.5+0.17) on the kernel's Soft-RoCE device rxe0, server
// and client in one guest of shared/vm (client's standard output and
// error together).

func TestParseIBTool(t *testing.T) {
	tests := []struct {
		file string
		p    Params
		lat  Latency
		bw   Bandwidth
	}{
		{"rxe0_ib_read_lat_64.txt", Params{Test: ReadLat, Size: 64}, Latency{Min: 49.92, Typical: 56.00, Avg: 67.54, P99: 256.34, Max: 2154.24}, Bandwidth{}},
		{"rxe0_ib_send_lat_8.txt", Params{Test: SendLat, Size: 8}, Latency{Min: 15.14, Typical: 20.14, Avg: 1056.87, P99: 12745.44, Max: 42962.70}, Bandwidth{}},
		{"rxe0_ib_atomic_lat_8.txt", Params{Test: AtomicLat, Size: 8}, Latency{Min: 22.65, Typical: 24.77, Avg: 78.37, P99: 2420.73, Max: 4417.83}, Bandwidth{}},
		{"rxe0_ib_write_bw_65536.txt", Params{Test: WriteBW, Size: 65536}, Latency{}, Bandwidth{PeakMiBps: 24.19, AvgMiBps: 17.16, Mpps: 0.000275}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := parseIBTool(readTestdata(t, tt.file), tt.p)
			if err != nil {
				t.Fatal(err)
			}
			if tt.p.Test.Latency() {
				if r.Lat == nil || r.BW != nil || *r.Lat != tt.lat {
					t.Errorf("got %+v %+v, want latency %+v", r.Lat, r.BW, tt.lat)
				}
				return
			}
			if r.BW == nil || r.Lat != nil || *r.BW != tt.bw {
				t.Errorf("got %+v %+v, want bandwidth %+v", r.Lat, r.BW, tt.bw)
			}
		})
	}
}

func TestParseIBToolRefuses(t *testing.T) {
	tests := []struct {
		name, file string
		p          Params
		want       string
	}{
		// perftest's clock calibration failed: every figure is inf.
		{"uncalibrated latency", "rxe0_ib_write_lat_8_uncalibrated.txt", Params{Test: WriteLat, Size: 8}, "calibrate"},
		// ... or every bandwidth 0.
		{"uncalibrated bandwidth", "rxe0_ib_send_bw_4096_uncalibrated.txt", Params{Test: SendBW, Size: 4096}, "calibrate"},
		// perftest turned inline off on rxe0: goverbs would send inline.
		{"inline off", "rxe0_ib_send_lat_8.txt", Params{Test: SendLat, Size: 8, Inline: 236}, "give -I 0"},
		{"another size", "rxe0_ib_read_lat_64.txt", Params{Test: ReadLat, Size: 8}, "no result line for 8 bytes"},
		{"a latency table for a bandwidth test", "rxe0_ib_read_lat_64.txt", Params{Test: ReadBW, Size: 64}, "no BW peak[MB/sec] column"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseIBTool(readTestdata(t, tt.file), tt.p)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %+v, %v; want an error saying %q", r, err, tt.want)
			}
		})
	}
	// Inline is checked only where the message would go inline.
	if _, err := parseIBTool(readTestdata(t, "rxe0_ib_send_lat_8.txt"), Params{Test: SendLat, Size: 8, Inline: 4}); err != nil {
		t.Errorf("an 8-byte message with -I 4 is not inline on either side: %v", err)
	}
	if _, err := parseIBTool(readTestdata(t, "rxe0_ib_write_lat_8_uncalibrated.txt"), Params{Test: WriteLat, Size: 8}); !errors.Is(err, errUncalibrated) {
		t.Errorf("an uncalibrated run: %v, want errUncalibrated (which is retried)", err)
	}
	for _, out := range []string{
		"",
		"Couldn't connect to 127.0.0.1:18515\n",
		" #bytes #iterations t_min[usec] t_typical[usec]\n 8 1000 abc 1\n",
		" #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] 99% percentile[usec]\n 8 1000 1 2 -3 1 2\n",
		" #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] 99% percentile[usec]\n 8 1000 1 2 nan 1 2\n",
	} {
		if r, err := parseIBTool(out, Params{Test: WriteLat, Size: 8}); err == nil {
			t.Errorf("parseIBTool(%q) = %+v, want an error", out, r)
		}
	}
}

func FuzzParseIBTool(f *testing.F) {
	for _, name := range []string{"rxe0_ib_read_lat_64.txt", "rxe0_ib_write_bw_65536.txt", "rxe0_ib_send_lat_8.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b), uint8(ReadLat), 64)
	}
	f.Fuzz(func(t *testing.T, out string, test uint8, size int) {
		p := Params{Test: Test(test%8 + 1), Size: size, Inline: 16}
		r, err := parseIBTool(out, p)
		if err != nil {
			return
		}
		if (r.Lat == nil) == (r.BW == nil) {
			t.Fatalf("a result with both or neither figure: %+v", r)
		}
		v, _, _ := r.Figure()
		if v < 0 || v != v {
			t.Fatalf("figure %v", v)
		}
	})
}

func TestIBToolArgs(t *testing.T) {
	roce := KernelDevice{Name: "rxe0", LinkLayer: "Ethernet", Netdev: "eth0", IP: netip.MustParseAddr("10.77.0.2"), GIDIndex: 1}
	roceNoIP := roce
	roceNoIP.IP = netip.Addr{}
	iwarp := KernelDevice{Name: "siw0", LinkLayer: "Ethernet", IWARP: true, Netdev: "eth0", IP: netip.MustParseAddr("10.77.0.2"), GIDIndex: -1}
	attr := verbs.DeviceAttr{MaxInlineData: 64}
	tests := []struct {
		d         KernelDevice
		p         Params
		want, not []string
	}{
		// Through rdma_cm, as goverbs connects, where the device has an address.
		{roce, DefaultParams(WriteLat, 8, attr), []string{"-d rxe0", "-R", "-s 8", "-n 1000", "-I 64", "--use_old_post_send"}, []string{"-x ", "-t ", "-e"}},
		// By GID where it has none.
		{roceNoIP, DefaultParams(WriteLat, 8, attr), []string{"-d rxe0", "-x 1"}, []string{"-R"}},
		{roce, DefaultParams(ReadLat, 64, attr), []string{"-s 64"}, []string{"-I "}},
		{roce, DefaultParams(AtomicLat, 8, attr), []string{"-n 1000"}, []string{"-s ", "-I "}},
		{roce, DefaultParams(WriteBW, 65536, attr), []string{"-t 128", "-Q 100", "-n 5000", "-I 64"}, []string{"-r ", "-l "}},
		{roce, func() Params { p := DefaultParams(SendBW, 4096, attr); p.PostList, p.Event = 8, true; return p }(), []string{"-r 512", "-l 8", "-e"}, nil},
		{iwarp, DefaultParams(SendLat, 8, attr), []string{"-d siw0", "-R"}, []string{"-x "}},
	}
	for _, tt := range tests {
		args := " " + strings.Join(ibToolArgs(tt.d, tt.p, 18515), " ") + " "
		for _, w := range tt.want {
			if !strings.Contains(args, " "+w+" ") && !strings.Contains(args, " "+w) {
				t.Errorf("%s %v: %q lacks %q", tt.d.Name, tt.p.Test, args, w)
			}
		}
		for _, n := range tt.not {
			if strings.Contains(args, " "+n) {
				t.Errorf("%s %v: %q has %q", tt.d.Name, tt.p.Test, args, n)
			}
		}
	}
}

// fakeSysfs writes a /sys/class/infiniband of one device and points the
// lookup at it.
func fakeSysfs(t *testing.T, name string, files map[string]string) {
	t.Helper()
	root := t.TempDir()
	for f, v := range files {
		p := filepath.Join(root, name, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := sysInfiniband
	sysInfiniband = root
	t.Cleanup(func() { sysInfiniband = old })
}

func TestLookupKernelDevice(t *testing.T) {
	// A RoCE device on the loopback interface: its IPv4 address is the
	// GID at index 1, as rxe lists it.
	fakeSysfs(t, "rxe9", map[string]string{
		"node_type":                    "1: CA\n",
		"ports/1/link_layer":           "Ethernet\n",
		"ports/1/gids/0":               "fe80:0000:0000:0000:0000:0000:0000:0001\n",
		"ports/1/gids/1":               "0000:0000:0000:0000:0000:ffff:7f00:0001\n",
		"ports/1/gid_attrs/types/0":    "RoCE v2\n",
		"ports/1/gid_attrs/types/1":    "RoCE v2\n",
		"ports/1/gid_attrs/ndevs/0":    "lo\n",
		"ports/1/gid_attrs/ndevs/1":    "lo\n",
		"ports/1/gid_attrs/ndevs/10":   "",
		"ports/1/gids/unrelated_entry": "x",
	})
	d, err := LookupKernelDevice("rxe9")
	if err != nil {
		t.Fatal(err)
	}
	if d.Netdev != "lo" || d.IWARP || d.LinkLayer != "Ethernet" {
		t.Fatalf("got %+v", d)
	}
	if d.IP != netip.MustParseAddr("127.0.0.1") || d.GIDIndex != 1 {
		t.Errorf("IP %v, GID index %d; want 127.0.0.1 at index 1", d.IP, d.GIDIndex)
	}
	if a, err := d.Addr(0); err != nil || a != "rdma://127.0.0.1:0" {
		t.Errorf("Addr = %q, %v", a, err)
	}
	if d.transport() != "roce" {
		t.Errorf("transport %q, want roce", d.transport())
	}
}

func TestLookupKernelDeviceWithout(t *testing.T) {
	// An iWARP device on an interface that does not exist, whose GIDs
	// are garbage: no address, no GID; the peer says why it skips.
	fakeSysfs(t, "siw9", map[string]string{
		"node_type":                 "4: RNIC\n",
		"ports/1/link_layer":        "Ethernet\n",
		"ports/1/gids/0":            "not a gid\n",
		"ports/1/gid_attrs/ndevs/0": "no-such-if0\n",
	})
	d, err := LookupKernelDevice("siw9")
	if err != nil {
		t.Fatal(err)
	}
	if !d.IWARP || d.IP.IsValid() || d.GIDIndex != -1 || d.transport() != "iwarp" {
		t.Fatalf("got %+v", d)
	}
	if _, err := d.Addr(0); err == nil || !strings.Contains(err.Error(), "no-such-if0 has no IP address") {
		t.Errorf("Addr: %v, want an error naming the interface", err)
	}
	if why := ibToolsPeer(d).missing(); lookPath("ib_write_lat", "perftest") == "" && !strings.Contains(why, "no IP address") {
		t.Errorf("missing() = %q, want the missing address named", why)
	}
	for _, bad := range []string{"", "..", "a/b", "nosuch0"} {
		if _, err := LookupKernelDevice(bad); err == nil {
			t.Errorf("LookupKernelDevice(%q) succeeded", bad)
		}
	}
}

func TestParseGID(t *testing.T) {
	g, ok := parseGID("0000:0000:0000:0000:0000:ffff:0a4d:0002")
	if !ok || netip.AddrFrom16(g).Unmap() != netip.MustParseAddr("10.77.0.2") {
		t.Errorf("got %v %v", g, ok)
	}
	for _, bad := range []string{"", "0000:0000", "fe80::1", "000g:0000:0000:0000:0000:ffff:0a4d:0002", "00000:000:0000:0000:0000:ffff:0a4d:0002"} {
		if _, ok := parseGID(bad); ok {
			t.Errorf("parseGID(%q) succeeded", bad)
		}
	}
}

func TestPlanPeersKernel(t *testing.T) {
	d := KernelDevice{Name: "rxe0", LinkLayer: "Ethernet", IP: netip.MustParseAddr("10.77.0.2"), GIDIndex: 1}
	ps := []Params{DefaultParams(WriteLat, 8, verbs.DeviceAttr{}), DefaultParams(WriteBW, 65536, verbs.DeviceAttr{})}
	runs, skipped := PlanPeers(nil, KernelPlan{Device: d, Params: ps})
	if lookPath("ib_write_lat", "perftest") != "" {
		if !slices.ContainsFunc(skipped, func(s Skip) bool {
			return s.Peer == "perftest rxe0" && strings.Contains(s.Reason, "apt-get install perftest")
		}) {
			t.Errorf("perftest is not installed, yet no skip names it: %v", skipped)
		}
		return
	}
	var got []string
	for _, r := range runs {
		got = append(got, r.String())
	}
	want := []string{"perftest rxe0 ib_write_lat 8 B", "perftest rxe0 ib_write_bw 65536 B"}
	if !slices.Equal(got, want) {
		t.Errorf("runs %q, want %q", got, want)
	}
}

// TestCompareSameDevice: perftest on rxe0 is compared with goverbs on
// rxe0, not with a goverbs device of a closer-sounding transport.
func TestCompareSameDevice(t *testing.T) {
	lat := func(v float64) *Latency { return &Latency{Typical: v, Avg: v} }
	ours := []*Result{
		{Stack: "goverbs", Device: "shm0", Transport: "shm", Test: WriteLat, Size: 8, Lat: lat(1)},
		{Stack: "goverbs", Device: "rxe0", Transport: "roce", Test: WriteLat, Size: 8, Lat: lat(40)},
		{Stack: "goverbs", Device: "tcp0", Transport: "iwarp", Test: WriteLat, Size: 8, Lat: lat(30)},
	}
	peer := &Result{Stack: "perftest", Device: "rxe0", Transport: "roce", Test: WriteLat, Size: 8, Lat: lat(20)}
	cs := Compare(ours, []*Result{peer})
	if len(cs) != 1 || cs[0].Ours != "goverbs rxe0" || cs[0].Peer != "perftest rxe0" || !near(cs[0].Speedup, 0.5) {
		t.Fatalf("got %+v", cs)
	}
}
