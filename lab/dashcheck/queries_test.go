package dashcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const docsDir = "../../docs"

// TestEveryExpressionParses: every panel target of every dashboard in
// docs/grafana and every rule of docs/prometheus parses with Prometheus's
// own PromQL parser once Grafana's variables are substituted, and selects
// at least one metric. Read from the files: panels added later are
// covered. (The real-Prometheus evaluation is make dashboard-check.)
func TestEveryExpressionParses(t *testing.T) {
	t.Parallel()
	qs, err := LoadAll(docsDir, DefaultVars())
	if err != nil {
		t.Fatal(err)
	}
	panels, alerts := 0, 0
	for _, q := range qs {
		if q.Alert {
			alerts++
		} else {
			panels++
		}
		e, err := Parse(q.Expr)
		if err != nil {
			t.Errorf("%s: %v\n  %s", q.Name(), err, q.Expr)
			continue
		}
		if len(MetricNames(e)) == 0 {
			t.Errorf("%s selects no metric: %s", q.Name(), q.Expr)
		}
	}
	if panels < 40 || alerts < 5 {
		t.Fatalf("read %d panel targets and %d alert rules: the files were not read", panels, alerts)
	}
}

// The checker itself: a broken expression does fail to parse, and the
// walk finds targets inside collapsed rows.
func TestParseAndWalk(t *testing.T) {
	t.Parallel()
	if _, err := Parse(`sum(rate(x_total[1m])`); err == nil {
		t.Fatal("an unbalanced expression parsed")
	}
	dir := t.TempDir()
	js := `{"templating":{"list":[{"name":"instance","type":"query","current":{"value":"$__all"}},
	  {"name":"show","type":"custom","current":{"value":["a","b"]}}]},
	  "panels":[{"type":"row","title":"R","collapsed":true,"panels":[
	    {"type":"timeseries","id":7,"title":"P","targets":[{"refId":"A","expr":"sum(rate(a_total{instance=~\"$instance\",show=~\"${show}\"}[$__rate_interval]))"}]}]},
	  {"type":"stat","id":8,"title":"Q","targets":[{"refId":"A","expr":"increase(b_total[$__range])"},{"refId":"B","expr":""}]}]}`
	p := filepath.Join(dir, "d.json")
	if err := os.WriteFile(p, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	qs, err := DashboardQueries(p, Vars{Interval: 2 * time.Second, ScrapeInterval: time.Second, Range: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`sum(rate(a_total{instance=~".*",show=~"a|b"}[4s]))`, `increase(b_total[1h])`}
	if len(qs) != 2 || qs[0].Expr != want[0] || qs[1].Expr != want[1] || qs[0].Row != "R" || qs[0].PanelID != 7 {
		t.Fatalf("got %+v, want exprs %q", qs, want)
	}
	for _, q := range qs {
		if _, err := Parse(q.Expr); err != nil {
			t.Errorf("%s: %v", q.Expr, err)
		}
	}
	if _, err := Substitute(`up{job="$nope"}`, nil, DefaultVars()); err == nil {
		t.Error("an unknown variable was substituted silently")
	}
	e, _ := Parse(`histogram_quantile(0.9, sum by (le) (rate(h_seconds_bucket[5m]))) / on() group_left max({__name__="g"})`)
	if got := MetricNames(e); !slices.Equal(got, []string{"g", "h_seconds_bucket"}) {
		t.Errorf("MetricNames = %v", got)
	}
	e, _ = Parse(`sum(rate(a_total{x="1"}[1m])) / sum(rate(a_total{x="1"}[1m])) or vector(0)`)
	if got := Selectors(e); !slices.Equal(got, []string{`a_total{x="1"}`}) {
		t.Errorf("Selectors = %v", got)
	}
}

// TestOperatorGuideDescribesEveryMetric: every metric a dashboard panel or
// an alert rule uses has a row in the operator guide's metric reference
// (docs/operator-guide.md, "### Metric reference"), with its unit and a
// healthy value, so a panel added later without its description fails
// here (issue #26).
func TestOperatorGuideDescribesEveryMetric(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile(filepath.Join(docsDir, "operator-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	described := metricReference(t, string(guide))
	qs, err := LoadAll(docsDir, DefaultVars())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, q := range qs {
		e, err := Parse(q.Expr)
		if err != nil {
			continue // TestEveryExpressionParses reports it
		}
		for _, n := range MetricNames(e) {
			fam := FamilyName(n)
			if n == "ALERTS" || seen[fam] {
				continue
			}
			seen[fam] = true
			if !described[fam] && !described[n] {
				t.Errorf("%s (used by %s) has no row in the operator guide's metric reference (with unit and healthy value)", fam, q.Name())
			}
		}
	}
	if len(seen) < 30 {
		t.Fatalf("only %d metrics used by the dashboards and alerts: not read?", len(seen))
	}
}

// metricReference parses the operator guide's "### Metric reference" table:
// | `name` ... | type and unit | healthy | meaning |, and returns the names
// of the rows whose unit and healthy cells are filled in.
func metricReference(t *testing.T, guide string) map[string]bool {
	t.Helper()
	_, sec, ok := strings.Cut(guide, "\n### Metric reference\n")
	if !ok {
		t.Fatal(`operator guide: no "### Metric reference" section`)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	name := regexp.MustCompile("`([a-z_][a-z0-9_]*)(?:\\{[^`]*\\})?`")
	out := map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) < 4 || strings.TrimSpace(cells[1]) == "" || strings.TrimSpace(cells[2]) == "" {
			t.Errorf("operator guide metric reference: row without unit or healthy value: %s", line)
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[0], -1) {
			out[m[1]] = true
		}
	}
	if len(out) == 0 {
		t.Fatal("operator guide: the metric reference has no row")
	}
	return out
}
