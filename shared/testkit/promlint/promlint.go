// Package promlint checks a registry's exposition with Prometheus's own
// linter, `promtool check metrics` (package prometheus; scripts/ensure-deps.sh
// installs it), so a metric named against the conventions fails a test.
package promlint

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Check gathers g, writes it in the text format and fails t with every
// finding of `promtool check metrics`.
func Check(t testing.TB, g prometheus.Gatherer) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (install package prometheus: scripts/ensure-deps.sh): %v", err)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	if len(mfs) == 0 {
		t.Fatal("the registry exports no metric family")
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatalf("encode %s: %v", mf.GetName(), err)
		}
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("promtool check metrics (%d families): %v\n%s", len(mfs), err, out)
	}
}
