package verbstest

import (
	"strings"
	"testing"
)

// TestSummaryNamesEachOutcome: the summary counts the cases by outcome
// and names the failed ones, the skipped ones with their reasons, and
// the passed ones some of whose subtests skipped.
func TestSummaryNamesEachOutcome(t *testing.T) {
	skips.Store("T/G/Skipped", "no CapX")
	skips.Store("T/G/Partly/Sub", "no CapY")
	defer skips.Delete("T/G/Skipped")
	defer skips.Delete("T/G/Partly/Sub")
	got := summarize(Harness{Device: "dev0"}, []caseResult{
		{name: "G/Passed", testName: "T/G/Passed"},
		{name: "G/Failed", testName: "T/G/Failed", failed: true},
		{name: "G/Skipped", testName: "T/G/Skipped", skipped: true},
		{name: "G/Partly", testName: "T/G/Partly"},
	})
	for _, want := range []string{
		"conformance of dev0, both endpoints in this process: 4 cases run, 2 passed, 1 failed, 1 skipped",
		"failed: G/Failed\n",
		"skipped: G/Skipped (no CapX)\n",
		"passed with subtests skipped: G/Partly (Sub: no CapY)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q lacks %q", got, want)
		}
	}
}
