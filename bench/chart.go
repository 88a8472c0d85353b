package bench

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart draws one family as stacked panels, one per metric unit, each with a
// horizontal bar per benchmark. A panel whose values span more than two
// orders of magnitude uses a log scale (said in its title).
func Chart(w io.Writer, fam []Result) error {
	units := unitsOf(fam)
	const (
		width    = 900
		rowH     = 18
		labelW   = 330
		panelPad = 36
	)
	height := 30
	for _, u := range units {
		height += panelPad + rowH*countWith(fam, u) + 10
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, 10, 18, "cuesched bench: "+fam[0].Family+" ("+shortPkg(fam[0].Package)+")", color.Black)
	y := 30
	palette := []color.RGBA{{52, 101, 164, 255}, {204, 0, 0, 255}, {78, 154, 6, 255}, {196, 160, 0, 255}, {117, 80, 123, 255}}
	for ui, u := range units {
		minV, maxV := math.Inf(1), 0.0
		for _, r := range fam {
			if v, ok := r.metric(u); ok {
				maxV = math.Max(maxV, math.Abs(v))
				if v > 0 {
					minV = math.Min(minV, v)
				}
			}
		}
		logScale := maxV > 0 && minV < math.Inf(1) && maxV/minV > 100
		title := u
		if logScale {
			title += " (log scale)"
		}
		text(img, 10, y+22, title, color.RGBA{60, 60, 60, 255})
		y += panelPad
		for _, r := range fam {
			v, ok := r.metric(u)
			if !ok {
				continue
			}
			frac := 0.0
			if maxV > 0 {
				if logScale {
					lo := math.Log10(minV) - 0.3
					frac = (math.Log10(math.Max(v, minV)) - lo) / (math.Log10(maxV) - lo)
				} else {
					frac = math.Abs(v) / maxV
				}
			}
			barMax := width - labelW - 90
			bw := int(frac * float64(barMax))
			if bw < 1 {
				bw = 1
			}
			name := strings.TrimPrefix(r.Name, r.Family+"/")
			if len(name) > 46 {
				name = name[:46]
			}
			text(img, 10, y+13, name, color.Black)
			c := palette[ui%len(palette)]
			if strings.Contains(strings.ToLower(r.Name), "baseline") || strings.Contains(strings.ToLower(r.Name), "linear") {
				c = color.RGBA{150, 150, 150, 255}
			}
			draw.Draw(img, image.Rect(labelW, y+3, labelW+bw, y+rowH-2), &image.Uniform{c}, image.Point{}, draw.Src)
			text(img, labelW+bw+6, y+13, fmtNum(v), color.Black)
			y += rowH
		}
		y += 10
	}
	return png.Encode(w, img)
}

func countWith(fam []Result, unit string) int {
	n := 0
	for _, r := range fam {
		if _, ok := r.metric(unit); ok {
			n++
		}
	}
	return n
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
