// Package framespec parses OpenCue frame-range specs and cuts chunks out of
// them, for the #FRAMESPEC#/#FRAME_END# command tokens and CUE_RANGE.
//
// Syntax (OpenCue's FrameSet): a comma-separated list of ranges, each one of
//
//	N          a single frame (may be negative)
//	A-B        every frame from A to B; descending when A > B
//	A-BxS      every S-th frame from A towards B (S may be negative to walk
//	           a descending range)
//	A-ByS      the frames of A-B that A-BxS leaves out
//	A-B:S      interleaved: A-BxS, then the frames A-Bx(S/2) adds, and so
//	           on down to step 1, each frame once
//
// Frames keep the order the spec gives them. Chunks are rendered compactly:
// runs with a constant step become "A-B" or "A-BxS", other frames are listed.
package framespec

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse expands spec into its frames, in order.
func Parse(spec string) ([]int64, error) {
	var out []int64
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("empty frame range")
	}
	for _, part := range strings.Split(spec, ",") {
		fs, err := parseRange(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("frame range %q: %w", spec, err)
		}
		out = append(out, fs...)
	}
	return out, nil
}

func parseRange(p string) ([]int64, error) {
	if p == "" {
		return nil, fmt.Errorf("empty element")
	}
	// Split "A-B[xys:]S", where A, B and S may carry a leading minus.
	mode := byte(0)
	var stepStr string
	if i := strings.IndexAny(p, "xy:"); i >= 0 {
		mode, stepStr, p = p[i], p[i+1:], p[:i]
	}
	startStr, endStr, isRange := p, "", false
	if i := strings.IndexByte(p[min(1, len(p)):], '-'); i >= 0 {
		startStr, endStr, isRange = p[:i+1], p[i+2:], true
	}
	start, err := strconv.ParseInt(startStr, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad frame number %q", startStr)
	}
	if !isRange {
		if mode != 0 {
			return nil, fmt.Errorf("step %q without a range", stepStr)
		}
		return []int64{start}, nil
	}
	end, err := strconv.ParseInt(endStr, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad frame number %q", endStr)
	}
	dir := int64(1)
	if end < start {
		dir = -1
	}
	step := dir
	if mode != 0 {
		step, err = strconv.ParseInt(stepStr, 10, 64)
		if err != nil || step == 0 {
			return nil, fmt.Errorf("bad step %q", stepStr)
		}
	}
	if (end-start)*step < 0 {
		return nil, fmt.Errorf("step %d walks away from %d-%d", step, start, end)
	}
	if span := (end - start) * dir; span > 10_000_000 {
		return nil, fmt.Errorf("range %d-%d is too large", start, end)
	}
	walk := func(s int64) []int64 {
		var fs []int64
		for f := start; (s > 0 && f <= end) || (s < 0 && f >= end); f += s {
			fs = append(fs, f)
		}
		return fs
	}
	switch mode {
	case 0, 'x':
		return walk(step), nil
	case 'y':
		in := map[int64]bool{}
		for _, f := range walk(step) {
			in[f] = true
		}
		var fs []int64
		for _, f := range walk(dir) {
			if !in[f] {
				fs = append(fs, f)
			}
		}
		return fs, nil
	default: // ':'
		seen := map[int64]bool{}
		var fs []int64
		s := step
		if s < 0 {
			s = -s
		}
		for ; s >= 1; s /= 2 {
			for _, f := range walk(s * dir) {
				if !seen[f] {
					seen[f] = true
					fs = append(fs, f)
				}
			}
		}
		return fs, nil
	}
}

// Chunk is the chunk of a frame: the frames a task starting at that frame
// covers.
type Chunk struct {
	Frames []int64
	// Spec is the compact rendering ("5-7", "5", "1-9x2", "1,4").
	Spec string
	// End is the last frame of the chunk.
	End int64
}

// ChunkOf returns the chunk of size frames of spec that starts at frame
// (truncated at the end of the set). A frame that is not in spec gives a
// one-frame chunk of itself, so a token substitution never fails on data
// Cuebot would have accepted.
func ChunkOf(spec string, frame int64, size int) (Chunk, error) {
	if size <= 1 {
		return Chunk{Frames: []int64{frame}, Spec: strconv.FormatInt(frame, 10), End: frame}, nil
	}
	all, err := Parse(spec)
	if err != nil {
		return Chunk{}, err
	}
	idx := -1
	for i, f := range all {
		if f == frame {
			idx = i
			break
		}
	}
	if idx < 0 {
		return Chunk{Frames: []int64{frame}, Spec: strconv.FormatInt(frame, 10), End: frame}, nil
	}
	fs := all[idx:min(idx+size, len(all))]
	return Chunk{Frames: fs, Spec: Compact(fs), End: fs[len(fs)-1]}, nil
}

// Compact renders frames as a spec that Parse expands back to them.
func Compact(fs []int64) string {
	var parts []string
	for i := 0; i < len(fs); {
		if i+1 >= len(fs) {
			parts = append(parts, strconv.FormatInt(fs[i], 10))
			break
		}
		step := fs[i+1] - fs[i]
		j := i + 1
		for j+1 < len(fs) && fs[j+1]-fs[j] == step {
			j++
		}
		switch {
		case step == 0 || (j == i+1 && step != 1 && step != -1):
			parts = append(parts, strconv.FormatInt(fs[i], 10))
			i++
			continue
		case step == 1 || step == -1:
			parts = append(parts, fmt.Sprintf("%d-%d", fs[i], fs[j]))
		default:
			parts = append(parts, fmt.Sprintf("%d-%dx%d", fs[i], fs[j], step))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
