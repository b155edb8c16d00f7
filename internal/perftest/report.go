package perftest

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Report is everything one bench invocation measured.
type Report struct {
	// Date is when the run started (RFC 3339); Host describes the
	// machine ("linux/amd64, 2 CPUs, load 0.12").
	Date string `json:"date"`
	Host string `json:"host"`
	// Event says completions were waited for rather than polled.
	Event   bool      `json:"event"`
	Results []*Result `json:"results"`
	// Peers are the peers' results, Comparisons pair them with goverbs',
	// Skipped names the peers (or runs of them) that gave no figure.
	Peers       []*Result    `json:"peers,omitempty"`
	Comparisons []Comparison `json:"comparisons,omitempty"`
	Skipped     []Skip       `json:"skipped,omitempty"`
	// Idle is what open, unused connections cost (goverbs sock bench).
	Idle []*Idle `json:"idle,omitempty"`
	// CacheLine is how long a cache line took to go between two
	// processors and back, before and after the runs; nil where it was
	// not measured.
	CacheLine *CacheLine `json:"cache_line_round_trip,omitempty"`
}

// CacheLine is a cache line's round trip between the first two
// processors the process may use (internal/coreprobe), in nanoseconds,
// measured before and after a run (zero: it could not be). Every
// handoff between two cores costs about that much, so shm0's figures,
// and rsock's over shm0, move with it; on a virtual machine it moves
// with where the hypervisor places the vCPUs.
type CacheLine struct {
	BeforeNs float64 `json:"before_ns"`
	AfterNs  float64 `json:"after_ns"`
}

// String describes both measurements in one line.
func (c *CacheLine) String() string {
	ns := func(v float64) string {
		if v <= 0 {
			return "not measured"
		}
		return fmt.Sprintf("%.0f ns", v)
	}
	return fmt.Sprintf("a cache line's round trip between two processors: %s before the runs, %s after", ns(c.BeforeNs), ns(c.AfterNs))
}

// Skip is a peer, or one run of a peer, that gave no figure, and why.
type Skip struct {
	Peer   string `json:"peer"`
	Test   string `json:"test,omitempty"`
	Size   int    `json:"bytes,omitempty"`
	Reason string `json:"reason"`
}

// String says what was skipped and why, in one line.
func (s Skip) String() string {
	what := s.Peer
	if s.Test != "" {
		what += " " + s.Test
		if s.Size > 0 {
			what += fmt.Sprintf(" %d B", s.Size)
		}
	}
	return what + ": " + s.Reason
}

// Comparison is a peer's figure beside goverbs' for the same test and
// size, measured in the same run.
type Comparison struct {
	Test     Test    `json:"test"`
	Size     int     `json:"bytes"`
	Ours     string  `json:"goverbs"`
	Peer     string  `json:"peer"`
	PeerTest string  `json:"peer_test"`
	Unit     string  `json:"unit"`
	OurValue float64 `json:"goverbs_value"`
	Value    float64 `json:"peer_value"`
	// Speedup is how many times faster goverbs is (see Speedup).
	Speedup float64 `json:"speedup"`
	// Rounds is how many rounds Summarize merged (1 for a single run):
	// the figures and Speedup are then their medians, and SpeedupMin and
	// SpeedupMax the range of the speedups.
	Rounds     int     `json:"rounds"`
	SpeedupMin float64 `json:"speedup_min"`
	SpeedupMax float64 `json:"speedup_max"`
}

// class is the kind of link a transport is, for pairing peers with
// goverbs devices: shared memory or TCP.
func class(transport string) string {
	switch transport {
	case "sm", "shm":
		return "shm"
	case "tcp", "iwarp":
		return "tcp"
	}
	return transport
}

// Compare pairs each peer result with the goverbs result of the same test
// and size on the device closest to the peer's: the same device, for a
// peer that runs on goverbs' own (perftest on a kernel device), else the
// same class of link (shared memory, TCP) if there is one, else shared
// memory, else any.
func Compare(ours, peers []*Result) []Comparison {
	var out []Comparison
	for _, pr := range peers {
		var best *Result
		rank := func(r *Result) int {
			if pr.Device != "" && r.Device == pr.Device {
				return 4
			}
			switch class(r.Transport) {
			case class(pr.Transport):
				return 3
			case "shm":
				return 2
			case "tcp":
				return 1
			}
			return 0
		}
		for _, r := range ours {
			if r.Test == pr.Test && r.Size == pr.Size && (best == nil || rank(r) > rank(best)) {
				best = r
			}
		}
		if best == nil {
			continue
		}
		s := Speedup(best, pr)
		c := Comparison{Test: pr.Test, Size: pr.Size, Ours: best.Name(), Peer: pr.Name(), PeerTest: pr.PeerTest,
			Speedup: s, Rounds: 1, SpeedupMin: s, SpeedupMax: s}
		c.Value, c.Unit, _ = pr.Figure()
		if c.Unit == "µs avg" {
			c.OurValue = best.Lat.Avg
		} else {
			c.OurValue, _, _ = best.Figure()
		}
		out = append(out, c)
	}
	return out
}

// Summarize merges the comparisons of rounds of the same runs (the same
// test, size, device and peer), keeping the order in which each first
// appears: the merged one has the medians of the figures and of the
// speedups, and the speedups' range.
func Summarize(cs []Comparison) []Comparison {
	type key struct {
		test       Test
		size       int
		ours, peer string
	}
	var order []key
	groups := map[key][]Comparison{}
	for _, c := range cs {
		k := key{c.Test, c.Size, c.Ours, c.Peer}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], c)
	}
	out := make([]Comparison, 0, len(order))
	for _, k := range order {
		g := groups[k]
		m := g[0]
		pick := func(f func(Comparison) float64) []float64 {
			v := make([]float64, len(g))
			for i, c := range g {
				v[i] = f(c)
			}
			slices.Sort(v)
			return v
		}
		speed := pick(func(c Comparison) float64 { return c.Speedup })
		m.Rounds = len(g)
		m.Speedup, m.SpeedupMin, m.SpeedupMax = median(speed), speed[0], speed[len(speed)-1]
		m.OurValue = median(pick(func(c Comparison) float64 { return c.OurValue }))
		m.Value = median(pick(func(c Comparison) float64 { return c.Value }))
		out = append(out, m)
	}
	return out
}

// median is the middle of sorted values (the mean of the middle two of
// an even count).
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

var testDoc = [...]string{
	SendLat:   "Send/Recv ping-pong, half the round trip",
	WriteLat:  "RDMA Write ping-pong polling the last byte, half the round trip",
	ReadLat:   "RDMA Read, the whole operation",
	AtomicLat: "fetch-and-add, the whole operation",
	SendBW:    "Send/Recv stream",
	WriteBW:   "RDMA Write stream",
	ReadBW:    "RDMA Read stream",
	AtomicBW:  "fetch-and-add stream",
}

// Doc says in a few words what test t measures.
func (t Test) Doc() string {
	if t.Valid() {
		return testDoc[t]
	}
	return ""
}

// num formats a figure for a table: "-" for none, up to two decimals
// for 1 and more, three significant digits below 1.
func num(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// cpuCols renders the CPU columns: the client's and the server's time
// per iteration. A measured zero is "0" (a one-sided test's server may do
// nothing at all); "-" means not measured.
func cpuCols(c *CPU) string {
	switch {
	case c == nil:
		return "-\t-"
	case c.SameProcess:
		return cpuNum(c.ClientUs) + "\t(in client)"
	case c.ServerUnknown:
		return cpuNum(c.ClientUs) + "\t-"
	}
	return cpuNum(c.ClientUs) + "\t" + cpuNum(c.ServerUs)
}

// cpuNum formats a measured CPU time, zero included.
func cpuNum(v float64) string {
	if v == 0 {
		return "0"
	}
	return num(v)
}

// WriteTable writes results as perftest-like tables, one per source and
// test, in the order they come.
func WriteTable(w io.Writer, results []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	var last string
	for _, r := range results {
		head := r.Name() + " " + r.Test.String()
		if head != last {
			if last != "" {
				fmt.Fprintln(tw)
			}
			last = head
			mode := "polling"
			if r.Event {
				mode = "events"
			}
			if r.PostList > 1 {
				mode += fmt.Sprintf("; post lists of %d", r.PostList)
			}
			if r.Stack == "goverbs" {
				fmt.Fprintf(tw, "%s: %s (%s; %s)\n", r.Name(), r.Test, r.Test.Doc(), mode)
			} else {
				fmt.Fprintf(tw, "%s: %s as %s\n", r.Name(), r.Test, r.PeerTest)
			}
			if r.Test.Latency() {
				fmt.Fprintf(tw, " #bytes\t#iterations\tt_min[µs]\tt_typical[µs]\tt_avg[µs]\tt_p99[µs]\tt_max[µs]\tCPU client[µs/iter]\tCPU server[µs/iter]\n")
			} else {
				fmt.Fprintf(tw, " #bytes\t#iterations\twindow\tBW peak[MiB/s]\tBW average[MiB/s]\tMsgRate[Mpps]\tCPU client[µs/msg]\tCPU server[µs/msg]\n")
			}
		}
		if r.Lat != nil {
			l := r.Lat
			fmt.Fprintf(tw, " %d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Size, r.Iters, num(l.Min), num(l.Typical), num(l.Avg), num(l.P99), num(l.Max), cpuCols(r.CPU))
		} else if r.BW != nil {
			b := r.BW
			win := "-"
			if r.Window > 0 {
				win = strconv.Itoa(r.Window)
			}
			fmt.Fprintf(tw, " %d\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Size, r.Iters, win, num(b.PeakMiBps), num(b.AvgMiBps), num(b.Mpps), cpuCols(r.CPU))
		}
	}
	return tw.Flush()
}

// WriteComparison writes the comparisons and the skipped peers.
func WriteComparison(w io.Writer, cs []Comparison, skipped []Skip) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if len(cs) > 0 {
		fmt.Fprintf(tw, "Compared in the same run: speed is how many times faster goverbs is (latency: median, or mean where the peer gives only that; bandwidth: average)\n")
		rounds := 1
		for _, c := range cs {
			rounds = max(rounds, c.Rounds)
		}
		if rounds > 1 {
			fmt.Fprintf(tw, "Over %d rounds: the figures and the speed are medians of the rounds, the range is the speeds' lowest and highest\n", rounds)
			fmt.Fprintf(tw, " test\t#bytes\tgoverbs\t\tpeer\t\t\tspeed\trange\n")
		} else {
			fmt.Fprintf(tw, " test\t#bytes\tgoverbs\t\tpeer\t\t\tspeed\n")
		}
		for _, c := range cs {
			unit := c.Unit
			if unit == "µs avg" {
				unit = "µs (mean)"
			}
			speed := "-"
			if c.Speedup > 0 {
				speed = fmt.Sprintf("%.2f×", c.Speedup)
			}
			line := fmt.Sprintf(" %s\t%d\t%s\t%s %s\t%s\t%s\t%s %s\t%s", c.Test, c.Size, c.Ours, num(c.OurValue), unit, c.Peer, c.PeerTest, num(c.Value), unit, speed)
			if rounds > 1 {
				if c.Speedup > 0 {
					line += fmt.Sprintf("\t%.2f–%.2f× (%d)", c.SpeedupMin, c.SpeedupMax, c.Rounds)
				} else {
					line += "\t-"
				}
			}
			fmt.Fprintln(tw, line)
		}
	}
	if len(skipped) > 0 {
		if len(cs) > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "Skipped:\n")
		for _, s := range skipped {
			fmt.Fprintf(tw, " %s\n", s)
		}
	}
	return tw.Flush()
}

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// csvHeader are the columns of WriteCSV.
var csvHeader = []string{"stack", "device", "transport", "test", "peer_test", "bytes", "iterations", "window", "event",
	"t_min_us", "t_typical_us", "t_avg_us", "t_p99_us", "t_max_us",
	"bw_peak_mib_s", "bw_avg_mib_s", "msg_rate_mpps", "cpu_client_us", "cpu_server_us", "cpu_same_process"}

// WriteCSV writes goverbs' and the peers' results, one row each; a
// figure not measured is empty.
func WriteCSV(w io.Writer, results []*Result) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHeader)
	f := func(v float64) string {
		if v == 0 {
			return ""
		}
		return strconv.FormatFloat(v, 'g', 6, 64)
	}
	for _, r := range results {
		row := []string{r.Stack, r.Device, r.Transport, r.Test.String(), r.PeerTest, strconv.Itoa(r.Size),
			strconv.Itoa(r.Iters), strconv.Itoa(r.Window), strconv.FormatBool(r.Event)}
		var l Latency
		var b Bandwidth
		if r.Lat != nil {
			l = *r.Lat
		}
		if r.BW != nil {
			b = *r.BW
		}
		row = append(row, f(l.Min), f(l.Typical), f(l.Avg), f(l.P99), f(l.Max), f(b.PeakMiBps), f(b.AvgMiBps), f(b.Mpps))
		if c := r.CPU; c != nil {
			row = append(row, f(c.ClientUs), f(c.ServerUs), strconv.FormatBool(c.SameProcess))
		} else {
			row = append(row, "", "", "")
		}
		cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

// joinTests names tests for messages.
func joinTests(ts []Test) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return strings.Join(s, ", ")
}
