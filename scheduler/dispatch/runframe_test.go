package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// TestRunFrameAsCuebot checks, field by field, the RunFrame the dispatcher
// sends (database rows → jobs.Layers → runframe.Build → LaunchFrame as the
// fake RQD received it) against what Cuebot's prepareRqdRunFrame builds from
// the same rows. The expected values are written from Cuebot's rules, not
// from our code:
//
//   - ids, names, show, shot, user (job.str_user), log dir (job.str_log_dir)
//     and loki url copied from the job, layer and frame rows; resource_id
//     the proc's id;
//   - num_cores the proc's reserved centicores, num_gpus its GPUs;
//   - os the job's str_os (COALESCE to ""), never the host's OS list;
//   - soft/hard memory limits the layer's int_mem_min × 1.6 / × 2.0,
//     truncated (DispatchFrame.setMinMemory);
//   - uid the job's int_uid when not NULL (deliberate difference below);
//   - ignore_nimby only for a local dispatch (never here);
//   - environment: job env, then layer env (layer wins), then the CUE_*
//     variables (they win over both);
//   - command: #ZFRAME#, #IFRAME#, #FRAME_START#, #FRAME_END#, #FRAME_CHUNK#,
//     #LAYER#, #JOB#, #FRAMESPEC#, #FRAME#, replaced in that order;
//   - everything else (temp dirs, log files, gid, attributes, children, pid)
//     left empty: RQD fills or recomputes them.
//
// Deliberate difference: Cuebot sends a present uid of 0 (int_uid = 0),
// which RQD refuses (it will not run a frame as uid <= 0); we omit it so
// RQD runs the frame as its default user. The last part of the test pins
// that.
//
// Every RunFrame field must be listed: a field added to the proto fails the
// test until someone decides what Cuebot sends for it.
func TestRunFrameAsCuebot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	ctx := context.Background()
	// The host advertises two OSes; the job needs one of them.
	host := h.host(farmseed.HostSpec{Cores: 16, MemKB: 64 * farmseed.GB, OS: "centos7,rocky9"})
	const memKB = 3*farmseed.GB + 7 // not a multiple of 5: the limits truncate
	j := h.job(farmseed.JobSpec{Name: "ep01_sh010_comp", UID: 4242, User: "jdoe", Shot: "sh010", LogDir: "/shots/ep01/logs",
		OS: "rocky9", Env: map[string]string{"JOB_ONLY": "j", "BOTH": "job", "CUE_SHOW": "user-job"},
		Layers: []farmseed.LayerSpec{{Name: "comp", Range: "1-10", Chunk: 3, Cores: 2, MemKB: memKB, GPUs: 0,
			Command: "nuke -F #FRAME_START#-#FRAME_END#x1 #ZFRAME# #IFRAME# #FRAME_CHUNK# #LAYER# #JOB# #FRAMESPEC# #FRAME# #IFRAME#",
			Env:     map[string]string{"LAYER_ONLY": "l", "BOTH": "layer", "CUE_THREADS": "99"}}}})
	h.exec(`UPDATE job SET str_loki_url = 'http://loki:3100' WHERE pk_job = $1`, j.ID)
	l := h.layers(j)[0]
	// Frames of a chunked layer start every 3: 1, 4, 7, 10. Book frame 4.
	var frame4 = -1
	for i, f := range l.Frames {
		if f.Number == 4 {
			frame4 = i
		}
	}
	if frame4 < 0 {
		t.Fatalf("no frame 4 among %+v", l.Frames)
	}
	before := time.Now().UnixMilli()
	res := h.d.Dispatch(ctx, l, l.Frames[frame4:frame4+1], host)
	if res.Err != nil || len(res.Dispatched) != 1 {
		t.Fatalf("dispatch = %+v", res)
	}
	after := time.Now().UnixMilli()
	ls := h.fake.Launches()
	if len(ls) != 1 || ls[0].RunFrame == nil {
		t.Fatalf("launches = %+v", ls)
	}
	rf := ls[0].RunFrame

	var procID, frameID string
	var procCores int64
	if err := h.pool.QueryRow(ctx, `SELECT pk_proc, pk_frame, int_cores_reserved FROM proc WHERE pk_layer = $1`, l.ID).
		Scan(&procID, &frameID, &procCores); err != nil {
		t.Fatal(err)
	}
	const frameName = "0004-comp"
	wantEnv := map[string]string{
		"JOB_ONLY": "j", "LAYER_ONLY": "l", "BOTH": "layer",
		"CUE3": "1", "CUE_THREADS": fmt.Sprint(procCores / 100), "CUE_MEMORY": fmt.Sprint(memKB),
		"CUE_GPUS": "0", "CUE_GPU_MEMORY": "0", "CUE_LOG_PATH": "/shots/ep01/logs",
		"CUE_RANGE": "1-10", "CUE_CHUNK": "3", "CUE_IFRAME": "4", "CUE_LAYER": "comp",
		"CUE_JOB": "ep01_sh010_comp", "CUE_FRAME": frameName, "CUE_SHOW": "show", "CUE_SHOT": "sh010",
		"CUE_USER": "jdoe", "CUE_JOB_ID": j.ID, "CUE_LAYER_ID": l.ID, "CUE_FRAME_ID": frameID,
		"CUE_THREADABLE": "1",
	}
	str := func(want string) func(protoreflect.Value) error {
		return func(v protoreflect.Value) error {
			if v.String() != want {
				return fmt.Errorf("%q, want %q", v.String(), want)
			}
			return nil
		}
	}
	num := func(want int64) func(protoreflect.Value) error {
		return func(v protoreflect.Value) error {
			if v.Int() != want {
				return fmt.Errorf("%d, want %d", v.Int(), want)
			}
			return nil
		}
	}
	checks := map[protoreflect.Name]func(protoreflect.Value) error{
		"resource_id": str(procID),
		"job_id":      str(j.ID),
		"job_name":    str("ep01_sh010_comp"),
		"frame_id":    str(frameID),
		"frame_name":  str(frameName),
		"layer_id":    str(l.ID),
		"command":     str("nuke -F 4-6x1 0004 4 3 comp ep01_sh010_comp 4-6 " + frameName + " 4"),
		"user_name":   str("jdoe"),
		"log_dir":     str("/shots/ep01/logs"),
		"show":        str("show"),
		"shot":        str("sh010"),
		"start_time": func(v protoreflect.Value) error {
			if v.Int() < before || v.Int() > after {
				return fmt.Errorf("%d, not within the dispatch [%d, %d]", v.Int(), before, after)
			}
			return nil
		},
		"uid":               num(4242),
		"num_cores":         num(procCores),
		"num_gpus":          num(0),
		"os":                str("rocky9"),
		"soft_memory_limit": num(int64(float64(memKB) * 1.6)),
		"hard_memory_limit": num(int64(float64(memKB) * 2.0)),
		"loki_url":          str("http://loki:3100"),
		"environment": func(v protoreflect.Value) error {
			m := v.Map()
			var bad []string
			m.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				if want, ok := wantEnv[k.String()]; !ok || want != v.String() {
					bad = append(bad, fmt.Sprintf("%s=%q (want %q)", k.String(), v.String(), want))
				}
				return true
			})
			if m.Len() != len(wantEnv) {
				bad = append(bad, fmt.Sprintf("%d keys, want %d", m.Len(), len(wantEnv)))
			}
			if len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "; "))
			}
			return nil
		},
	}
	// Left unset by Cuebot (ignore_nimby is set only by its local dispatch):
	// RQD recomputes or fills them.
	unset := map[protoreflect.Name]bool{"job_temp_dir": true, "frame_temp_dir": true, "log_file": true,
		"log_dir_file": true, "gid": true, "ignore_nimby": true, "attributes": true, "children": true, "pid": true}
	msg := rf.ProtoReflect()
	fields := msg.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if unset[fd.Name()] {
			if msg.Has(fd) {
				t.Errorf("RunFrame.%s = %v, want it unset", fd.Name(), msg.Get(fd))
			}
			continue
		}
		check, ok := checks[fd.Name()]
		if !ok {
			t.Errorf("RunFrame.%s: no expectation; decide what Cuebot sends for it and add it here", fd.Name())
			continue
		}
		if !msg.Has(fd) && fd.HasPresence() {
			t.Errorf("RunFrame.%s is unset", fd.Name())
			continue
		}
		if err := check(msg.Get(fd)); err != nil {
			t.Errorf("RunFrame.%s = %v", fd.Name(), err)
		}
	}
	if procCores != 200 {
		t.Errorf("proc reserved %d centicores, want 200 (the layer's minimum)", procCores)
	}

	// A job without an OS (str_os NULL) sends "", as Cuebot's COALESCE does,
	// whatever the host advertises; a job whose int_uid is 0 sends no uid.
	j2 := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Name: "any", Frames: 1, NotThreadable: true}}})
	h.exec(`UPDATE job SET int_uid = 0 WHERE pk_job = $1`, j2.ID)
	l2 := h.layers(j2)[0]
	if res := h.d.Dispatch(ctx, l2, l2.Frames, host); res.Err != nil || len(res.Dispatched) != 1 {
		t.Fatalf("dispatch = %+v", res)
	}
	var rf2 *rqdpb.RunFrame
	for _, la := range h.fake.Launches() {
		if la.RunFrame.GetLayerId() == l2.ID {
			rf2 = la.RunFrame
		}
	}
	if rf2 == nil {
		t.Fatal("the second job was not launched")
	}
	if rf2.Os != "" || rf2.Uid != nil || rf2.IgnoreNimby || rf2.Environment["CUE_THREADABLE"] != "0" {
		t.Errorf("job without OS, uid 0: os %q uid %v ignore_nimby %v threadable %q", rf2.Os, rf2.Uid, rf2.IgnoreNimby, rf2.Environment["CUE_THREADABLE"])
	}

	// Memory sizing: a frame booked at its layer's history size (or its
	// own retry size) gets that size as CUE_MEMORY and its limits, as
	// Cuebot derives them from the memory it dispatches a frame with; the
	// proc and the frame row record it too.
	j3 := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Name: "sized", Frames: 2, MemKB: 32 * farmseed.GB, NotThreadable: true}}})
	for i, sized := range []struct{ history, retry int64 }{{6*farmseed.GB + 5, 0}, {6*farmseed.GB + 5, 9*farmseed.GB + 3}} {
		l3 := h.layers(j3)[0]
		l3.SizedMemKB, l3.FrameMemKB = sized.history, sized.retry
		want := sized.history
		if sized.retry > 0 {
			want = sized.retry
		}
		if res := h.d.Dispatch(ctx, l3, l3.Frames[:1], host); res.Err != nil || len(res.Dispatched) != 1 {
			t.Fatalf("sized dispatch %d = %+v", i, res)
		}
		var rf3 *rqdpb.RunFrame
		for _, la := range h.fake.Launches() {
			if la.RunFrame.GetFrameId() == l3.Frames[0].ID {
				rf3 = la.RunFrame
			}
		}
		var procMem, frameMem int64
		if err := h.pool.QueryRow(ctx, `SELECT p.int_mem_reserved, f.int_mem_reserved FROM proc p JOIN frame f ON f.pk_frame = p.pk_frame
			WHERE p.pk_frame = $1`, l3.Frames[0].ID).Scan(&procMem, &frameMem); err != nil {
			t.Fatal(err)
		}
		if rf3 == nil || rf3.Environment["CUE_MEMORY"] != fmt.Sprint(want) || rf3.SoftMemoryLimit != int64(float64(want)*1.6) ||
			rf3.HardMemoryLimit != int64(float64(want)*2.0) || procMem != want || frameMem != want {
			t.Errorf("sized frame %d (want %d KB): runframe %v, proc %d, frame %d", i, want, rf3, procMem, frameMem)
		}
	}
}
