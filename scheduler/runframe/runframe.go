// Package runframe builds the rqd.RunFrame a dispatcher sends to RQD's
// LaunchFrame, as Cuebot's prepareRqdRunFrame does (rqd-protocol §4, §6).
//
//   - resource_id is the proc's UUID; job, layer and frame ids are the
//     database's UUID strings (RQD parses them as UUIDs).
//   - num_cores is the reservation in centicores, always a multiple of 100;
//     soft/hard memory limits are the reserved memory in KB times the
//     configured factors (1.6 / 2.0), truncated as Cuebot does.
//   - os is the job's OS (job.str_os, "" when NULL), as Cuebot sends
//     proc.os, which it copies from the dispatch frame's job.str_os. It is
//     never the host's advertised list (host_stat.str_os, "centos7,rocky9"):
//     a Docker-mode RQD picks its container image by this exact key and
//     fails the frame (InvalidFrameOsError) for a key it has no image for.
//   - uid is sent only when the job has a positive uid: RQDs refuse a
//     present uid <= 0, and an absent uid means "RQD's default user".
//     Deliberate difference: Cuebot sends any non-NULL int_uid, 0 included,
//     which such an RQD refuses; here 0 and negatives are omitted.
//   - ignore_nimby is false: Cuebot sets it only for its local (desktop)
//     dispatch, which cuesched does not do.
//   - The command has its #TOKENS# replaced in Cuebot's order; the
//     environment is the job env overlaid by the layer env, then the CUE_*
//     variables (which win over user values).
//
// Building never fails: a frame name without a number falls back to the
// frame's int_number, and an unparseable layer range gives a one-frame
// chunk. A frame Cuebot accepted is therefore never stuck in a dispatch
// loop because of its name.
package runframe

import (
	"strconv"
	"strings"
	"time"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/scheduler/framespec"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// Limits are the memory-limit factors (queue.frame_memory_soft_limit and
// frame_memory_hard_limit).
type Limits struct {
	Soft, Hard float64
	// CoreUnit is one core in centicores (100).
	CoreUnit int64
}

// Params is one frame's launch.
type Params struct {
	ProcID string
	Layer  *jobs.Layer
	Frame  jobs.Frame
	Res    sizing.Reservation
	Now    time.Time
}

// FrameNumber is the number before the first '-' of a frame name, else
// fallback.
func FrameNumber(name string, fallback int64) int64 {
	head, _, _ := strings.Cut(name, "-")
	if n, err := strconv.ParseInt(head, 10, 64); err == nil {
		return n
	}
	return fallback
}

// Build returns the RunFrame for p.
func (lim Limits) Build(p Params) *rqdpb.RunFrame {
	unit := lim.CoreUnit
	if unit <= 0 {
		unit = 100
	}
	l, f := p.Layer, p.Frame
	num := FrameNumber(f.Name, f.Number)
	chunk, err := framespec.ChunkOf(l.Range, num, l.ChunkSize)
	if err != nil {
		chunk = framespec.Chunk{Frames: []int64{num}, Spec: strconv.FormatInt(num, 10), End: num}
	}
	numStr := strconv.FormatInt(num, 10)
	zframe := numStr
	if num >= 0 && len(zframe) < 4 {
		zframe = strings.Repeat("0", 4-len(zframe)) + zframe
	}
	cmd := l.Command
	for _, r := range [][2]string{
		{"#ZFRAME#", zframe},
		{"#IFRAME#", numStr},
		{"#FRAME_START#", numStr},
		{"#FRAME_END#", strconv.FormatInt(chunk.End, 10)},
		{"#FRAME_CHUNK#", strconv.Itoa(l.ChunkSize)},
		{"#LAYER#", l.Name},
		{"#JOB#", l.JobName},
		{"#FRAMESPEC#", chunk.Spec},
		{"#FRAME#", f.Name},
	} {
		cmd = strings.ReplaceAll(cmd, r[0], r[1])
	}

	threads := max(p.Res.Cores/unit, 1)
	env := make(map[string]string, len(l.Env)+20)
	for k, v := range l.Env {
		env[k] = v
	}
	threadable := "0"
	if l.Threadable {
		threadable = "1"
	}
	for k, v := range map[string]string{
		"CUE3":           "1",
		"CUE_THREADS":    strconv.FormatInt(threads, 10),
		"CUE_MEMORY":     strconv.FormatInt(p.Res.MemKB, 10),
		"CUE_GPUS":       strconv.FormatInt(p.Res.GPUs, 10),
		"CUE_GPU_MEMORY": strconv.FormatInt(p.Res.GPUMemKB, 10),
		"CUE_LOG_PATH":   l.LogDir,
		"CUE_RANGE":      l.Range,
		"CUE_CHUNK":      strconv.Itoa(l.ChunkSize),
		"CUE_IFRAME":     numStr,
		"CUE_LAYER":      l.Name,
		"CUE_JOB":        l.JobName,
		"CUE_FRAME":      f.Name,
		"CUE_SHOW":       l.ShowName,
		"CUE_SHOT":       l.Shot,
		"CUE_USER":       l.User,
		"CUE_JOB_ID":     l.JobID,
		"CUE_LAYER_ID":   l.ID,
		"CUE_FRAME_ID":   f.ID,
		"CUE_THREADABLE": threadable,
	} {
		env[k] = v
	}

	rf := &rqdpb.RunFrame{
		ResourceId:      p.ProcID,
		JobId:           l.JobID,
		JobName:         l.JobName,
		FrameId:         f.ID,
		FrameName:       f.Name,
		LayerId:         l.ID,
		Command:         cmd,
		UserName:        l.User,
		LogDir:          l.LogDir,
		Show:            l.ShowName,
		Shot:            l.Shot,
		StartTime:       p.Now.UnixMilli(),
		NumCores:        int32(p.Res.Cores),
		NumGpus:         int32(p.Res.GPUs),
		Environment:     env,
		Os:              l.OS,
		SoftMemoryLimit: int64(float64(p.Res.MemKB) * lim.Soft),
		HardMemoryLimit: int64(float64(p.Res.MemKB) * lim.Hard),
		LokiUrl:         l.LokiURL,
	}
	if l.UID != nil && *l.UID > 0 {
		uid := *l.UID
		rf.Uid = &uid
	}
	return rf
}
