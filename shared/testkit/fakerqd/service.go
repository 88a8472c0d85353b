package fakerqd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/cuesched/cuesched/proto/reportpb"
	"github.com/cuesched/cuesched/proto/rqdpb"
)

// service implements rqd.RqdInterface on behalf of every fake host. Methods
// it does not implement (Lock, Unlock, ...) answer UNIMPLEMENTED.
type service struct {
	rqdpb.UnimplementedRqdInterfaceServer
	s *Server
}

func errorf(c codes.Code, format string, args ...any) error {
	return status.Errorf(c, format, args...)
}

// errGarbage makes garbageInterceptor answer the call with undecodable bytes.
var errGarbage = errors.New("fakerqd: answer with garbage")

// hostFailure returns the error a host in mode m gives every call, if any.
func hostFailure(host string, m Mode) error {
	switch m {
	case Unreachable:
		return errorf(codes.Unavailable, "fakerqd: host %s is unreachable", host)
	case Garbage:
		return errGarbage
	}
	return nil
}

// call resolves the host of a call and the behaviour in force for it.
func (svc *service) call(ctx context.Context) (string, Behavior, error) {
	host, err := svc.s.hostOf(ctx)
	if err != nil {
		return "", Behavior{}, err
	}
	svc.s.mu.Lock()
	b := svc.s.behavior(host)
	svc.s.mu.Unlock()
	return host, b, nil
}

func (svc *service) LaunchFrame(ctx context.Context, req *rqdpb.RqdStaticLaunchFrameRequest) (*rqdpb.RqdStaticLaunchFrameResponse, error) {
	s := svc.s
	at := time.Now()
	// gRPC decodes a new request for every call and never touches it once
	// the handler returned: the fake keeps the request's frame, no copy.
	rf := req.GetRunFrame()
	host, b, err := svc.call(ctx)
	if err != nil {
		s.record(Launch{RunFrame: rf, At: at, Code: status.Code(err)})
		return nil, err
	}
	if b.LaunchDelay > 0 {
		t := time.NewTimer(b.LaunchDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			err := status.FromContextError(ctx.Err()).Err()
			s.record(Launch{RunFrame: rf, At: at, Code: status.Code(err)})
			return nil, err
		}
		at = time.Now()
	}
	l, reply := s.launch(host, b, rf, at)
	if s.onLaunch != nil {
		s.onLaunch(l)
	}
	if reply != nil {
		return nil, reply
	}
	return &rqdpb.RqdStaticLaunchFrameResponse{}, nil
}

// launch decides a LaunchFrame for host, starts the frame if it runs and
// records the call.
func (s *Server) launch(host string, b Behavior, rf *rqdpb.RunFrame, at time.Time) (Launch, error) {
	reply, start := decide(host, b, rf)
	var f *runningFrame
	if start {
		f = newFrame(host, rf, b, reply != nil, at)
	}

	var victims []*runningFrame
	defer func() {
		// After the lock is released: finish takes it.
		for _, v := range victims {
			s.finishAs(v, true, true, memoryKillMessage)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if f != nil {
		key := frameKey{host, rf.GetFrameId()}
		total, booked := s.coreUsage(host)
		switch {
		case s.stopped:
			f = nil
			if reply == nil {
				reply = errorf(codes.Unavailable, "fakerqd: server is stopping")
			}
		case s.running[key] != nil:
			f = nil
			if reply == nil {
				reply = errorf(codes.InvalidArgument, "fakerqd: frame %s is already running on %s", rf.GetFrameId(), host)
			}
		case b.Cores > 0 && booked+rf.GetNumCores() > total:
			f = nil
			if reply == nil {
				reply = errorf(codes.Aborted, "fakerqd: host %s has %d of %d centicores idle, frame %s needs %d",
					host, total-booked, total, rf.GetFrameId(), rf.GetNumCores())
			}
		default:
			mem := b.MemoryKB
			if mem <= 0 {
				mem = DefaultMemoryKB
			}
			peakIn := time.Duration(float64(f.runTime) * b.PeakAt)
			if !b.MemoryGuard || peakIn <= 0 {
				f.rssNow = f.maxRSS
			}
			s.add(key, f)
			s.schedule(f)
			switch {
			case b.MemoryGuard && peakIn > 0:
				time.AfterFunc(peakIn, func() {
					for _, v := range s.peak(f, mem) {
						s.finishAs(v, true, true, memoryKillMessage)
					}
				})
			case b.MemoryGuard:
				victims = s.oomVictims(host, mem)
			}
		}
	}
	code := status.Code(reply)
	if errors.Is(reply, errGarbage) {
		code = codes.Internal
	}
	l := Launch{Host: host, RunFrame: rf, At: at, Code: code, Started: f != nil}
	if !s.noHistory {
		// Recorded under the lock that started the frame, so the launch
		// is in the history before its completion can be.
		s.launches = appendBounded(s.launches, l, s.histLimit)
	}
	return l, reply
}

// decide returns the error the client will see for a launch on a host with
// behaviour b, and whether the frame runs (before the checks that need the
// server's state).
func decide(host string, b Behavior, rf *rqdpb.RunFrame) (reply error, start bool) {
	invalid := validate(rf)
	switch b.Mode {
	case Unreachable, Garbage:
		return hostFailure(host, b.Mode), b.StartDespiteError && invalid == nil
	}
	if invalid != nil {
		return invalid, false
	}
	if b.Mode == RefuseLaunch {
		c := b.RefuseCode
		if c == codes.OK {
			c = codes.Aborted
		}
		return errorf(c, "fakerqd: host %s refuses frame %s", host, rf.GetFrameId()), b.StartDespiteError
	}
	return nil, true
}

// record keeps l in the history and hands it to OnLaunch.
func (s *Server) record(l Launch) {
	s.mu.Lock()
	if !s.noHistory {
		s.launches = appendBounded(s.launches, l, s.histLimit)
	}
	s.mu.Unlock()
	if s.onLaunch != nil {
		s.onLaunch(l)
	}
}

// validate applies the checks both real RQDs make before accepting a frame.
func validate(rf *rqdpb.RunFrame) error {
	switch {
	case rf == nil:
		return errorf(codes.InvalidArgument, "fakerqd: run_frame is missing")
	case rf.GetFrameId() == "":
		return errorf(codes.InvalidArgument, "fakerqd: frame_id is empty")
	case rf.Uid != nil && rf.GetUid() <= 0:
		return errorf(codes.InvalidArgument, "fakerqd: frame %s: uid is set to %d; leave it unset or use a real uid",
			rf.GetFrameId(), rf.GetUid())
	case rf.GetNumCores() <= 0 || rf.GetNumCores()%100 != 0:
		return errorf(codes.InvalidArgument, "fakerqd: frame %s: num_cores %d must be a positive multiple of 100 (centicores)",
			rf.GetFrameId(), rf.GetNumCores())
	}
	return nil
}

// newFrame decides how a started frame will end. A frame started by a host
// that returned an error (StartDespiteError) always succeeds.
func newFrame(host string, rf *rqdpb.RunFrame, b Behavior, despiteError bool, at time.Time) *runningFrame {
	f := &runningFrame{host: host, rf: rf, started: at, runTime: b.RunTime, slot: -1}
	if b.RunTimeFunc != nil {
		f.runTime = b.RunTimeFunc(rf)
	}
	f.runTime = max(f.runTime, 0)
	if b.MaxRSSFunc != nil {
		f.maxRSS = b.MaxRSSFunc(rf)
	} else {
		f.maxRSS = rf.GetHardMemoryLimit() / 2
	}
	if despiteError {
		return f
	}
	switch b.Mode {
	case ExitNonZero:
		f.exitStatus = orDefault(b.ExitStatus, 1)
		f.exitSignal = b.ExitSignal
	case OOM:
		f.exitStatus = orDefault(b.ExitStatus, 1)
		f.exitSignal = orDefault(b.ExitSignal, 9)
		hard := rf.GetHardMemoryLimit()
		f.maxRSS = max(f.maxRSS, hard+max(hard/10, 1024))
	}
	return f
}

func orDefault(v, def int32) int32 {
	if v != 0 {
		return v
	}
	return def
}

func (svc *service) KillRunningFrame(ctx context.Context, req *rqdpb.RqdStaticKillRunningFrameRequest) (*rqdpb.RqdStaticKillRunningFrameResponse, error) {
	host, b, err := svc.call(ctx)
	if err != nil {
		return nil, err
	}
	if err := hostFailure(host, b.Mode); err != nil {
		return nil, err
	}
	s := svc.s
	s.mu.Lock()
	f := s.running[frameKey{host, req.GetFrameId()}]
	s.mu.Unlock()
	if f == nil {
		return nil, errorf(codes.NotFound, "fakerqd: frame %q is not running on %s", req.GetFrameId(), host)
	}
	if req.GetMessage() == "" {
		return nil, errorf(codes.FailedPrecondition, "fakerqd: a kill message is required")
	}
	// finish ignores a frame that ended meanwhile, so a kill racing with
	// the natural end reports exactly one completion.
	s.finish(f, true, req.GetMessage())
	return &rqdpb.RqdStaticKillRunningFrameResponse{}, nil
}

func (svc *service) ReportStatus(ctx context.Context, _ *rqdpb.RqdStaticReportStatusRequest) (*rqdpb.RqdStaticReportStatusResponse, error) {
	host, b, err := svc.call(ctx)
	if err != nil {
		return nil, err
	}
	if err := hostFailure(host, b.Mode); err != nil {
		return nil, err
	}
	s := svc.s
	s.mu.Lock()
	defer s.mu.Unlock()
	report := &reportpb.HostReport{Host: s.renderHost(host)}
	for _, f := range s.runningOn(host) {
		report.Frames = append(report.Frames, s.frameInfo(f))
	}
	total, booked := s.coreUsage(host)
	report.CoreInfo = &reportpb.CoreDetail{
		TotalCores:  total,
		IdleCores:   total - booked,
		BookedCores: booked,
	}
	return &rqdpb.RqdStaticReportStatusResponse{HostReport: report}, nil
}

func (svc *service) GetRunningFrameStatus(ctx context.Context, req *rqdpb.RqdStaticGetRunningFrameStatusRequest) (*rqdpb.RqdStaticGetRunningFrameStatusResponse, error) {
	host, b, err := svc.call(ctx)
	if err != nil {
		return nil, err
	}
	if err := hostFailure(host, b.Mode); err != nil {
		return nil, err
	}
	s := svc.s
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.running[frameKey{host, req.GetFrameId()}]
	if f == nil {
		return nil, errorf(codes.NotFound, "fakerqd: frame %q is not running on %s", req.GetFrameId(), host)
	}
	return &rqdpb.RqdStaticGetRunningFrameStatusResponse{RunningFrameInfo: s.frameInfo(f)}, nil
}

// garbageReply stands in for a response; garbageCodec encodes it as bytes
// that no protobuf decoder accepts.
type garbageReply struct{}

// A length-delimited field 1 that claims 100 bytes but has 2.
var garbageBytes = []byte{0x0a, 0x64, 0xde, 0xad}

// garbageInterceptor turns errGarbage into a garbage response.
func garbageInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if errors.Is(err, errGarbage) {
		return garbageReply{}, nil
	}
	return resp, err
}

// garbageCodec is the standard protobuf codec, except that it can encode
// garbageReply.
type garbageCodec struct{}

func (garbageCodec) Name() string { return encproto.Name }

func (garbageCodec) Marshal(v any) (mem.BufferSlice, error) {
	if _, ok := v.(garbageReply); ok {
		return mem.BufferSlice{mem.SliceBuffer(append([]byte(nil), garbageBytes...))}, nil
	}
	return protoCodec().Marshal(v)
}

func (garbageCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return protoCodec().Unmarshal(data, v)
}

func protoCodec() encoding.CodecV2 {
	c := encoding.GetCodecV2(encproto.Name)
	if c == nil {
		panic(fmt.Sprintf("fakerqd: gRPC codec %q is not registered", encproto.Name))
	}
	return c
}
