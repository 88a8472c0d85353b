package chart

import (
	"bytes"
	"image/png"
	"os"
	"testing"
)

// A chart of a line panel and a stacked panel decodes as a PNG of the
// expected width, with the series' colours drawn.
func TestDrawDecodes(t *testing.T) {
	pal := Palette()
	ts := []float64{0, 1, 2, 3, 4}
	panels := []Panel{
		{Title: "cores", Series: []Series{{Name: "a", Color: pal[0], T: ts, V: []float64{0, 10, 20, 15, 5}}}},
		{Title: "waiting", Stacked: true, Series: []Series{
			{Name: "limit", Color: pal[1], T: ts, V: []float64{5, 5, 5, 5, 5}},
			{Name: "depend", Color: pal[2], T: ts, V: []float64{10, 8, 6, 4, 2}},
		}},
	}
	var buf bytes.Buffer
	if err := Draw(&buf, "test", panels); err != nil {
		t.Fatal(err)
	}
	if p := os.Getenv("CHART_OUT"); p != "" {
		_ = os.WriteFile(p, buf.Bytes(), 0o644)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds().Dx() != width {
		t.Fatalf("width %d", img.Bounds().Dx())
	}
	seen := map[[3]uint32]bool{}
	for y := 0; y < img.Bounds().Dy(); y++ {
		for x := 0; x < width-right; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	for _, c := range pal[:3] {
		if !seen[[3]uint32{uint32(c.R), uint32(c.G), uint32(c.B)}] {
			t.Errorf("colour %v not drawn in the plots", c)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 7: 10, 12: 20, 2754: 5000, 100: 100, 0.3: 0.5} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
