package perftest

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// series is the line of source name in test t's panel, by size, and its
// legend: the figure of each size, or the median of the rounds of a run
// repeated (--repeat).
func series(t Test, all []*Result, name string) (plotter.XYs, string) {
	label := name
	bySize := map[int][]float64{}
	for _, r := range all {
		if r.Test != t || r.Name() != name {
			continue
		}
		v, unit, _ := r.Figure()
		if v <= 0 {
			continue
		}
		if unit == "µs avg" {
			label = name + " (mean)"
		}
		bySize[r.Size] = append(bySize[r.Size], v)
	}
	var xys plotter.XYs
	for size, vs := range bySize {
		slices.Sort(vs)
		xys = append(xys, plotter.XY{X: float64(size), Y: median(vs)})
	}
	slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
	return xys, label
}

// Plot draws the report into a PNG file: one panel per test, the latency
// tests on the top row (median latency, or the mean for a peer that
// gives only that, against message size) and the bandwidth tests below
// (average bandwidth against message size), with a line for goverbs on
// each device and for each peer. Both axes are logarithmic. A run
// repeated (--repeat) is drawn as the median of its rounds.
func Plot(file string, rep *Report) error {
	all := append(append([]*Result(nil), rep.Results...), rep.Peers...)
	// One color and glyph per source, the same in every panel.
	var names []string
	for _, r := range all {
		if !slices.Contains(names, r.Name()) {
			names = append(names, r.Name())
		}
	}
	style := func(name string) (color.Color, int) {
		i := slices.Index(names, name)
		return plotutil.Color(i), i
	}
	rows := [][]Test{{SendLat, WriteLat, ReadLat, AtomicLat}, {SendBW, WriteBW, ReadBW, AtomicBW}}
	plots := make([][]*plot.Plot, len(rows))
	for i, row := range rows {
		plots[i] = make([]*plot.Plot, len(row))
		for j, t := range row {
			p, err := testPlot(t, all, names, style)
			if err != nil {
				return err
			}
			plots[i][j] = p
		}
	}
	mode := "polling"
	if rep.Event {
		mode = "completion events"
	}
	return WriteFigure(file, fmt.Sprintf("goverbs bench, %s (%s; %s): lower latency and higher bandwidth are better", rep.Date, rep.Host, mode),
		18*vg.Inch, 9*vg.Inch, plots)
}

// WriteFigure draws rows of panels under a title line into a PNG file of
// w by h, the panels aligned in a grid, on a white background.
func WriteFigure(file, title string, w, h vg.Length, rows [][]*plot.Plot) error {
	const dpi = 96
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	ts := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler, XAlign: draw.XCenter, YAlign: draw.YTop}
	ts.Font.Size = vg.Points(14)
	dc.FillText(ts, vg.Point{X: w / 2, Y: h - vg.Points(6)}, title)
	body := draw.Crop(dc, 0, 0, 0, -vg.Points(28))
	tiles := draw.Tiles{Rows: len(rows), Cols: len(rows[0]), PadX: vg.Points(12), PadY: vg.Points(12),
		PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align(rows, tiles, body)
	for i := range rows {
		for j := range rows[i] {
			rows[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// testPlot is the panel of test t.
func testPlot(t Test, all []*Result, names []string, style func(string) (color.Color, int)) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = t.String() + ": " + t.Doc()
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = "message size (bytes)"
	if t.Latency() {
		p.Y.Label.Text = "latency (µs)"
	} else {
		p.Y.Label.Text = "bandwidth (MiB/s)"
	}
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, name := range names {
		xys, label := series(t, all, name)
		if len(xys) == 0 {
			continue
		}
		for _, xy := range xys {
			xmin, xmax = min(xmin, xy.X), max(xmax, xy.X)
			ymin, ymax = min(ymin, xy.Y), max(ymax, xy.Y)
		}
		c, i := style(name)
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		line.Color, line.Width = c, vg.Points(1.5)
		if i >= len(plotutil.DefaultColors) {
			line.Dashes = plotutil.Dashes(1)
		}
		points.Color, points.Shape, points.Radius = c, plotutil.Shape(i), vg.Points(3)
		p.Add(line, points)
		p.Legend.Add(label, line, points)
	}
	if math.IsInf(xmin, 1) {
		// Nothing measured: an empty panel with a sane range.
		xmin, xmax, ymin, ymax = 2, 8<<20, 0.1, 10
	}
	p.X.Min, p.X.Max = xmin/2, xmax*2
	p.Y.Min, p.Y.Max = ymin/2, ymax*2
	return p, nil
}

// sizeTicks marks message sizes on a logarithmic axis at powers of four,
// labelled 2, 8, 32, ..., 1K, 4K, ..., 1M, 4M.
type sizeTicks struct{}

func (sizeTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for v := 1.0; v <= max; v *= 2 {
		if v < min {
			continue
		}
		label := ""
		if e := int(math.Log2(v)); e%2 == 1 || v == 1 {
			label = SizeLabel(int(v))
		}
		ts = append(ts, plot.Tick{Value: v, Label: label})
	}
	return ts
}

// SizeLabel writes a size briefly: 512, 4K, 1M (a multiple of 1 KiB or
// 1 MiB with its suffix).
func SizeLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}
