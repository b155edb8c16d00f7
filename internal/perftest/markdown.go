package perftest

import (
	_ "embed"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// method is how goverbs bench measures, the part of the performance
// document that does not change from run to run.
//
//go:embed method.md
var method string

// MarkdownDoc is what WriteMarkdown says about the run besides its
// results.
type MarkdownDoc struct {
	// Command is the command line that made the report, which run again
	// makes the document again.
	Command string
	// Machine describes the machine beyond Report.Host (its processor).
	Machine string
	// Plot is the path of the run's plot relative to the document, or "".
	Plot string
}

// WriteMarkdown writes rep as a Markdown document: where it comes from
// and how to make it again, how bench measures, the comparison with the
// peers, every table of goverbs' and the peers' results, and what was
// skipped.
func WriteMarkdown(w io.Writer, rep *Report, doc MarkdownDoc) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "# goverbs performance\n\n")
	fmt.Fprintf(b, "This document is generated: `%s` wrote it, at %s, on %s", doc.Command, rep.Date, rep.Host)
	if doc.Machine != "" {
		fmt.Fprintf(b, " (%s)", doc.Machine)
	}
	mode := "polling for completions"
	if rep.Event {
		mode = "waiting for completion events"
	}
	fmt.Fprintf(b, ", %s. Run the command again, from the repository's root, to make it again on your machine; "+
		"do not edit it by hand. Figures drift with the machine's load from run to run: compare figures of one run.", mode)
	if rep.CacheLine != nil {
		fmt.Fprintf(b, " In this run, %s.", rep.CacheLine)
	}
	b.WriteString("\n\n")
	b.WriteString(strings.TrimSpace(method))
	b.WriteString("\n")
	if len(rep.Comparisons) > 0 || len(rep.Skipped) > 0 {
		b.WriteString("\n## Compared with UCX, libfabric and Go TCP\n\n")
		markdownComparison(b, rep.Comparisons)
		if doc.Plot != "" {
			fmt.Fprintf(b, "\n![Latency and bandwidth against message size, one panel per test, goverbs beside the peers](%s)\n", doc.Plot)
		}
		if len(rep.Skipped) > 0 {
			b.WriteString("\nSkipped:\n\n")
			for _, s := range rep.Skipped {
				fmt.Fprintf(b, "- %s\n", mdEscape(s.String()))
			}
		}
	} else if doc.Plot != "" {
		fmt.Fprintf(b, "\n![Latency and bandwidth against message size, one panel per test](%s)\n", doc.Plot)
	}
	b.WriteString("\n## goverbs\n")
	markdownTables(b, rep.Results)
	if len(rep.Peers) > 0 {
		b.WriteString("\n## The peers\n")
		markdownTables(b, rep.Peers)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// markdownComparison writes the comparisons as one table.
func markdownComparison(b *strings.Builder, cs []Comparison) {
	if len(cs) == 0 {
		return
	}
	rounds := 1
	for _, c := range cs {
		rounds = max(rounds, c.Rounds)
	}
	b.WriteString("Speed is how many times faster goverbs is than the peer, in runs seconds apart: for latency on the median " +
		"(the mean where the peer gives only that), for bandwidth on the average.")
	if rounds > 1 {
		fmt.Fprintf(b, " Over %d rounds: the figures and the speed are the rounds' medians, the range the speeds' lowest and highest.", rounds)
	}
	b.WriteString("\n\n| test | bytes | goverbs | | peer | peer test | | speed |")
	if rounds > 1 {
		b.WriteString(" range |")
	}
	b.WriteString("\n|---|--:|---|--:|---|---|--:|--:|")
	if rounds > 1 {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
	for _, c := range cs {
		unit := c.Unit
		if unit == "µs avg" {
			unit = "µs (mean)"
		}
		speed := "-"
		if c.Speedup > 0 {
			speed = fmt.Sprintf("%.2f×", c.Speedup)
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s %s | %s | %s | %s %s | %s |", c.Test, c.Size, c.Ours, num(c.OurValue), unit,
			c.Peer, c.PeerTest, num(c.Value), unit, speed)
		if rounds > 1 {
			if c.Speedup > 0 {
				fmt.Fprintf(b, " %.2f–%.2f× (%d) |", c.SpeedupMin, c.SpeedupMax, c.Rounds)
			} else {
				b.WriteString(" - |")
			}
		}
		b.WriteString("\n")
	}
}

// markdownTables writes results as one table per source and test, in
// the order they come, with WriteTable's columns.
func markdownTables(b *strings.Builder, results []*Result) {
	var last string
	for _, r := range results {
		head := r.Name() + " " + r.Test.String()
		if head != last {
			last = head
			if r.Stack == "goverbs" {
				mode := "polling"
				if r.Event {
					mode = "events"
				}
				if r.PostList > 1 {
					mode += fmt.Sprintf("; post lists of %d", r.PostList)
				}
				fmt.Fprintf(b, "\n### %s: %s\n\n%s; %s.\n\n", r.Name(), r.Test, r.Test.Doc(), mode)
			} else {
				fmt.Fprintf(b, "\n### %s: %s\n\nAs %s.\n\n", r.Name(), r.Test, r.PeerTest)
			}
			if r.Test.Latency() {
				b.WriteString("| bytes | iterations | t_min µs | t_typical µs | t_avg µs | t_p99 µs | t_max µs | CPU client µs/iter | CPU server µs/iter |\n")
				b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
			} else {
				b.WriteString("| bytes | iterations | window | BW peak MiB/s | BW average MiB/s | MsgRate Mpps | CPU client µs/msg | CPU server µs/msg |\n")
				b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|\n")
			}
		}
		cpu := strings.ReplaceAll(cpuCols(r.CPU), "\t", " | ")
		switch {
		case r.Lat != nil:
			l := r.Lat
			fmt.Fprintf(b, "| %d | %d | %s | %s | %s | %s | %s | %s |\n", r.Size, r.Iters, num(l.Min), num(l.Typical), num(l.Avg), num(l.P99), num(l.Max), cpu)
		case r.BW != nil:
			bw := r.BW
			win := "-"
			if r.Window > 0 {
				win = strconv.Itoa(r.Window)
			}
			fmt.Fprintf(b, "| %d | %d | %s | %s | %s | %s | %s |\n", r.Size, r.Iters, win, num(bw.PeakMiBps), num(bw.AvgMiBps), num(bw.Mpps), cpu)
		}
	}
}

// mdEscape keeps text that may hold Markdown's special characters (a
// peer's error) from being read as markup.
func mdEscape(s string) string {
	return strings.NewReplacer("|", `\|`, "*", `\*`, "`", "'", "<", "&lt;").Replace(s)
}
