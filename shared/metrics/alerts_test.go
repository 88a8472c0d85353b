package metrics

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The alert rules shipped in docs/prometheus pass `promtool test rules`,
// and every metric they name is one cuesched exports. promtool comes with
// Debian's prometheus package (scripts/ensure-deps.sh installs it); the
// test skips without it only when CUESCHED_ALLOW_NO_PROMTOOL is set.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "docs", "prometheus")
	rules, err := os.ReadFile(filepath.Join(dir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// Every metric name in an expression exists in the Go sources.
	var src strings.Builder
	root := filepath.Join("..", "..")
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "docs" || d.Name() == "bench") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			src.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	code := src.String()
	names := regexp.MustCompile(`\b((?:scheduler|sidecar|cuesched)_[a-z0-9_]+)`).FindAllStringSubmatch(string(rules), -1)
	if len(names) < 8 {
		t.Fatalf("only %d metric names in alerts.yml", len(names))
	}
	for _, m := range names {
		n := m[1]
		if strings.HasPrefix(n, "scheduler_accounting_") {
			// The publisher's metrics are named prefix + "_bookings_total".
			if strings.Contains(code, `"`+n+`"`) || strings.Contains(code, `"_`+strings.TrimPrefix(n, "scheduler_accounting_")+`"`) {
				continue
			}
		}
		if rest, ok := strings.CutPrefix(n, "sidecar_replication_"); ok && strings.Contains(code, `prefix + "`+rest+`"`) {
			// The replication package's metrics are named prefix + "lag_bytes".
			continue
		}
		if !strings.Contains(code, `"`+n+`"`) {
			t.Errorf("alerts.yml names %s, which no Go source exports", n)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CUESCHED_ALLOW_NO_PROMTOOL") != "" {
			t.Skip("promtool not installed (CUESCHED_ALLOW_NO_PROMTOOL is set)")
		}
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/ensure-deps.sh), or set CUESCHED_ALLOW_NO_PROMTOOL=1 to skip")
	}
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
