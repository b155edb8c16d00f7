package kvbench

import (
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/goverbs/goverbs/internal/perftest"
)

// Plot draws results into a PNG file under title: three panels against
// the value size — GET median latency, throughput with one client, and
// the server's CPU seconds per million GETs — with a line per system and
// workload (a color per system, a dash pattern per workload). Sizes and
// latencies are on logarithmic axes.
func Plot(file, title string, results []Result) error {
	var systems, workloads []string
	for _, r := range results {
		if !slices.Contains(systems, r.System) {
			systems = append(systems, r.System)
		}
		if !slices.Contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
	}
	panels := []struct {
		title, unit string
		log         bool
		value       func(Result) float64
	}{
		{"GET median latency", "µs", true, func(r Result) float64 { return float64(r.GetP50.Nanoseconds()) / 1e3 }},
		{"throughput, one client", "kops/s", true, func(r Result) float64 { return r.OpsPerSec() / 1e3 }},
		{"server CPU per million GETs", "s", false, Result.CPUPerMillionGets},
	}
	row := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.X.Label.Text = "value size (bytes)"
		p.Y.Label.Text = pn.unit
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = sizeTicks(results)
		if pn.log {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		}
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		p.Add(plotter.NewGrid())
		ymin, ymax := math.Inf(1), math.Inf(-1)
		for si, sys := range systems {
			for wi, wl := range workloads {
				var xys plotter.XYs
				for _, r := range results {
					if v := pn.value(r); r.System == sys && r.Workload == wl && v >= 0 && (v > 0 || !pn.log) {
						xys = append(xys, plotter.XY{X: float64(r.ValueSize), Y: v})
						ymin, ymax = min(ymin, v), max(ymax, v)
					}
				}
				if len(xys) == 0 {
					continue
				}
				slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
				line, points, err := plotter.NewLinePoints(xys)
				if err != nil {
					return err
				}
				line.Color, line.Width, line.Dashes = plotutil.Color(si), vg.Points(1.5), plotutil.Dashes(wi)
				points.Color, points.Shape, points.Radius = plotutil.Color(si), plotutil.Shape(si), vg.Points(3)
				p.Add(line, points)
				p.Legend.Add(sys+" "+wl, line, points)
			}
		}
		if math.IsInf(ymin, 1) {
			ymin, ymax = 1, 10
		}
		if pn.log {
			p.Y.Min, p.Y.Max = ymin/2, ymax*3
		} else {
			p.Y.Min, p.Y.Max = 0, max(ymax*1.4, 1)
		}
		row[i] = p
	}
	return perftest.WriteFigure(file, title, 16*vg.Inch, 5.5*vg.Inch, [][]*plot.Plot{row})
}

// sizeTicks marks the value sizes measured.
func sizeTicks(results []Result) plot.ConstantTicks {
	var ticks plot.ConstantTicks
	for _, r := range results {
		if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == float64(r.ValueSize) }) {
			ticks = append(ticks, plot.Tick{Value: float64(r.ValueSize), Label: perftest.SizeLabel(r.ValueSize)})
		}
	}
	slices.SortFunc(ticks, func(a, b plot.Tick) int { return int(a.Value - b.Value) })
	return ticks
}
