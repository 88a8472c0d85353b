package demo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The configuration the demo writes for Prometheus (--prometheus-config)
// passes `promtool check config`, rule files included, and scrapes both
// daemons' endpoints.
func TestPrometheusConfig(t *testing.T) {
	t.Parallel()
	m := MetricsEndpoints{Scheduler: "127.0.0.1:9464", Sidecar: "127.0.0.1:9465"}
	path := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := WritePrometheusConfig(path, m, filepath.Join("..", "..", "docs", "prometheus")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for _, want := range []string{`"127.0.0.1:9464"`, `"127.0.0.1:9465"`, "alerts.yml", "job_name: cuesched-sidecar"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %s:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "_test.yml") {
		t.Errorf("config loads a promtool unit test as rules:\n%s", cfg)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CUESCHED_ALLOW_NO_PROMTOOL") != "" {
			t.Skip("promtool not installed (CUESCHED_ALLOW_NO_PROMTOOL is set)")
		}
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/ensure-deps.sh)")
	}
	if out, err := exec.Command(promtool, "check", "config", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, cfg)
	}
	if _, err := RuleFiles(t.TempDir()); err == nil {
		t.Error("RuleFiles of an empty dir: no error")
	}
}
