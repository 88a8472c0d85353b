package demo

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// MetricsEndpoints are the host:port of the demo's two /metrics endpoints.
type MetricsEndpoints struct {
	Scheduler, Sidecar string
}

// ScrapeInterval is the interval of the Prometheus configuration the demo
// writes: short, because a demo lasts minutes.
const ScrapeInterval = "2s"

// PrometheusConfig is a prometheus.yml that scrapes both endpoints (jobs
// cuesched-scheduler and cuesched-sidecar) and, when rulesDir is not "",
// loads every alert rule file in it (not the *_test.yml unit tests).
func PrometheusConfig(m MetricsEndpoints, rulesDir string, scrapeInterval string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by cuesched-lab demo: scrapes the demo's scheduler and sidecar.\n")
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", scrapeInterval, scrapeInterval)
	if rulesDir != "" {
		files, err := RuleFiles(rulesDir)
		if err != nil {
			return "", err
		}
		b.WriteString("rule_files:\n")
		for _, f := range files {
			fmt.Fprintf(&b, "  - %q\n", f)
		}
	}
	b.WriteString("scrape_configs:\n")
	for _, j := range []struct{ job, addr string }{{"cuesched-scheduler", m.Scheduler}, {"cuesched-sidecar", m.Sidecar}} {
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", j.job, j.addr)
	}
	return b.String(), nil
}

// RuleFiles lists the alert rule files of dir (absolute paths): every
// *.yml or *.yaml but the promtool unit tests (*_test.yml).
func RuleFiles(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, fmt.Errorf("alert rules: %w", err)
	}
	var files []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !(strings.HasSuffix(n, ".yml") || strings.HasSuffix(n, ".yaml")) ||
			strings.HasSuffix(n, "_test.yml") || strings.HasSuffix(n, "_test.yaml") {
			continue
		}
		files = append(files, filepath.Join(abs, n))
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("alert rules: no *.yml file in %s", abs)
	}
	return files, nil
}

// WritePrometheusConfig writes PrometheusConfig to path.
func WritePrometheusConfig(path string, m MetricsEndpoints, rulesDir string) error {
	cfg, err := PrometheusConfig(m, rulesDir, ScrapeInterval)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write the Prometheus configuration: %w", err)
	}
	return nil
}

// writePrometheusHint prints the metrics endpoints and how to point
// Prometheus and Grafana at them.
func writePrometheusHint(out io.Writer, m MetricsEndpoints, promConfig string) {
	fmt.Fprintf(out, "  metrics: scheduler http://%s/metrics, sidecar http://%s/metrics\n", m.Scheduler, m.Sidecar)
	if promConfig == "" {
		cfg, _ := PrometheusConfig(m, "", ScrapeInterval)
		fmt.Fprintln(out, "  to scrape them, save this as prometheus.yml (fixed ports: --metrics-addr, --sidecar-metrics-addr;")
		fmt.Fprintln(out, "  or let the demo write it: --prometheus-config FILE):")
		for _, l := range strings.Split(strings.TrimSpace(cfg), "\n") {
			fmt.Fprintf(out, "      %s\n", l)
		}
		promConfig = "prometheus.yml"
	} else {
		fmt.Fprintf(out, "  Prometheus configuration for them written to %s\n", promConfig)
	}
	fmt.Fprintf(out, "    prometheus --config.file=%s --storage.tsdb.path=$(mktemp -d) --web.listen-address=127.0.0.1:9090\n", promConfig)
	fmt.Fprintln(out, "  then add http://127.0.0.1:9090 as a Prometheus data source in Grafana and import docs/grafana/cuesched-dashboard.json")
}
