package promread_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/testkit/promread"
)

func TestValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c_total", Help: "c"})
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "v_total", Help: "v"}, []string{"a", "b"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"})
	reg.MustRegister(c, v, g, h)
	c.Add(2)
	v.WithLabelValues("x", "1").Add(3)
	v.WithLabelValues("x", "2").Add(4)
	v.WithLabelValues("y", "1").Add(5)
	g.Set(-1.5)
	h.Observe(1)
	h.Observe(2)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"c_total", nil, 2},
		{"v_total", nil, 12},
		{"v_total", []string{"a", "x"}, 7},
		{"v_total", []string{"a", "x", "b", "2"}, 4},
		{"v_total", []string{"b", "1"}, 8},
		{"g", nil, -1.5},
		{"h_seconds", nil, 2},
	} {
		if got := promread.Value(t, reg, tc.name, tc.labels...); got != tc.want {
			t.Errorf("Value(%s, %q) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

func TestValueOr0(t *testing.T) {
	reg := prometheus.NewRegistry()
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "v_total", Help: "v"}, []string{"a"})
	reg.MustRegister(v)
	if got := promread.ValueOr0(t, reg, "v_total"); got != 0 {
		t.Errorf("ValueOr0 of a counter with no series = %v, want 0", got)
	}
	v.WithLabelValues("x").Add(3)
	if got := promread.ValueOr0(t, reg, "v_total"); got != 3 {
		t.Errorf("ValueOr0 = %v, want 3", got)
	}
	if got := promread.ValueOr0(t, reg, "v_total", "a", "y"); got != 0 {
		t.Errorf("ValueOr0 of a label value with no series = %v, want 0", got)
	}
}
