package sim

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
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

// FillChart draws the booked fraction of the farm's cores over time.
func FillChart(w io.Writer, title string, pts []Point) error {
	const (
		width, height = 720, 300
		left, right   = 50, 20
		top, bottom   = 30, 40
	)
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	label(img, 10, 18, title)
	tmax := pts[len(pts)-1].T
	if tmax <= 0 {
		tmax = 1
	}
	pw, ph := width-left-right, height-top-bottom
	grey := color.RGBA{200, 200, 200, 255}
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := top + ph - int(f*float64(ph))
		for x := left; x < left+pw; x++ {
			img.Set(x, y, grey)
		}
		label(img, 8, y+4, fmt.Sprintf("%3.0f%%", f*100))
	}
	for i := 0; i <= 4; i++ {
		t := tmax * float64(i) / 4
		label(img, left+int(float64(pw)*float64(i)/4)-10, height-bottom+16, fmt.Sprintf("%.0fs", t))
	}
	blue := color.RGBA{52, 101, 164, 255}
	px := func(p Point) (int, int) {
		return left + int(p.T/tmax*float64(pw)), top + ph - int(min(max(p.Fill, 0), 1)*float64(ph))
	}
	for i := 1; i < len(pts); i++ {
		x0, y0 := px(pts[i-1])
		x1, y1 := px(pts[i])
		line(img, x0, y0, x1, y1, blue)
	}
	return png.Encode(w, img)
}

func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		img.Set(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func label(img *image.RGBA, x, y int, s string) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(color.Black), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
