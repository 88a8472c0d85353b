package demo

import (
	"bytes"
	"image/png"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/explain"
)

func waitingOf(byHold map[hold]int, limits map[string][2]int) *Waiting {
	w := &Waiting{ByHold: byHold, ByShow: map[string]map[hold]int{"aurora": byHold}, Limits: limits}
	for _, n := range byHold {
		w.Total += n
	}
	return w
}

// The live line names the limit with its use, most frames first.
func TestWaitingLine(t *testing.T) {
	lim := hold{Reason: explain.Limit, Limit: "spi-nuke-license"}
	w := waitingOf(map[hold]int{lim: 465, {Reason: explain.Depend}: 300}, map[string][2]int{"spi-nuke-license": {12, 12}})
	if got, want := w.Line(w.ByHold, true), "limit spi-nuke-license (12/12) 465 · depend 300"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	if got, want := w.Line(w.ByHold, false), "limit spi-nuke-license 465 · depend 300"; got != want {
		t.Errorf("short line %q, want %q", got, want)
	}
	if got, want := w.Top(), "limit spi-nuke-license (12/12) 465"; got != want {
		t.Errorf("top %q, want %q", got, want)
	}
	// Dependencies never bind throughput.
	d := waitingOf(map[hold]int{{Reason: explain.Depend}: 900, {Reason: explain.Capacity}: 5}, nil)
	if h, n := d.binding(); h.Reason != explain.Capacity || n != 5 {
		t.Errorf("binding %v %d", h, n)
	}
}

// The story splits the run where the binding reason changes, folds blips
// shorter than 6 s into the phase before, and the chart decodes as a PNG.
func TestStoryPhasesAndChart(t *testing.T) {
	lim := hold{Reason: explain.Limit, Limit: "spi-nuke-license"}
	limits := map[string][2]int{"spi-nuke-license": {12, 12}}
	capW := waitingOf(map[hold]int{{Reason: explain.Capacity}: 2000, lim: 900}, limits)
	limW := waitingOf(map[hold]int{lim: 700, {Reason: explain.Depend}: 50}, limits)
	blip := waitingOf(map[hold]int{{Reason: explain.Flowing}: 3, lim: 2}, limits)
	tl := &timeline{shows: []string{"aurora"}, subs: map[string]*subUse{}}
	for i := 0; i <= 80; i++ {
		w := limW
		switch {
		case i < 20:
			w = capW
		case i >= 40 && i < 44: // 2 s
			w = blip
		}
		running := 200
		if i >= 60 { // from 30 s on only the limit's 12 seats run
			running = 12
		}
		tl.points = append(tl.points, point{T: float64(i) / 2, Done: i * 10, Running: running, Cores: map[string]float64{"aurora": float64(100 - i)}, Waiting: w, fresh: true})
	}
	ps := tl.phases()
	if len(ps) != 2 || ps[0].h.Reason != explain.Capacity || ps[1].h != lim || ps[1].limitSeats != 12 || ps[1].to != 40 {
		t.Fatalf("phases %+v", ps)
	}
	var out bytes.Buffer
	writeStory(&out, tl, prometheus.NewRegistry(), "")
	for _, want := range []string{"capacity: up to 2000 frames", "limit spi-nuke-license (12 seats) held up to 700 frames",
		"   10s-  30s", "while other layers kept the farm busy", "   30s-  40s  the last 10 s: only the 12 seats of limit spi-nuke-license ran"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("story lacks %q:\n%s", want, out.String())
		}
	}
	var img bytes.Buffer
	if err := writeChart(&img, tl, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Fatal(err)
	}
}
