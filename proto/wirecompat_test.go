// Wire-compatibility tests for cuesched's own RQD protocol definitions.
//
// The expected tables below are written by hand from the protocol reference
// (field name, number, wire type as OpenCue's RQDs and Cuebot encode them),
// not derived from our generated code. Each test builds a message with every
// field set, marshals it and walks the raw bytes, so a renumbered field, a
// changed type or a field that was forgotten shows up here.
package proto_test

import (
	"fmt"
	"sort"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cuesched/cuesched/proto/hostpb"
	"github.com/cuesched/cuesched/proto/reportpb"
	"github.com/cuesched/cuesched/proto/rqdpb"
)

// wireField is one expected field: its proto name, number and wire type.
// sub, when set, describes the encoding of the embedded message (or map
// entry) carried in a length-delimited field.
type wireField struct {
	name string
	num  protowire.Number
	typ  protowire.Type
	sub  []wireField
}

const (
	varint = protowire.VarintType
	bytes  = protowire.BytesType
)

// Every map in the protocol is map<string, string> except the deprecated
// CoreDetail.reserved_cores, which no test message sets.
var stringMapEntry = []wireField{
	{"key", 1, bytes, nil},
	{"value", 2, bytes, nil},
}

var (
	statWire = []wireField{
		{"rss", 1, varint, nil},
		{"vsize", 2, varint, nil},
		{"state", 3, bytes, nil},
		{"name", 4, bytes, nil},
		{"pid", 5, bytes, nil},
		{"pss", 6, varint, nil},
	}
	statmWire = []wireField{
		{"rss", 1, varint, nil},
		{"size", 2, varint, nil},
	}
	statusWire = []wireField{
		{"vrss", 1, varint, nil},
		{"vsize", 2, varint, nil},
	}
	procStatsWire = []wireField{
		{"stat", 1, bytes, statWire},
		{"statm", 2, bytes, statmWire},
		{"status", 3, bytes, statusWire},
		{"cmdline", 4, bytes, nil},
		{"start_time", 5, bytes, nil},
	}
	// ChildrenProcStats has no field 1.
	childrenProcStatsWire = []wireField{
		{"children", 2, bytes, procStatsWire},
	}

	runFrameWire = []wireField{
		{"resource_id", 1, bytes, nil},
		{"job_id", 2, bytes, nil},
		{"job_name", 3, bytes, nil},
		{"frame_id", 4, bytes, nil},
		{"frame_name", 5, bytes, nil},
		{"layer_id", 6, bytes, nil},
		{"command", 7, bytes, nil},
		{"user_name", 8, bytes, nil},
		{"log_dir", 9, bytes, nil},
		{"show", 10, bytes, nil},
		{"shot", 11, bytes, nil},
		{"job_temp_dir", 12, bytes, nil},
		{"frame_temp_dir", 13, bytes, nil},
		{"log_file", 14, bytes, nil},
		{"log_dir_file", 15, bytes, nil},
		{"start_time", 16, varint, nil},
		{"uid", 17, varint, nil},
		{"num_cores", 18, varint, nil},
		{"gid", 19, varint, nil},
		{"ignore_nimby", 20, varint, nil},
		{"environment", 21, bytes, stringMapEntry},
		{"attributes", 22, bytes, stringMapEntry},
		{"num_gpus", 23, varint, nil},
		{"children", 24, bytes, childrenProcStatsWire},
		{"os", 25, bytes, nil},
		{"soft_memory_limit", 26, varint, nil},
		{"hard_memory_limit", 27, varint, nil},
		{"pid", 28, varint, nil},
		{"loki_url", 29, bytes, nil},
	}

	launchFrameRequestWire = []wireField{
		{"run_frame", 1, bytes, runFrameWire},
	}

	renderHostWire = []wireField{
		{"name", 1, bytes, nil},
		{"nimby_enabled", 2, varint, nil},
		{"nimby_locked", 3, varint, nil},
		{"facility", 4, bytes, nil},
		{"num_procs", 5, varint, nil},
		{"cores_per_proc", 6, varint, nil},
		{"total_swap", 7, varint, nil},
		{"total_mem", 8, varint, nil},
		{"total_mcp", 9, varint, nil},
		{"free_swap", 10, varint, nil},
		{"free_mem", 11, varint, nil},
		{"free_mcp", 12, varint, nil},
		{"load", 13, varint, nil},
		{"boot_time", 14, varint, nil},
		{"tags", 15, bytes, nil},
		{"state", 16, varint, nil},
		{"attributes", 17, bytes, stringMapEntry},
		{"num_gpus", 18, varint, nil},
		{"free_gpu_mem", 19, varint, nil},
		{"total_gpu_mem", 20, varint, nil},
	}

	runningFrameInfoWire = []wireField{
		{"resource_id", 1, bytes, nil},
		{"job_id", 2, bytes, nil},
		{"job_name", 3, bytes, nil},
		{"frame_id", 4, bytes, nil},
		{"frame_name", 5, bytes, nil},
		{"layer_id", 6, bytes, nil},
		{"num_cores", 7, varint, nil},
		{"start_time", 8, varint, nil},
		{"max_rss", 9, varint, nil},
		{"rss", 10, varint, nil},
		{"max_vsize", 11, varint, nil},
		{"vsize", 12, varint, nil},
		{"attributes", 13, bytes, stringMapEntry},
		{"llu_time", 14, varint, nil},
		{"num_gpus", 15, varint, nil},
		{"max_used_gpu_memory", 16, varint, nil},
		{"used_gpu_memory", 17, varint, nil},
		{"children", 18, bytes, childrenProcStatsWire},
		{"used_swap_memory", 19, varint, nil},
		{"max_pss", 20, varint, nil},
		{"pss", 21, varint, nil},
	}

	frameCompleteReportWire = []wireField{
		{"host", 1, bytes, renderHostWire},
		{"frame", 2, bytes, runningFrameInfoWire},
		{"exit_status", 3, varint, nil},
		{"exit_signal", 4, varint, nil},
		{"run_time", 5, varint, nil},
	}
)

func fullChildren() *reportpb.ChildrenProcStats {
	return &reportpb.ChildrenProcStats{Children: []*reportpb.ProcStats{{
		Stat:      &reportpb.Stat{Rss: 1, Vsize: 2, State: "R", Name: "render", Pid: "4242", Pss: 3},
		Statm:     &reportpb.Statm{Rss: 4, Size: 5},
		Status:    &reportpb.Status{Vrss: 6, Vsize: 7},
		Cmdline:   "render -f 5",
		StartTime: "1700000000",
	}}}
}

func fullRunFrame() *rqdpb.RunFrame {
	return &rqdpb.RunFrame{
		ResourceId: "6f1d1b9e-0d5e-4d57-9a0c-1b6f3f2b7a01",
		JobId:      "0c9a3c1e-7a43-4e1d-8f4b-0b8f0a6f3c02",
		JobName:    "show-shot-user_job",
		FrameId:    "9d6a2f4c-5b1e-4c3a-8e7d-2a1b0c9d8e03",
		FrameName:  "0005-render",
		LayerId:    "3e2d1c0b-9a8f-4e7d-6c5b-4a3f2e1d0c04",
		Command:    "render -s 5 -e 5",
		UserName:   "artist",
		LogDir:     "/shots/show/shot/logs",
		Show:       "show",
		Shot:       "shot",
		//lint:ignore SA1019 the deprecated fields are still on the wire; the test round-trips them
		JobTempDir:   "deprecated",
		FrameTempDir: "/tmp/job/frame",
		//lint:ignore SA1019 see above
		LogFile: "deprecated",
		//lint:ignore SA1019 see above
		LogDirFile:      "deprecated",
		StartTime:       1_700_000_000_000,
		Uid:             proto.Int32(1001),
		NumCores:        200,
		Gid:             20,
		IgnoreNimby:     true,
		Environment:     map[string]string{"CUE_THREADS": "2"},
		Attributes:      map[string]string{"CPU_LIST": "0,1"},
		NumGpus:         1,
		Children:        fullChildren(),
		Os:              "rocky9",
		SoftMemoryLimit: 6_710_886,
		HardMemoryLimit: 8_388_608,
		Pid:             4242,
		LokiUrl:         "http://loki:3100",
	}
}

func fullRenderHost() *reportpb.RenderHost {
	return &reportpb.RenderHost{
		Name:         "render-001",
		NimbyEnabled: true,
		NimbyLocked:  true,
		Facility:     "local",
		NumProcs:     2,
		CoresPerProc: 1600,
		TotalSwap:    1 << 20,
		TotalMem:     64 << 20,
		TotalMcp:     100 << 20,
		FreeSwap:     1 << 19,
		FreeMem:      32 << 20,
		FreeMcp:      50 << 20,
		Load:         150,
		BootTime:     1_700_000_000,
		Tags:         []string{"general"},
		State:        hostpb.HardwareState_REPAIR,
		Attributes:   map[string]string{"SP_OS": "rocky9"},
		NumGpus:      2,
		FreeGpuMem:   8 << 20,
		TotalGpuMem:  16 << 20,
	}
}

func fullRunningFrameInfo() *reportpb.RunningFrameInfo {
	rf := fullRunFrame()
	return &reportpb.RunningFrameInfo{
		ResourceId:       rf.ResourceId,
		JobId:            rf.JobId,
		JobName:          rf.JobName,
		FrameId:          rf.FrameId,
		FrameName:        rf.FrameName,
		LayerId:          rf.LayerId,
		NumCores:         rf.NumCores,
		StartTime:        rf.StartTime,
		MaxRss:           4 << 20,
		Rss:              3 << 20,
		MaxVsize:         5 << 20,
		Vsize:            4 << 20,
		Attributes:       map[string]string{"GPU_LIST": "0"},
		LluTime:          1_700_000_100,
		NumGpus:          1,
		MaxUsedGpuMemory: 2 << 20,
		UsedGpuMemory:    1 << 20,
		Children:         fullChildren(),
		UsedSwapMemory:   1024,
		MaxPss:           4 << 20,
		Pss:              3 << 20,
	}
}

// checkWire walks the encoded message b and checks it against table: every
// field present must be expected with the expected wire type, and every
// expected field must be present (the test messages set all of them).
func checkWire(t *testing.T, path string, b []byte, table []wireField) {
	t.Helper()
	byNum := make(map[protowire.Number]wireField, len(table))
	for _, f := range table {
		byNum[f.num] = f
	}
	seen := make(map[protowire.Number]bool)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("%s: bad tag: %v", path, protowire.ParseError(n))
		}
		b = b[n:]
		want, ok := byNum[num]
		if !ok {
			t.Errorf("%s: unexpected field number %d (wire type %d)", path, num, typ)
		} else if typ != want.typ {
			t.Errorf("%s.%s: field %d has wire type %d, want %d", path, want.name, num, typ, want.typ)
		}
		if ok && typ == protowire.BytesType && want.sub != nil {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				t.Fatalf("%s.%s: bad length-delimited value: %v", path, want.name, protowire.ParseError(m))
			}
			checkWire(t, path+"."+want.name, v, want.sub)
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Fatalf("%s: bad value for field %d: %v", path, num, protowire.ParseError(m))
		}
		b = b[m:]
		seen[num] = true
	}
	for _, f := range table {
		if !seen[f.num] {
			t.Errorf("%s.%s (field %d) was not encoded; is it set in the test message?", path, f.name, f.num)
		}
	}
}

// wireTypeOf is the wire type a (non-packed) field of this kind uses.
func wireTypeOf(fd protoreflect.FieldDescriptor) protowire.Type {
	if fd.IsList() && fd.IsPacked() {
		return protowire.BytesType
	}
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Int64Kind,
		protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	}
	return protowire.StartGroupType
}

// checkDescriptor checks that our message declares exactly the fields of the
// table, by name, number and wire type, recursing into sub-tables. This
// catches fields added to a .proto file without updating the table.
func checkDescriptor(t *testing.T, md protoreflect.MessageDescriptor, table []wireField) {
	t.Helper()
	if got, want := md.Fields().Len(), len(table); got != want {
		t.Errorf("%s declares %d fields, the table has %d", md.FullName(), got, want)
	}
	for _, f := range table {
		fd := md.Fields().ByName(protoreflect.Name(f.name))
		if fd == nil {
			t.Errorf("%s has no field %q", md.FullName(), f.name)
			continue
		}
		if fd.Number() != f.num {
			t.Errorf("%s: number %d, want %d", fd.FullName(), fd.Number(), f.num)
		}
		if wt := wireTypeOf(fd); wt != f.typ {
			t.Errorf("%s: wire type %d, want %d", fd.FullName(), wt, f.typ)
		}
		if f.sub != nil && fd.Message() != nil {
			checkDescriptor(t, fd.Message(), f.sub)
		}
	}
}

func TestWireCompat(t *testing.T) {
	tests := []struct {
		name  string
		msg   proto.Message
		table []wireField
	}{
		{"RunFrame", fullRunFrame(), runFrameWire},
		{"RqdStaticLaunchFrameRequest", &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: fullRunFrame()}, launchFrameRequestWire},
		{"FrameCompleteReport", &reportpb.FrameCompleteReport{
			Host:       fullRenderHost(),
			Frame:      fullRunningFrameInfo(),
			ExitStatus: 1,
			ExitSignal: 9,
			RunTime:    3600,
		}, frameCompleteReportWire},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkDescriptor(t, tc.msg.ProtoReflect().Descriptor(), tc.table)
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			checkWire(t, tc.name, b, tc.table)

			// And the bytes decode back to the same message.
			back := tc.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, tc.msg) {
				t.Errorf("round trip changed the message")
			}
		})
	}
}

// RQDs refuse a frame whose uid is present but <= 0, so presence must be
// explicit: nil is not encoded at all, an explicit 0 is.
func TestRunFrameUIDPresence(t *testing.T) {
	uidEncoded := func(rf *rqdpb.RunFrame) (bool, uint64) {
		b, err := proto.Marshal(rf)
		if err != nil {
			t.Fatal(err)
		}
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			b = b[n:]
			if num == 17 && typ == protowire.VarintType {
				v, _ := protowire.ConsumeVarint(b)
				return true, v
			}
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
		}
		return false, 0
	}
	if ok, _ := uidEncoded(&rqdpb.RunFrame{FrameId: "f"}); ok {
		t.Error("unset uid was encoded")
	}
	if ok, v := uidEncoded(&rqdpb.RunFrame{FrameId: "f", Uid: proto.Int32(0)}); !ok || v != 0 {
		t.Errorf("explicit uid 0: encoded=%v value=%d, want encoded 0", ok, v)
	}
}

func TestGRPCMethodNames(t *testing.T) {
	// full method path -> request, response message full names
	want := map[string][2]string{
		"/rqd.RqdInterface/LaunchFrame":           {"rqd.RqdStaticLaunchFrameRequest", "rqd.RqdStaticLaunchFrameResponse"},
		"/rqd.RqdInterface/KillRunningFrame":      {"rqd.RqdStaticKillRunningFrameRequest", "rqd.RqdStaticKillRunningFrameResponse"},
		"/rqd.RqdInterface/ReportStatus":          {"rqd.RqdStaticReportStatusRequest", "rqd.RqdStaticReportStatusResponse"},
		"/rqd.RqdInterface/GetRunningFrameStatus": {"rqd.RqdStaticGetRunningFrameStatusRequest", "rqd.RqdStaticGetRunningFrameStatusResponse"},
		"/rqd.RqdInterface/Lock":                  {"rqd.RqdStaticLockRequest", "rqd.RqdStaticLockResponse"},
		"/rqd.RqdInterface/LockAll":               {"rqd.RqdStaticLockAllRequest", "rqd.RqdStaticLockAllResponse"},
		"/rqd.RqdInterface/Unlock":                {"rqd.RqdStaticUnlockRequest", "rqd.RqdStaticUnlockResponse"},
		"/rqd.RqdInterface/UnlockAll":             {"rqd.RqdStaticUnlockAllRequest", "rqd.RqdStaticUnlockAllResponse"},

		"/report.RqdReportInterface/ReportRqdStartup":             {"report.RqdReportRqdStartupRequest", "report.RqdReportRqdStartupResponse"},
		"/report.RqdReportInterface/ReportRunningFrameCompletion": {"report.RqdReportRunningFrameCompletionRequest", "report.RqdReportRunningFrameCompletionResponse"},
		"/report.RqdReportInterface/ReportStatus":                 {"report.RqdReportStatusRequest", "report.RqdReportStatusResponse"},
	}

	services := []struct {
		desc grpc.ServiceDesc
		file protoreflect.FileDescriptor
	}{
		{rqdpb.RqdInterface_ServiceDesc, rqdpb.File_proto_rqd_proto},
		{reportpb.RqdReportInterface_ServiceDesc, reportpb.File_proto_report_proto},
	}
	var got []string
	for _, s := range services {
		if len(s.desc.Streams) != 0 {
			t.Errorf("%s: has streaming methods; the protocol is unary only", s.desc.ServiceName)
		}
		sd := s.file.Services().ByName(protoreflect.FullName(s.desc.ServiceName).Name())
		if sd == nil || string(sd.FullName()) != s.desc.ServiceName {
			t.Fatalf("service %s not found in %s", s.desc.ServiceName, s.file.Path())
		}
		for _, m := range s.desc.Methods {
			full := fmt.Sprintf("/%s/%s", s.desc.ServiceName, m.MethodName)
			got = append(got, full)
			io, ok := want[full]
			if !ok {
				t.Errorf("unexpected method %s", full)
				continue
			}
			md := sd.Methods().ByName(protoreflect.Name(m.MethodName))
			if md == nil {
				t.Errorf("%s: missing from the file descriptor", full)
				continue
			}
			if string(md.Input().FullName()) != io[0] || string(md.Output().FullName()) != io[1] {
				t.Errorf("%s: %s -> %s, want %s -> %s", full, md.Input().FullName(), md.Output().FullName(), io[0], io[1])
			}
		}
	}
	if len(got) != len(want) {
		sort.Strings(got)
		t.Errorf("methods = %v, want %d methods", got, len(want))
	}

	// The generated constants the client stubs use.
	for _, c := range []struct{ got, want string }{
		{rqdpb.RqdInterface_LaunchFrame_FullMethodName, "/rqd.RqdInterface/LaunchFrame"},
		{rqdpb.RqdInterface_KillRunningFrame_FullMethodName, "/rqd.RqdInterface/KillRunningFrame"},
		{rqdpb.RqdInterface_ReportStatus_FullMethodName, "/rqd.RqdInterface/ReportStatus"},
		{reportpb.RqdReportInterface_ReportRqdStartup_FullMethodName, "/report.RqdReportInterface/ReportRqdStartup"},
		{reportpb.RqdReportInterface_ReportRunningFrameCompletion_FullMethodName, "/report.RqdReportInterface/ReportRunningFrameCompletion"},
		{reportpb.RqdReportInterface_ReportStatus_FullMethodName, "/report.RqdReportInterface/ReportStatus"},
	} {
		if c.got != c.want {
			t.Errorf("generated method name %q, want %q", c.got, c.want)
		}
	}
}

func TestHardwareStateValues(t *testing.T) {
	want := map[string]int32{"UP": 0, "DOWN": 1, "REBOOTING": 2, "REBOOT_WHEN_IDLE": 3, "REPAIR": 4}
	if len(hostpb.HardwareState_value) != len(want) {
		t.Errorf("HardwareState has %d values, want %d", len(hostpb.HardwareState_value), len(want))
	}
	for name, num := range want {
		if got, ok := hostpb.HardwareState_value[name]; !ok || got != num {
			t.Errorf("HardwareState %s = %d (present %v), want %d", name, got, ok, num)
		}
	}
}
