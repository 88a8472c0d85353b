package framespec

import (
	"fmt"
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		spec string
		want []int64
	}{
		{"5", []int64{5}},
		{"-5", []int64{-5}},
		{"1-5", []int64{1, 2, 3, 4, 5}},
		{"5-1", []int64{5, 4, 3, 2, 1}},
		{"-3--1", []int64{-3, -2, -1}},
		{"1-10x3", []int64{1, 4, 7, 10}},
		{"10-1x-3", []int64{10, 7, 4, 1}},
		{"1-10y3", []int64{2, 3, 5, 6, 8, 9}},
		{"1-10:5", []int64{1, 6, 3, 5, 7, 9, 2, 4, 8, 10}},
		{"1-3, 7, 10-12", []int64{1, 2, 3, 7, 10, 11, 12}},
	}
	for _, c := range cases {
		got, err := Parse(c.spec)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", c.spec, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "a", "1-", "1-5x0", "1-5xq", "5x2", "1-10x-1", "1,,2", "0-999999999"} {
		if got, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, got)
		}
	}
}

func TestCompactRoundTrip(t *testing.T) {
	cases := map[string][]int64{
		"5":         {5},
		"5-7":       {5, 6, 7},
		"1-9x2":     {1, 3, 5, 7, 9},
		"1,4":       {1, 4},
		"7-5":       {7, 6, 5},
		"1-3,10-12": {1, 2, 3, 10, 11, 12},
		"1,2":       {1, 2}, // rendered "1-2"
	}
	for name, fs := range cases {
		s := Compact(fs)
		back, err := Parse(s)
		if err != nil || !slices.Equal(back, fs) {
			t.Errorf("%s: Compact(%v) = %q, which parses to %v, %v", name, fs, s, back, err)
		}
	}
	if s := Compact([]int64{5, 6, 7}); s != "5-7" {
		t.Errorf("Compact(5,6,7) = %q", s)
	}
	if s := Compact([]int64{1, 3, 5, 7, 9}); s != "1-9x2" {
		t.Errorf("Compact(1..9x2) = %q", s)
	}
}

func TestChunkOf(t *testing.T) {
	cases := []struct {
		spec  string
		frame int64
		size  int
		want  string
		end   int64
	}{
		{"1-10", 5, 1, "5", 5},
		{"1-10", 5, 3, "5-7", 7},
		{"1-10", 9, 3, "9-10", 10},
		{"1-100x2,200", 99, 3, "99,200", 200},
		{"1-20x5", 6, 2, "6,11", 11},
		{"1-20x5", 6, 3, "6-16x5", 16},
		{"1-10", 42, 4, "42", 42}, // not in the set: itself
	}
	for _, c := range cases {
		got, err := ChunkOf(c.spec, c.frame, c.size)
		if err != nil || got.Spec != c.want || got.End != c.end {
			t.Errorf("ChunkOf(%q, %d, %d) = %+v, %v; want %q end %d", c.spec, c.frame, c.size, got, err, c.want, c.end)
		}
	}
	if _, err := ChunkOf("junk", 1, 2); err == nil {
		t.Error("ChunkOf on a bad spec did not fail")
	}
}

func ExampleChunkOf() {
	c, _ := ChunkOf("1-100", 11, 5)
	fmt.Println(c.Spec, c.End)
	// Output: 11-15 15
}
