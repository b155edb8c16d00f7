package perftest

import (
	"strings"
	"testing"
)

// TestWriteMarkdown: the document names the command that made it and the
// machine, carries the method, one table per source and test with a row
// per result, the comparisons, the plot and the skipped peers, with
// markup in a peer's reason escaped.
func TestWriteMarkdown(t *testing.T) {
	ours, peers := results()
	rep := &Report{Date: "2026-01-02T03:04:05Z", Host: "linux/amd64, 2 CPUs, load 0.50", Results: ours, Peers: peers,
		Comparisons: Compare(ours, peers),
		Skipped:     []Skip{{Peer: "ucx tcp", Test: "send_bw", Reason: "exit status 1: bad | table *row*"}}}
	var b strings.Builder
	doc := MarkdownDoc{Command: "goverbs bench --compare --markdown docs/performance.md", Machine: "Some CPU", Plot: "bench.png"}
	if err := WriteMarkdown(&b, rep, doc); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"# goverbs performance\n",
		"`goverbs bench --compare --markdown docs/performance.md`",
		"2026-01-02T03:04:05Z", "linux/amd64, 2 CPUs, load 0.50 (Some CPU)",
		"## How goverbs bench measures",
		"![Latency and bandwidth", "(bench.png)",
		"| write_lat | 8 | goverbs shm0 | 0.25 µs | ucx sm | ucp_put_lat | 0.125 µs | 0.50× |",
		"| send_lat | 64 | goverbs shm0 | 0.6 µs (mean) | libfabric shm | fi_pingpong | 1.20 µs (mean) | 2.00× |",
		"### goverbs shm0: write_lat\n\nRDMA Write ping-pong polling the last byte, half the round trip; polling.\n",
		"| 8 | 10 | 0.2 | 0.25 | 0.3 | 0.4 | 0.5 | 0.5 | 0.4 |",
		"| 65536 | 10 | 128 | 3000 | 2000 | 0.03 | - | - |",
		"### ucx sm: write_lat\n\nAs ucp_put_lat.\n",
		`- ucx tcp send_bw: exit status 1: bad \| table \*row\*`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the document lacks %q:\n%s", want, out)
		}
	}
	// A table per source and test: four of goverbs', four of the peers'.
	if n := strings.Count(out, "\n### "); n != 8 {
		t.Errorf("%d tables, want 8:\n%s", n, out)
	}
	// Every table row has as many cells as its header.
	var cols int
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "|") {
			cols = 0
			continue
		}
		n := strings.Count(strings.ReplaceAll(l, `\|`, ""), "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("row %q has %d cells, its table %d", l, n-1, cols-1)
		}
	}
}

// TestWriteMarkdownWithoutPeers: a run without --compare has no
// comparison section and no peers' tables.
func TestWriteMarkdownWithoutPeers(t *testing.T) {
	ours, _ := results()
	var b strings.Builder
	if err := WriteMarkdown(&b, &Report{Date: "d", Host: "h", Results: ours}, MarkdownDoc{Command: "goverbs bench"}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "## Compared") || strings.Contains(out, "## The peers") || strings.Contains(out, "![") {
		t.Errorf("a run without peers or plot has their sections:\n%s", out)
	}
	if n := strings.Count(out, "\n### "); n != 4 {
		t.Errorf("%d tables, want 4:\n%s", n, out)
	}
}
