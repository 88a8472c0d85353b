// Package promread reads a metric's value from a registry in tests, so a
// test asserts on what /metrics would show.
package promread

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value is the value of the family name summed over its series that carry
// every label pair in labels ("label", "value", ...; none: every series):
// a counter's, gauge's or untyped metric's value, a histogram's or
// summary's count. It fails t when the family is not registered or no
// series matches.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, registered, matched := read(t, g, name, labels)
	if !registered {
		t.Fatalf("metric %s not registered", name)
	}
	if !matched {
		t.Fatalf("metric %s has no series with labels %q", name, labels)
	}
	return v
}

// ValueOr0 is Value of a family that may have no matching series yet (a
// labelled counter nothing has incremented is not gathered): 0 then.
func ValueOr0(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, _, _ := read(t, g, name, labels)
	return v
}

// read sums the family's series carrying labels; registered says whether
// the family was gathered, matched whether any series carried them.
func read(t testing.TB, g prometheus.Gatherer, name string, labels []string) (v float64, registered, matched bool) {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("promread(%s): labels must be pairs, got %q", name, labels)
	}
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if has(m, labels) {
				v += value(m)
				matched = true
			}
		}
		return v, true, matched
	}
	return 0, false, false
}

func has(m *dto.Metric, labels []string) bool {
	for i := 0; i < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount())
	}
	return 0
}
