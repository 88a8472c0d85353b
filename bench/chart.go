package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Measure is what a unit measures, so that a figure and its baseline share
// one axis: the unit after its last '_' or '-' ("frames/s" for
// "dispatch_frames/s", "pgbench_frames/s" and "round1_dispatch_frames/s";
// "ratio" for every quotient; "ms" for "p50-ms" and "commit_to_redis_p99_ms").
func Measure(unit string) string {
	if isRatio(unit) {
		return "ratio"
	}
	if i := strings.LastIndexAny(unit, "_-"); i >= 0 && i+1 < len(unit) {
		return unit[i+1:]
	}
	return unit
}

// baseline reports whether a bar is a same-run baseline (drawn grey).
func baseline(name, unit string) bool {
	if isRatio(unit) {
		return false
	}
	s := strings.ToLower(name + " " + unit)
	for _, w := range []string{"baseline", "dbalone", "linear", "pgbench", "redis-benchmark", "round1"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

type bar struct {
	label string
	value float64
	base  bool
}

// Chart draws one family as stacked panels, one per measure (Measure): every
// figure of that measure, of every benchmark of the family, is a bar on the
// panel's one axis, so a figure stands beside its baseline (grey) at their
// true proportions. The ratio panel marks 1 (figure = baseline). A panel
// whose values span more than two orders of magnitude uses a log scale (said
// in its title).
func Chart(w io.Writer, fam []Result) error {
	var measures []string
	panels := map[string][]bar{}
	multi := len(fam) > 1
	for _, r := range fam {
		for _, m := range r.Metrics {
			if m.Unit == "ns/op" && m.Value == 0 {
				continue // a benchmark that reports its own figures
			}
			k := Measure(m.Unit)
			if _, ok := panels[k]; !ok {
				measures = append(measures, k)
			}
			label := m.Unit
			if multi {
				label = strings.TrimPrefix(r.Name, r.Family+"/") + "  " + m.Unit
			}
			panels[k] = append(panels[k], bar{label: label, value: m.Value, base: baseline(r.Name, m.Unit)})
		}
	}
	const (
		width    = 900
		rowH     = 18
		labelW   = 360
		panelPad = 36
	)
	height := 30
	for _, k := range measures {
		height += panelPad + rowH*len(panels[k]) + 10
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, 10, 18, "cuesched bench: "+fam[0].Family+" ("+shortPkg(fam[0].Package)+"); grey = same-run baseline", color.Black)
	y := 30
	palette := []color.RGBA{{52, 101, 164, 255}, {204, 0, 0, 255}, {78, 154, 6, 255}, {196, 160, 0, 255}, {117, 80, 123, 255}}
	barMax := width - labelW - 90
	for pi, k := range measures {
		bars := panels[k]
		minV, maxV := math.Inf(1), 0.0
		for _, b := range bars {
			maxV = math.Max(maxV, math.Abs(b.value))
			if b.value > 0 {
				minV = math.Min(minV, b.value)
			}
		}
		if k == "ratio" {
			maxV = math.Max(maxV, 1)
		}
		logScale := maxV > 0 && minV < math.Inf(1) && maxV/minV > 100
		frac := func(v float64) float64 {
			switch {
			case maxV <= 0:
				return 0
			case logScale:
				lo := math.Log10(minV) - 0.3
				return (math.Log10(math.Max(v, minV)) - lo) / (math.Log10(maxV) - lo)
			default:
				return math.Abs(v) / maxV
			}
		}
		title := k + " (one axis)"
		if logScale {
			title = k + " (one axis, log scale)"
		}
		text(img, 10, y+22, title, color.RGBA{60, 60, 60, 255})
		y += panelPad
		top := y
		for _, b := range bars {
			bw := max(int(frac(b.value)*float64(barMax)), 1)
			label := b.label
			if len(label) > 50 {
				label = label[:50]
			}
			text(img, 10, y+13, label, color.Black)
			c := palette[pi%len(palette)]
			if b.base {
				c = color.RGBA{150, 150, 150, 255}
			}
			draw.Draw(img, image.Rect(labelW, y+3, labelW+bw, y+rowH-2), &image.Uniform{c}, image.Point{}, draw.Src)
			text(img, labelW+bw+6, y+13, fmtNum(b.value), color.Black)
			y += rowH
		}
		if k == "ratio" && !logScale {
			x := labelW + int(frac(1)*float64(barMax))
			draw.Draw(img, image.Rect(x, top, x+1, y), &image.Uniform{color.Black}, image.Point{}, draw.Src)
			text(img, x+3, top-3, "1", color.Black)
		}
		y += 10
	}
	return png.Encode(w, img)
}

var sizeParam = regexp.MustCompile(`(?:^|/)hosts=(\d+)(?:/|$)`)

// Growth reports whether a family has results at two or more farm sizes
// (a "hosts=N" element in their names), for GrowthChart.
func Growth(fam []Result) bool {
	sizes := map[string]bool{}
	for _, r := range fam {
		if m := sizeParam.FindStringSubmatch(r.Name); m != nil {
			sizes[m[1]] = true
		}
	}
	return len(sizes) >= 2
}

// GrowthChart draws, for each unit of a family measured at several farm
// sizes (hosts=N), one line per variant (the name without its hosts=N
// element) of the value against the number of hosts (log scale), each
// panel's values from zero: a per-frame cost that does not grow with the
// farm is a flat line.
func GrowthChart(w io.Writer, fam []Result) error {
	type point struct{ x, y float64 }
	var units []string
	lines := map[string]map[string][]point{} // unit -> variant -> points
	for _, r := range fam {
		m := sizeParam.FindStringSubmatch(r.Name)
		if m == nil {
			continue
		}
		x, _ := strconv.ParseFloat(m[1], 64)
		variant := strings.Trim(sizeParam.ReplaceAllString(strings.TrimPrefix(r.Name, r.Family), "/"), "/")
		for _, mt := range r.Metrics {
			if lines[mt.Unit] == nil {
				lines[mt.Unit] = map[string][]point{}
				units = append(units, mt.Unit)
			}
			lines[mt.Unit][variant] = append(lines[mt.Unit][variant], point{x, mt.Value})
		}
	}
	const (
		width  = 900
		panelH = 190
		left   = 90
		right  = 260
	)
	img := image.NewRGBA(image.Rect(0, 0, width, 30+len(units)*(panelH+20)))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, 10, 18, "cuesched bench: "+fam[0].Family+" against farm size (hosts, log scale)", color.Black)
	palette := []color.RGBA{{52, 101, 164, 255}, {204, 0, 0, 255}, {78, 154, 6, 255}, {196, 160, 0, 255}, {117, 80, 123, 255}, {150, 150, 150, 255}}
	grey := color.RGBA{180, 180, 180, 255}
	for ui, u := range units {
		y0 := 30 + ui*(panelH+20)
		plotTop, plotBot := y0+25, y0+panelH-25
		text(img, 10, y0+15, u, color.RGBA{60, 60, 60, 255})
		minX, maxX, maxY := math.Inf(1), 0.0, 0.0
		var variants []string
		for v, ps := range lines[u] {
			variants = append(variants, v)
			for _, p := range ps {
				minX, maxX, maxY = math.Min(minX, p.x), math.Max(maxX, p.x), math.Max(maxY, p.y)
			}
		}
		sort.Strings(variants)
		if maxY <= 0 {
			maxY = 1
		}
		px := func(x float64) int {
			if maxX <= minX {
				return left
			}
			return left + int((math.Log10(x)-math.Log10(minX))/(math.Log10(maxX)-math.Log10(minX))*float64(width-left-right))
		}
		py := func(y float64) int { return plotBot - int(y/maxY*float64(plotBot-plotTop)) }
		draw.Draw(img, image.Rect(left, plotTop, left+1, plotBot+1), &image.Uniform{grey}, image.Point{}, draw.Src)
		draw.Draw(img, image.Rect(left, plotBot, width-right, plotBot+1), &image.Uniform{grey}, image.Point{}, draw.Src)
		text(img, 10, plotTop+10, fmtNum(maxY), color.Black)
		text(img, 10, plotBot, "0", color.Black)
		for vi, v := range variants {
			ps := lines[u][v]
			sort.Slice(ps, func(i, j int) bool { return ps[i].x < ps[j].x })
			c := palette[vi%len(palette)]
			for i, p := range ps {
				x, y := px(p.x), py(p.y)
				draw.Draw(img, image.Rect(x-3, y-3, x+4, y+4), &image.Uniform{c}, image.Point{}, draw.Src)
				text(img, x-10, plotBot+14, fmt.Sprintf("%.0f", p.x), color.Black)
				if i > 0 {
					line(img, px(ps[i-1].x), py(ps[i-1].y), x, y, c)
				}
			}
			last := ps[len(ps)-1]
			text(img, width-right+10, plotTop+12+vi*14, fmt.Sprintf("%s: %s", orDefault(v), fmtNum(last.y)), c)
		}
	}
	return png.Encode(w, img)
}

func orDefault(v string) string {
	if v == "" {
		return "value"
	}
	return v
}

// line draws a 2-pixel line from (x0, y0) to (x1, y1).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	n := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= n; i++ {
		x := x0 + (x1-x0)*i/n
		y := y0 + (y1-y0)*i/n
		img.Set(x, y, c)
		img.Set(x, y+1, c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
