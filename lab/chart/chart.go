// Package chart draws the lab's PNG charts: panels of time series over one
// shared time axis, each either lines or stacked areas, with a legend. The
// simulator's farm-fill charts (lab/sim) and the demo's run chart
// (lab/demo) are both drawn here, so there is one drawing code in the lab.
//
// It uses golang.org/x/image's fixed 7×13 font only; the deployed binary
// never links it (cmd/cuesched/imports_test.go).
package chart

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one named curve: values V at times T (seconds, ascending).
type Series struct {
	Name  string
	Color color.RGBA
	T, V  []float64
}

// Panel is one plot of the chart.
type Panel struct {
	Title string
	// Stacked draws the series as stacked areas (in order, the first at
	// the bottom); otherwise each is a line.
	Stacked bool
	// Percent labels the y axis 0-100% of YMax (YMax 1 for fractions).
	Percent bool
	// YMax fixes the top of the y axis; 0 = the data's maximum.
	YMax   float64
	Series []Series
	// Height of the plot area in pixels (default 180).
	Height int
}

// Palette is a set of distinguishable colours (Tango).
func Palette() []color.RGBA {
	return []color.RGBA{
		{52, 101, 164, 255},  // blue
		{204, 0, 0, 255},     // red
		{78, 154, 6, 255},    // green
		{245, 121, 0, 255},   // orange
		{117, 80, 123, 255},  // purple
		{193, 125, 17, 255},  // brown
		{196, 160, 0, 255},   // yellow
		{85, 87, 83, 255},    // dark grey
		{114, 159, 207, 255}, // light blue
		{239, 41, 41, 255},   // light red
		{138, 226, 52, 255},  // light green
		{173, 127, 168, 255}, // light purple
	}
}

const (
	width      = 820
	left       = 60
	right      = 190 // the legend
	titleH     = 26
	panelTop   = 22
	panelBelow = 26
)

// Draw writes the chart as a PNG: title, then each panel with its own y
// axis over the one time axis (0 to the last sample of any series).
func Draw(w io.Writer, title string, panels []Panel) error {
	tmax := 0.0
	for _, p := range panels {
		for _, s := range p.Series {
			if n := len(s.T); n > 0 {
				tmax = math.Max(tmax, s.T[n-1])
			}
		}
	}
	if tmax <= 0 {
		tmax = 1
	}
	height := titleH
	for _, p := range panels {
		height += panelTop + panelHeight(p) + panelBelow
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	Label(img, 10, 18, title, color.Black)
	y := titleH
	for _, p := range panels {
		drawPanel(img, p, y, tmax)
		y += panelTop + panelHeight(p) + panelBelow
	}
	return png.Encode(w, img)
}

func panelHeight(p Panel) int {
	if p.Height > 0 {
		return p.Height
	}
	return 180
}

func drawPanel(img *image.RGBA, p Panel, y0 int, tmax float64) {
	ph := panelHeight(p)
	pw := width - left - right
	top := y0 + panelTop
	Label(img, left, y0+15, p.Title, color.RGBA{40, 40, 40, 255})

	// The y range: stacked panels reach the sum of their series.
	ymax := p.YMax
	if ymax <= 0 {
		for i := range longest(p.Series) {
			sum := 0.0
			for _, s := range p.Series {
				v := at(s, i)
				if p.Stacked {
					sum += v
				} else {
					sum = math.Max(sum, v)
				}
			}
			ymax = math.Max(ymax, sum)
		}
		// Four grid steps of a round size.
		ymax = 4 * niceCeil(ymax/4)
	}
	grey := color.RGBA{210, 210, 210, 255}
	for i := 0; i <= 4; i++ {
		f := float64(i) / 4
		yy := top + ph - int(f*float64(ph))
		for x := left; x < left+pw; x++ {
			img.Set(x, yy, grey)
		}
		var l string
		if p.Percent {
			l = fmt.Sprintf("%3.0f%%", f*100)
		} else {
			l = short(f * ymax)
		}
		Label(img, left-8-7*len(l), yy+4, l, color.Black)
	}
	for i := 0; i <= 4; i++ {
		t := tmax * float64(i) / 4
		Label(img, left+int(float64(pw)*float64(i)/4)-10, top+ph+16, fmt.Sprintf("%.0fs", t), color.Black)
	}
	px := func(t float64) int { return left + int(t/tmax*float64(pw)) }
	py := func(v float64) int {
		return top + ph - int(math.Min(math.Max(v/ymax, 0), 1)*float64(ph))
	}
	if p.Stacked {
		// Fill column by column between the running sums.
		base := make([]float64, longest(p.Series))
		for _, s := range p.Series {
			for i := 0; i+1 < len(s.T); i++ {
				x0, x1 := px(s.T[i]), px(s.T[i+1])
				for x := x0; x < max(x1, x0+1); x++ {
					lo, hi := py(base[i]), py(base[i]+s.V[i])
					for yy := hi; yy < lo; yy++ {
						img.Set(x, yy, s.Color)
					}
				}
			}
			for i := range s.V {
				if i < len(base) {
					base[i] += s.V[i]
				}
			}
		}
	} else {
		for _, s := range p.Series {
			for i := 1; i < len(s.T); i++ {
				Line(img, px(s.T[i-1]), py(s.V[i-1]), px(s.T[i]), py(s.V[i]), s.Color)
			}
		}
	}
	// Legend, top to bottom (stacked: the top area first).
	ly := top + 4
	order := make([]int, len(p.Series))
	for i := range order {
		order[i] = i
		if p.Stacked {
			order[i] = len(p.Series) - 1 - i
		}
	}
	for _, i := range order {
		s := p.Series[i]
		draw.Draw(img, image.Rect(width-right+12, ly, width-right+24, ly+10), &image.Uniform{s.Color}, image.Point{}, draw.Src)
		Label(img, width-right+30, ly+10, s.Name, color.Black)
		ly += 16
	}
}

func longest(ss []Series) int {
	n := 0
	for _, s := range ss {
		n = max(n, len(s.V))
	}
	return n
}

func at(s Series, i int) float64 {
	if i < len(s.V) {
		return s.V[i]
	}
	return 0
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func short(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// Line draws a two-pixel-high line (Bresenham).
func Line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
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

// Label writes s with its baseline at (x, y).
func Label(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
