// Package prometheus_test checks the example Prometheus rules: promtool
// accepts them and their unit tests pass, and every metric they name is
// one a running ticketd node exports.
package prometheus_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

const rulesFile = "ticketd-rules.yml"

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found on PATH: install Debian's prometheus package (apt-get install prometheus) to check the rules")
	}
	return p
}

// TestRulesPassPromtool runs `promtool check rules` and `promtool test
// rules` on the example files.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", "ticketd-rules.test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// TestRulesNameRealMetrics gathers the metrics of a running three-node
// cluster's leader and finds every ticketd_* series the rules use among
// them (histograms by their family name).
func TestRulesNameRealMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// A quota of one lock, reached, so the refusal counter has a series.
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *daemon.Config) { cfg.MaxLocks = 1 }))
	lead := c.Leader(10 * time.Second)
	cl, err := sdk.New(testkit.Connect(t, c.ClientURL(lead)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Acquire(t.Context(), "metrics"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Acquire(t.Context(), "metrics/2"); sdk.CodeOf(err) != "resource_exhausted" {
		t.Fatalf("acquire beyond the quota: %v", err)
	}
	var families []string
	// The leader exports per-follower lag once it has heard from them.
	testkit.Eventually(t, 10*time.Second, "the leader's metrics", func() bool {
		mfs, err := c.Node(lead).Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		families = families[:0]
		for _, mf := range mfs {
			families = append(families, mf.GetName())
		}
		return slices.Contains(families, "ticketd_raft_follower_lag_entries")
	})
	used := regexp.MustCompile(`\bticketd_[a-z0-9_]+`).FindAllString(string(rules), -1)
	checked := map[string]bool{}
	for _, name := range used {
		if checked[name] {
			continue
		}
		checked[name] = true
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(families, b) {
				base = b
			}
		}
		if !slices.Contains(families, base) {
			t.Errorf("the rules use %s, which the node does not export", name)
		}
	}
	if len(checked) < 10 {
		t.Fatalf("only %d metric names found in %s: %v", len(checked), rulesFile, checked)
	}
	t.Logf("all %d metrics the rules use are exported", len(checked))
}
