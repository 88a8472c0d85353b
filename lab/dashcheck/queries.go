// Package dashcheck checks that the shipped Grafana dashboards
// (docs/grafana/*.json) and Prometheus alert rules (docs/prometheus) are
// true: it reads every panel target and rule expression from the files
// (so panels added later are covered without a list to maintain), parses
// them with Prometheus's own PromQL parser, and — in Run — evaluates them
// against a real Prometheus that scrapes a short embedded farm (lab/demo),
// failing on any expression that errors or comes back empty (issue #26).
package dashcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// Query is one expression to check: a dashboard panel's target or an
// alert rule's expression.
type Query struct {
	// Source is the file the expression comes from.
	Source string
	// Alert is true for an alert rule (Panel is then the alert's name).
	Alert bool
	// Row and Panel name the dashboard row and panel; RefID the target.
	Row, Panel string
	PanelID    int
	RefID      string
	// Raw is the expression as written; Expr has the Grafana variables
	// substituted (Raw for alert rules).
	Raw, Expr string
}

// Name is a short human label of q.
func (q Query) Name() string {
	if q.Alert {
		return fmt.Sprintf("alert %s (%s)", q.Panel, filepath.Base(q.Source))
	}
	row := ""
	if q.Row != "" {
		row = q.Row + " / "
	}
	return fmt.Sprintf("panel %q #%d %s (%s)", row+q.Panel, q.PanelID, q.RefID, filepath.Base(q.Source))
}

// Vars are the values the Grafana built-in interval variables take.
type Vars struct {
	// Interval is $__interval (Grafana: the query's step).
	Interval time.Duration
	// ScrapeInterval is the data source's scrape interval, for
	// $__rate_interval = max($__interval + scrape, 4 × scrape).
	ScrapeInterval time.Duration
	// Range is $__range (the dashboard's time range).
	Range time.Duration
}

// DefaultVars are the values for parsing only: a 1 h dashboard at a 15 s
// step and scrape.
func DefaultVars() Vars {
	return Vars{Interval: 15 * time.Second, ScrapeInterval: 15 * time.Second, Range: time.Hour}
}

func (v Vars) rateInterval() time.Duration {
	return max(v.Interval+v.ScrapeInterval, 4*v.ScrapeInterval)
}

type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int      `json:"id"`
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
	Targets []target `json:"targets"`
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

type templateVar struct {
	Name     string          `json:"name"`
	Type     string          `json:"type"`
	Query    json.RawMessage `json:"query"`
	AllValue string          `json:"allValue"`
	Current  struct {
		Value json.RawMessage `json:"value"`
	} `json:"current"`
}

// value is what the variable stands for in a check: its current value (a
// multi-value selection joined by "|"), ".*" for "All" or a query variable
// without one.
func (t templateVar) value() (string, bool) {
	var one string
	var many []string
	if len(t.Current.Value) > 0 {
		if json.Unmarshal(t.Current.Value, &one) == nil && one != "" && one != "$__all" {
			return one, true
		}
		if json.Unmarshal(t.Current.Value, &many) == nil && len(many) > 0 && many[0] != "$__all" {
			return strings.Join(many, "|"), true
		}
	}
	switch t.Type {
	case "query", "custom":
		if t.AllValue != "" {
			return t.AllValue, true
		}
		return ".*", true
	case "constant", "textbox", "interval":
		var q string
		if json.Unmarshal(t.Query, &q) == nil && q != "" {
			return strings.Split(q, ",")[0], true
		}
	}
	return "", false
}

// DashboardFiles lists docs/grafana's dashboards (*.json).
func DashboardFiles(docsDir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(docsDir, "grafana", "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no dashboard (*.json) in %s", filepath.Join(docsDir, "grafana"))
	}
	return files, nil
}

// AlertFiles lists docs/prometheus's rule files (not the *_test.yml).
func AlertFiles(docsDir string) ([]string, error) {
	var files []string
	for _, pat := range []string{"*.yml", "*.yaml"} {
		m, err := filepath.Glob(filepath.Join(docsDir, "prometheus", pat))
		if err != nil {
			return nil, err
		}
		for _, f := range m {
			if !strings.HasSuffix(f, "_test.yml") && !strings.HasSuffix(f, "_test.yaml") {
				files = append(files, f)
			}
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no rule file (*.yml) in %s", filepath.Join(docsDir, "prometheus"))
	}
	return files, nil
}

// LoadAll reads every dashboard and alert rule file under docsDir.
func LoadAll(docsDir string, v Vars) ([]Query, error) {
	dash, err := DashboardFiles(docsDir)
	if err != nil {
		return nil, err
	}
	rules, err := AlertFiles(docsDir)
	if err != nil {
		return nil, err
	}
	var qs []Query
	for _, f := range dash {
		q, err := DashboardQueries(f, v)
		if err != nil {
			return nil, err
		}
		qs = append(qs, q...)
	}
	for _, f := range rules {
		q, err := AlertQueries(f)
		if err != nil {
			return nil, err
		}
		qs = append(qs, q...)
	}
	return qs, nil
}

// DashboardQueries reads a Grafana dashboard's panel targets (rows,
// collapsed rows' panels included), with the variables substituted.
func DashboardQueries(path string, v Vars) ([]Query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []Query
	var errs []string
	row := ""
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				row = p.Title
				walk(p.Panels)
				continue
			}
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					continue
				}
				q := Query{Source: path, Row: row, Panel: p.Title, PanelID: p.ID, RefID: t.RefID, Raw: t.Expr}
				q.Expr, err = Substitute(t.Expr, d.Templating.List, v)
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s: %v", q.Name(), err))
					continue
				}
				qs = append(qs, q)
			}
		}
	}
	walk(d.Panels)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s:\n  %s", path, strings.Join(errs, "\n  "))
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no panel target with an expression", path)
	}
	return qs, nil
}

// AlertQueries reads the alerting (and recording) rules of a Prometheus
// rule file.
func AlertQueries(path string) ([]Query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []Query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			e := strings.TrimSpace(r.Expr)
			qs = append(qs, Query{Source: path, Alert: true, Row: g.Name, Panel: name, Raw: e, Expr: e})
		}
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no rule", path)
	}
	return qs, nil
}

var varRE = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}|\[\[([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\]\]|\$([A-Za-z0-9_]+)`)

// Substitute replaces Grafana's variables in expr: the built-in
// $__interval, $__rate_interval, $__range (and their _ms/_s forms) from v,
// the dashboard's template variables by their current value (".*" for
// "All"). An unknown variable is an error.
func Substitute(expr string, vars []templateVar, v Vars) (string, error) {
	byName := map[string]templateVar{}
	for _, t := range vars {
		byName[t.Name] = t
	}
	dur := func(d time.Duration) string { return model.Duration(d).String() }
	var unknown []string
	out := varRE.ReplaceAllStringFunc(expr, func(m string) string {
		sm := varRE.FindStringSubmatch(m)
		name := sm[1] + sm[2] + sm[3]
		switch name {
		case "__interval":
			return dur(v.Interval)
		case "__interval_ms":
			return fmt.Sprint(v.Interval.Milliseconds())
		case "__rate_interval":
			return dur(v.rateInterval())
		case "__rate_interval_ms":
			return fmt.Sprint(v.rateInterval().Milliseconds())
		case "__range":
			return dur(v.Range)
		case "__range_s":
			return fmt.Sprint(int64(v.Range.Seconds()))
		case "__range_ms":
			return fmt.Sprint(v.Range.Milliseconds())
		}
		if t, ok := byName[name]; ok {
			if val, ok := t.value(); ok {
				return val
			}
		}
		unknown = append(unknown, m)
		return m
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("variables without a value: %s", strings.Join(unknown, ", "))
	}
	return out, nil
}

// Parse parses a PromQL expression with Prometheus's parser.
func Parse(expr string) (parser.Expr, error) {
	return parser.NewParser(parser.Options{}).ParseExpr(expr)
}

// Selectors are the vector selectors of e (in the order written, without
// duplicates), as PromQL text.
func Selectors(e parser.Expr) []string {
	seen := map[string]bool{}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			s := vs.String()
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
		return nil
	})
	return out
}

// MetricNames are the metric names e selects, sorted.
func MetricNames(e parser.Expr) []string {
	seen := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == model.MetricNameLabel {
						name = m.Value
					}
				}
			}
			if name != "" {
				seen[name] = true
			}
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// FamilyName is the metric family a series name belongs to: a histogram's
// _bucket, _sum and _count series name their family without the suffix.
func FamilyName(series string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, s); ok {
			return base
		}
	}
	return series
}
