package runframe

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

func layer() *jobs.Layer {
	return &jobs.Layer{
		ID: uuid.NewString(), Name: "test_layer", JobID: uuid.NewString(), JobName: "test_job",
		ShowName: "show", Shot: "sh010", User: "artist", LogDir: "/logs/test_job", OS: "rocky9",
		Command: "render #ZFRAME# #IFRAME# #FRAME_START# #FRAME_END# #FRAME_CHUNK# #LAYER# #JOB# #FRAMESPEC# #FRAME#",
		Range:   "1-10", ChunkSize: 3, Shape: sizing.Shape{Threadable: true},
		Env: map[string]string{"USER_VAR": "x", "CUE_THREADS": "999"},
	}
}

func TestBuild(t *testing.T) {
	l := layer()
	f := jobs.Frame{ID: uuid.NewString(), Name: "0005-test_layer", Number: 5}
	res := sizing.Reservation{Cores: 400, MemKB: 1000, GPUs: 1, GPUMemKB: 50}
	now := time.UnixMilli(1_700_000_000_123)
	proc := uuid.NewString()
	rf := Limits{Soft: 1.6, Hard: 2.0}.Build(Params{ProcID: proc, Layer: l, Frame: f, Res: res, Now: now})

	if want := "render 0005 5 5 7 3 test_layer test_job 5-7 0005-test_layer"; rf.Command != want {
		t.Errorf("command = %q, want %q", rf.Command, want)
	}
	if rf.ResourceId != proc || rf.FrameId != f.ID || rf.JobId != l.JobID || rf.LayerId != l.ID {
		t.Errorf("ids = %q %q %q %q", rf.ResourceId, rf.FrameId, rf.JobId, rf.LayerId)
	}
	if rf.NumCores != 400 || rf.NumGpus != 1 || rf.SoftMemoryLimit != 1600 || rf.HardMemoryLimit != 2000 {
		t.Errorf("resources = cores %d gpus %d soft %d hard %d", rf.NumCores, rf.NumGpus, rf.SoftMemoryLimit, rf.HardMemoryLimit)
	}
	if rf.StartTime != now.UnixMilli() || rf.Os != "rocky9" || rf.Uid != nil || rf.UserName != "artist" || rf.LogDir != "/logs/test_job" {
		t.Errorf("fields: start %d os %q uid %v user %q logdir %q", rf.StartTime, rf.Os, rf.Uid, rf.UserName, rf.LogDir)
	}
	want := map[string]string{
		"CUE3": "1", "CUE_THREADS": "4", "CUE_MEMORY": "1000", "CUE_GPUS": "1", "CUE_GPU_MEMORY": "50",
		"CUE_LOG_PATH": "/logs/test_job", "CUE_RANGE": "1-10", "CUE_CHUNK": "3", "CUE_IFRAME": "5",
		"CUE_LAYER": "test_layer", "CUE_JOB": "test_job", "CUE_FRAME": "0005-test_layer", "CUE_SHOW": "show",
		"CUE_SHOT": "sh010", "CUE_USER": "artist", "CUE_JOB_ID": l.JobID, "CUE_LAYER_ID": l.ID,
		"CUE_FRAME_ID": f.ID, "CUE_THREADABLE": "1", "USER_VAR": "x",
	}
	for k, v := range want {
		if rf.Environment[k] != v {
			t.Errorf("env %s = %q, want %q", k, rf.Environment[k], v)
		}
	}
	if len(rf.Environment) != len(want) {
		t.Errorf("env has %d keys, want %d: %v", len(rf.Environment), len(want), rf.Environment)
	}
}

func TestBuildUIDAndFallbacks(t *testing.T) {
	l := layer()
	zero := int32(0)
	l.UID = &zero
	l.Range = "garbage"
	l.ChunkSize = 1
	rf := Limits{Soft: 1.6, Hard: 2}.Build(Params{ProcID: "p", Layer: l, Frame: jobs.Frame{Name: "weird", Number: 12}, Res: sizing.Reservation{Cores: 100}})
	if rf.Uid != nil {
		t.Errorf("uid 0 was sent: %v", *rf.Uid)
	}
	if rf.Environment["CUE_IFRAME"] != "12" || rf.Environment["CUE_THREADS"] != "1" {
		t.Errorf("fallback frame number/threads: %v", rf.Environment)
	}
	uid := int32(4242)
	l.UID = &uid
	l.ChunkSize = 4
	rf = Limits{Soft: 1.6, Hard: 2}.Build(Params{Layer: l, Frame: jobs.Frame{Name: "0003-x", Number: 3}, Res: sizing.Reservation{Cores: 100}})
	if rf.Uid == nil || *rf.Uid != 4242 {
		t.Errorf("uid = %v, want 4242", rf.Uid)
	}
	if rf.Command == "" || rf.Environment["CUE_IFRAME"] != "3" {
		t.Errorf("bad range must not break the build: %q %v", rf.Command, rf.Environment["CUE_IFRAME"])
	}
}
