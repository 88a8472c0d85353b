package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cuesched/cuesched/lab/chart"
)

// Verdict is PASS or FAIL.
func (r Result) Verdict() string {
	if r.Pass {
		return "PASS"
	}
	return "FAIL"
}

// Failed reports whether a judged run failed.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Judged && !r.Pass {
			return true
		}
	}
	return false
}

// WriteJSON writes one JSON object per scenario, one per line: its judged
// run with the comparison variants under "variants".
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range Grouped(rs) {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// Grouped folds each scenario's comparison variants into its judged run
// (Result.Variants), one entry per scenario.
func Grouped(rs []Result) []Result {
	var out []Result
	for _, r := range rs {
		if !r.Judged && len(out) > 0 && out[len(out)-1].Scenario == r.Scenario {
			out[len(out)-1].Variants = append(out[len(out)-1].Variants, r)
			continue
		}
		out = append(out, r)
	}
	return out
}

// WriteTable prints the results as a plain-text table.
func WriteTable(w io.Writer, rs []Result) {
	for _, r := range rs {
		v := r.Verdict()
		if !r.Judged {
			v = "(" + strings.ToLower(v) + ")"
		}
		fmt.Fprintf(w, "%-6s %-36s %5.0fs\n", v, r.Name(), r.Seconds)
		for _, m := range r.Metrics {
			mark := " "
			if !m.Pass {
				mark = "✗"
			}
			fmt.Fprintf(w, "         %s %s\n", mark, m)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "           note: %s\n", n)
		}
		if r.Error != "" {
			fmt.Fprintf(w, "           error: %s\n", r.Error)
		}
	}
}

// WriteReport writes report.md, report.json and one fill chart per run to
// dir.
func WriteReport(dir string, rs []Result, header string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	md.WriteString("# cuesched verify battery\n\n" + header + "\n\n")
	md.WriteString("| scenario | verdict | metrics (value, threshold) | seconds |\n|---|---|---|---|\n")
	for _, r := range rs {
		v := "**" + r.Verdict() + "**"
		if !r.Judged {
			v = "(" + strings.ToLower(r.Verdict()) + ", comparison)"
		}
		var ms []string
		for _, m := range r.Metrics {
			s := m.String()
			if !m.Pass {
				s = "✗ " + s
			}
			ms = append(ms, s)
		}
		if r.Error != "" {
			ms = append(ms, "error: "+r.Error)
		}
		fmt.Fprintf(&md, "| %s | %s | %s | %.0f |\n", r.Name(), v, strings.Join(ms, "<br>"), r.Seconds)
	}
	md.WriteString("\n")
	for _, r := range rs {
		if len(r.Notes) == 0 && len(r.Fill) == 0 {
			continue
		}
		fmt.Fprintf(&md, "## %s\n\n", r.Name())
		for _, n := range r.Notes {
			fmt.Fprintf(&md, "- %s\n", n)
		}
		if len(r.Fill) > 1 {
			name := chartName(r)
			f, err := os.Create(filepath.Join(dir, name))
			if err != nil {
				return err
			}
			err = FillChart(f, r.Name()+": farm fill over time", r.Fill)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(&md, "\n![%s](%s)\n", r.Name(), name)
		}
		md.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(Grouped(rs), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.json"), append(js, '\n'), 0o644)
}

func chartName(r Result) string {
	n := strings.ToLower(r.Name())
	n = strings.NewReplacer("[", "-", "]", "", " ", "-").Replace(n)
	return "fill-" + n + ".png"
}

// FillChart draws the booked fraction of the farm's cores over time (with
// the lab's one chart code, lab/chart).
func FillChart(w io.Writer, title string, pts []Point) error {
	s := chart.Series{Name: "cores booked", Color: chart.Palette()[0]}
	for _, p := range pts {
		s.T = append(s.T, p.T)
		s.V = append(s.V, min(max(p.Fill, 0), 1))
	}
	return chart.Draw(w, title, []chart.Panel{{Title: "booked share of the farm's cores", Percent: true, YMax: 1, Series: []chart.Series{s}}})
}
