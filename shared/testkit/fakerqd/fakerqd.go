// Package fakerqd is a TEST DOUBLE for OpenCue's RQD (render host daemon).
// It is not production code and must only be imported from tests and test
// tools.
//
// One Server is a single gRPC server (on a free 127.0.0.1 port unless
// Config.Listen names an address) that serves
// rqd.RqdInterface for any number of render hosts. A real dispatcher dials
// "<host name>:8444" for every host; to aim all of those connections at one
// fake, dial Server.Resolve(hostName) (which is simply Server.Addr()) and
// name the host in every call in one of two ways:
//
//  1. gRPC metadata: send HostMetadataKey ("x-cuesched-host") with the
//     host name. cuesched's dispatcher sends this header on every RQD call;
//     real RQDs ignore it. WithHost adds it to a context for hand-written
//     clients.
//  2. The :authority header: when no x-cuesched-host metadata is present the
//     fake takes the host part of :authority, which is the name the client
//     dialed. It works when the client dials the host name through
//     Server.DialContext (grpc.WithContextDialer with a "passthrough:///"
//     target) or sets grpc.WithAuthority(hostName). A call without metadata
//     whose :authority is a loopback address or "localhost" (as when
//     dialing Addr directly) is refused with INVALID_ARGUMENT, since the
//     host cannot be known.
//
// What happens on each host is set by a Behavior, globally (Config.Default,
// SetDefault) or per host (Config.Hosts, SetHost): the frame run time, and
// failure modes (refuse the launch, be unreachable, answer garbage, exit
// non-zero, be OOM-killed). Accepted frames "run" for their run time, then
// Config.OnComplete receives a FrameCompletion, which includes the
// FrameCompleteReport a real RQD would send to the scheduler.
//
// Like the real RQDs, the fake refuses a launch with INVALID_ARGUMENT when
// run_frame or frame_id is missing, when uid is present but <= 0, when
// num_cores is <= 0 or not a multiple of 100, or when the same frame_id is
// already running on that host. KillRunningFrame answers NOT_FOUND for a
// frame that is not running there and FAILED_PRECONDITION for an empty kill
// message.
//
// Every LaunchFrame call is recorded (Launches), and DoubleLaunches lists
// the frames that were started while another copy of them was still running
// on some host, the double-render bug a scheduler must never have.
package fakerqd

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"math"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/cuesched/cuesched/proto/hostpb"
	"github.com/cuesched/cuesched/proto/reportpb"
	"github.com/cuesched/cuesched/proto/rqdpb"
)

// HostMetadataKey is the gRPC metadata key naming the render host a call is
// meant for. cuesched's dispatcher sends it on every call to an RQD.
const HostMetadataKey = "x-cuesched-host"

// WithHost returns ctx with outgoing metadata naming host, for clients that
// call the fake directly.
func WithHost(ctx context.Context, host string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, HostMetadataKey, host)
}

// Mode selects how a host treats the calls it receives.
type Mode int

const (
	// Succeed accepts launches; frames exit with status 0 after their run
	// time.
	Succeed Mode = iota
	// RefuseLaunch answers LaunchFrame with the error code RefuseCode
	// (ABORTED by default). Other calls work normally.
	RefuseLaunch
	// Unreachable answers every call for the host with UNAVAILABLE, as a
	// client sees it when the host is down.
	Unreachable
	// Garbage answers every call for the host with bytes that do not
	// decode, so the client's call fails (grpc-go reports INTERNAL).
	Garbage
	// ExitNonZero accepts launches; frames end with ExitStatus (1 by
	// default) after their run time.
	ExitNonZero
	// OOM accepts launches; frames end after their run time as if killed
	// for using too much memory: exit status ExitStatus (1 by default),
	// signal ExitSignal (9 by default) and a max RSS above the frame's hard
	// memory limit.
	OOM
)

func (m Mode) String() string {
	switch m {
	case Succeed:
		return "Succeed"
	case RefuseLaunch:
		return "RefuseLaunch"
	case Unreachable:
		return "Unreachable"
	case Garbage:
		return "Garbage"
	case ExitNonZero:
		return "ExitNonZero"
	case OOM:
		return "OOM"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Default host size reported by ReportStatus when Behavior leaves it zero.
const (
	DefaultCores    = 64
	DefaultMemoryKB = 256 << 20 // 256 GiB
)

// Behavior configures one host (or all hosts without their own Behavior).
// The zero value accepts every valid launch and completes it at once with
// exit status 0.
type Behavior struct {
	Mode Mode

	// RunTime is how long an accepted frame runs. RunTimeFunc, when set,
	// overrides it per frame.
	RunTime     time.Duration
	RunTimeFunc func(*rqdpb.RunFrame) time.Duration

	// RefuseCode is the status code for RefuseLaunch; ABORTED when zero.
	RefuseCode codes.Code
	// ExitStatus and ExitSignal override the outcome of ExitNonZero (status
	// 1, signal 0) and OOM (status 1, signal 9) when non-zero. Use signal 33
	// to model an RQD-initiated memory kill.
	ExitStatus int32
	ExitSignal int32

	// StartDespiteError makes RefuseLaunch, Unreachable and Garbage hosts
	// start the frame anyway while the client still sees the error: the
	// "reply lost after the RQD accepted the frame" case. The frame then
	// completes with exit status 0.
	StartDespiteError bool

	// LaunchDelay holds every LaunchFrame this long before it is decided
	// (a slow RQD or a loaded machine): the frame starts, and the call
	// returns, after it (or fails with the caller's deadline).
	LaunchDelay time.Duration

	// MaxRSSFunc gives the max RSS (KB) reported for a frame. By default a
	// frame uses half its hard memory limit (the dispatcher sets the hard
	// limit to twice the reserved memory); OOM frames always report more
	// than their hard limit.
	MaxRSSFunc func(*rqdpb.RunFrame) int64

	// Cores (whole cores) and MemoryKB describe the host in ReportStatus;
	// zero means DefaultCores / DefaultMemoryKB. When Cores is set
	// explicitly, LaunchFrame also refuses (ABORTED) a frame that does not
	// fit in the idle cores, like a real RQD; with Cores zero any number of
	// cores may be booked.
	Cores    int32
	MemoryKB int64

	// MemoryGuard makes the host's physical memory (MemoryKB, or
	// DefaultMemoryKB) real: a frame uses its max RSS (MaxRSSFunc) from
	// the moment it starts, and when a launch takes the sum of the
	// running frames' RSS past the host's memory, the frame furthest over
	// its booking (RSS minus booked memory, the RunFrame's CUE_MEMORY or
	// else its soft limit) is killed, again until the sum fits, as the
	// kernel's OOM killer and Cuebot's memory guard (a host under memory
	// pressure) do. A killed frame completes at once as RQD reports a
	// killed process (status 1, signal 9) with its max RSS, and
	// FrameCompletion.MemoryKilled set: the caller stands in for Cuebot,
	// which marks the frame's exit status 33 (memory failure) before
	// sending the kill.
	MemoryGuard bool
	// PeakAt is when a guarded frame reaches its max RSS, as a fraction of
	// its run time (0: at once); before it the frame counts no memory
	// against the host. A frame that reaches its peak on a host past its
	// memory is where a real kill happens: partway through the render.
	PeakAt float64
}

// Config is the initial configuration of a Server.
type Config struct {
	// Default applies to every host without an entry in Hosts.
	Default Behavior
	// Hosts holds per-host behaviours.
	Hosts map[string]Behavior
	// TLS, when set, serves gRPC over TLS (an RQD behind TLS).
	TLS *tls.Config
	// OnComplete, if set, is called once for every frame that was started
	// and has ended, normally or by KillRunningFrame. It runs on its own
	// goroutine (possibly several at once) without any lock held, so it
	// may call back into the Server. Frames still running when Stop is
	// called never complete.
	OnComplete func(FrameCompletion)
	// OnLaunch, if set, is called once for every LaunchFrame call, refused
	// ones included, after the answer is decided and before it is sent. It
	// runs on the call's goroutine without any lock held; a frame that runs
	// for no time may complete before OnLaunch is called.
	OnLaunch func(Launch)
	// Listen is the TCP address to serve on; empty means a free port on
	// 127.0.0.1.
	Listen string
	// NoHistory keeps Launches and Completions empty, for a long-running
	// fake whose history would only grow (DoubleLaunches still works).
	NoHistory bool
	// HistoryLimit, when positive, keeps only the latest HistoryLimit
	// launches and completions (0: all of them, unless NoHistory).
	HistoryLimit int
	// Capacity, when set, gives a host's cores (centicores) and GPUs, for
	// the over-booking check of every launch (Overbooked). It does not
	// refuse anything (Behavior.Cores does that); ok false skips the host.
	Capacity func(host string) (centicores, gpus int32, ok bool)
}

// Totals are what the fake's frames hold across the farm right now, kept
// as frames start and end (no walk of the running frames).
type Totals struct {
	Frames     int
	Centicores int64
	GPUs       int64
	// Launched and Ended count the frames started and ended since Start.
	Launched, Ended int64
}

// Overbooking is a launch that took its host past the cores or GPUs that
// Config.Capacity gives.
type Overbooking struct {
	Host, FrameID             string
	At                        time.Time
	Centicores, CapCenticores int32
	GPUs, CapGPUs             int32
}

// Launch records one LaunchFrame call.
type Launch struct {
	// Host the call was for; empty if it could not be determined.
	Host string
	// RunFrame is the request's frame (nil if the request had none),
	// shared with the running frame. Do not modify it.
	RunFrame *rqdpb.RunFrame
	At       time.Time
	// Code is the status code the client was sent (codes.OK on success;
	// Garbage hosts record codes.Internal).
	Code codes.Code
	// Started reports whether the frame was started and will complete.
	Started bool
}

// FrameCompletion describes a frame that ended on a fake host.
type FrameCompletion struct {
	Host       string
	FrameID    string
	FrameName  string
	ResourceID string
	JobID      string
	JobName    string
	LayerID    string
	ExitStatus int32
	ExitSignal int32
	// RunTime is the configured run time, or the time until the kill.
	RunTime  time.Duration
	MaxRSSKB int64
	// NumCores is in centicores, as in RunFrame.
	NumCores int32
	NumGPUs  int32
	// Killed is set when KillRunningFrame ended the frame; KillMessage is
	// the reason given.
	Killed      bool
	KillMessage string
	// MemoryKilled is set when the host's memory guard (Behavior.
	// MemoryGuard) killed the frame.
	MemoryKilled bool
	// Report is the FrameCompleteReport a real RQD would send for this
	// frame.
	Report *reportpb.FrameCompleteReport
}

type frameKey struct{ host, frameID string }

// hostFrames are the frames running on one host and what they book, kept
// as frames start and end so that a launch or a report costs the frames of
// its host, not those of the whole farm.
type hostFrames struct {
	frames map[string]*runningFrame // by frame id
	cores  int32                    // centicores booked
	gpus   int32
	memKB  int64 // resident memory reported
	rssKB  int64 // actual resident memory (max RSS of every frame)
}

// memUse is what a frame counts against its host's free memory.
func (f *runningFrame) memUse() int64 { return min(f.maxRSS, f.rf.GetHardMemoryLimit()) }

type runningFrame struct {
	host       string
	rf         *rqdpb.RunFrame
	started    time.Time
	runTime    time.Duration
	maxRSS     int64
	rssNow     int64 // what it counts against a guarded host: 0 before its peak, then maxRSS
	exitStatus int32
	exitSignal int32
	due        time.Time // started + runTime
	slot       int       // index in Server.ends, -1 when not there
}

// bookedKB is the memory the frame was booked with: CUE_MEMORY, as the
// dispatcher sets it, or else its soft memory limit.
func (f *runningFrame) bookedKB() int64 {
	if v, ok := f.rf.GetEnvironment()["CUE_MEMORY"]; ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return f.rf.GetSoftMemoryLimit()
}

// Server is the fake RQD. Create it with Start and release it with Stop.
type Server struct {
	lis        net.Listener
	grpc       *grpc.Server
	onComplete func(FrameCompletion)
	onLaunch   func(Launch)
	noHistory  bool
	histLimit  int
	capacity   func(string) (int32, int32, bool)
	bootTime   time.Time
	serveErr   chan error
	wake       chan struct{} // the ender re-arms its timer
	quit       chan struct{} // closed by Stop
	enderDone  chan struct{}

	mu          sync.Mutex
	def         Behavior
	hosts       map[string]Behavior
	running     map[frameKey]*runningFrame
	onHost      map[string]*hostFrames // the running frames of each host, with their sums
	copies      map[string]int         // frame id -> number of running copies
	doubles     map[string]struct{}    // see DoubleLaunches
	launches    []Launch
	completions []FrameCompletion
	ends        ends // running frames by end time (timers.go)
	totals      Totals
	overbooked  []Overbooking // the first few (see Overbooked)
	overCount   int
	memKills    int // frames the memory guard killed
	overcommits int // launches that took a guarded host past its memory
	stopped     bool
	callbacks   sync.WaitGroup // OnComplete calls in flight
}

// Start listens on Config.Listen (default a free 127.0.0.1 port) and serves
// until Stop.
func Start(cfg Config) (*Server, error) {
	addr := cfg.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakerqd: listen on %s: %w", addr, err)
	}
	s := &Server{
		lis:        lis,
		onComplete: cfg.OnComplete,
		onLaunch:   cfg.OnLaunch,
		noHistory:  cfg.NoHistory,
		histLimit:  cfg.HistoryLimit,
		capacity:   cfg.Capacity,
		bootTime:   time.Now(),
		serveErr:   make(chan error, 1),
		wake:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		enderDone:  make(chan struct{}),
		def:        cfg.Default,
		hosts:      make(map[string]Behavior, len(cfg.Hosts)),
		running:    make(map[frameKey]*runningFrame),
		onHost:     make(map[string]*hostFrames),
		copies:     make(map[string]int),
		doubles:    make(map[string]struct{}),
	}
	for h, b := range cfg.Hosts {
		s.hosts[h] = b
	}
	sopts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(garbageCodec{}),
		grpc.UnaryInterceptor(garbageInterceptor),
		// Accept the keepalive pings clients modelled on the Rust scheduler
		// send every 30 s instead of closing the connection.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
	}
	if cfg.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(sopts...)
	rqdpb.RegisterRqdInterfaceServer(s.grpc, &service{s: s})
	go func() { s.serveErr <- s.grpc.Serve(lis) }()
	go s.ender()
	return s, nil
}

// Addr is the server's listening address ("127.0.0.1:port" by default).
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Resolve maps a render host name to the address to dial for it: always
// Addr. Use it as the dispatcher's host-to-address hook and send the host
// name in HostMetadataKey (or as :authority).
func (s *Server) Resolve(hostName string) string { return s.Addr() }

// DialContext connects to the fake whatever address is asked for. Pass it to
// grpc.WithContextDialer together with a "passthrough:///<host>:<port>"
// target, and the fake learns the host from :authority.
func (s *Server) DialContext(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", s.Addr())
}

// SetDefault replaces the behaviour of hosts without their own. It affects
// later calls; frames already running keep their outcome.
func (s *Server) SetDefault(b Behavior) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.def = b
}

// SetHost sets the behaviour of one host, for later calls.
func (s *Server) SetHost(host string, b Behavior) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hosts[host] = b
}

// ClearHost makes host use the default behaviour again.
func (s *Server) ClearHost(host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.hosts, host)
}

// Launches returns every LaunchFrame call received so far, in order.
func (s *Server) Launches() []Launch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Launch(nil), s.launches...)
}

// DoubleLaunches returns, sorted, the ids of frames that were started while
// the same frame id was still running on some host (any host: a real RQD
// refuses a duplicate on the same host, so the fake does too). Starting a
// frame again after it completed or was killed, as a retry does, is not a
// double launch; count Launches for stricter checks.
func (s *Server) DoubleLaunches() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.doubles))
	for id := range s.doubles {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Running returns copies of the frames running on host, or on all hosts if
// host is empty, ordered by host and frame id.
func (s *Server) Running(host string) []*rqdpb.RunFrame {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rfs []*rqdpb.RunFrame
	for _, f := range s.runningOn(host) {
		rfs = append(rfs, proto.Clone(f.rf).(*rqdpb.RunFrame))
	}
	return rfs
}

// Totals returns what the running frames hold across the farm, in O(1).
func (s *Server) Totals() Totals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.totals
}

// Overbooked returns how many launches took their host past the cores or
// GPUs Config.Capacity gives, and the first few of them.
func (s *Server) Overbooked() (int, []Overbooking) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overCount, append([]Overbooking(nil), s.overbooked...)
}

// appendBounded appends v, keeping at most limit elements (the latest) when
// limit is positive.
func appendBounded[T any](xs []T, v T, limit int) []T {
	xs = append(xs, v)
	if limit > 0 && len(xs) > 2*limit {
		// Drop the oldest half at once: amortized O(1) per append.
		xs = append(xs[:0:0], xs[len(xs)-limit:]...)
	}
	return xs
}

// RunningCount is the number of frames running on all hosts.
func (s *Server) RunningCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// runningOn returns the frames running on host (all hosts if empty),
// ordered by host and frame id. Callers hold s.mu.
func (s *Server) runningOn(host string) []*runningFrame {
	var out []*runningFrame
	if host != "" {
		if h := s.onHost[host]; h != nil {
			for _, f := range h.frames {
				out = append(out, f)
			}
		}
	} else {
		for _, f := range s.running {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].host != out[j].host {
			return out[i].host < out[j].host
		}
		return out[i].rf.GetFrameId() < out[j].rf.GetFrameId()
	})
	return out
}

// MemoryStats returns how many frames the memory guard killed and how many
// launches took a guarded host's actual RSS past its physical memory.
func (s *Server) MemoryStats() (kills, overcommits int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.memKills, s.overcommits
}

// oomVictims picks, on a host whose running frames' RSS exceeds its
// physical memory, the frames to kill: the one furthest over its booking
// (ties: the latest started, then the larger frame id), again until the
// rest fits. Callers hold s.mu.
func (s *Server) oomVictims(host string, memKB int64) []*runningFrame {
	h := s.onHost[host]
	if h == nil || h.rssKB <= memKB {
		return nil
	}
	s.overcommits++
	frames := s.runningOn(host)
	sort.SliceStable(frames, func(i, j int) bool {
		oi, oj := frames[i].rssNow-frames[i].bookedKB(), frames[j].rssNow-frames[j].bookedKB()
		if oi != oj {
			return oi > oj
		}
		if !frames[i].started.Equal(frames[j].started) {
			return frames[i].started.After(frames[j].started)
		}
		return frames[i].rf.GetFrameId() > frames[j].rf.GetFrameId()
	})
	var out []*runningFrame
	left := h.rssKB
	for _, f := range frames {
		if left <= memKB {
			break
		}
		out = append(out, f)
		left -= f.rssNow
	}
	s.memKills += len(out)
	return out
}

// peak makes a running guarded frame use its max RSS and returns the
// frames the guard kills then.
func (s *Server) peak(f *runningFrame, memKB int64) []*runningFrame {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := frameKey{f.host, f.rf.GetFrameId()}
	if s.stopped || s.running[key] != f || f.rssNow == f.maxRSS {
		return nil
	}
	s.onHost[f.host].rssKB += f.maxRSS - f.rssNow
	f.rssNow = f.maxRSS
	return s.oomVictims(f.host, memKB)
}

// memoryKillMessage is the kill reason of a memory-guard kill.
const memoryKillMessage = "fakerqd: host out of memory: killed the frame furthest over its booked memory"

// Completions returns every completion reported so far, in order.
func (s *Server) Completions() []FrameCompletion {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]FrameCompletion(nil), s.completions...)
}

// Stop shuts the server down: frames still running are dropped without a
// completion, in-flight calls may finish (for up to 5 s), and Stop returns
// once every OnComplete call has returned. Calling Stop again is a no-op.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	for k, f := range s.running {
		s.unschedule(f)
		s.remove(k)
	}
	s.mu.Unlock()
	close(s.quit)
	<-s.enderDone

	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
		<-done
	}
	<-s.serveErr
	s.callbacks.Wait()
}

// behavior returns the behaviour in force for host. Callers hold s.mu.
func (s *Server) behavior(host string) Behavior {
	if b, ok := s.hosts[host]; ok {
		return b
	}
	return s.def
}

// hostOf finds the render host a call is for (see the package comment).
func (s *Server) hostOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, h := range md.Get(HostMetadataKey) {
		if h != "" {
			return h, nil
		}
	}
	if auth := md.Get(":authority"); len(auth) > 0 {
		h := auth[0]
		if hp, _, err := net.SplitHostPort(h); err == nil {
			h = hp
		}
		ip := net.ParseIP(h)
		if h != "" && h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return h, nil
		}
	}
	return "", errorf(codes.InvalidArgument,
		"fakerqd: cannot tell which host this call is for: send metadata %q or dial the host name", HostMetadataKey)
}

// finish ends f unless it already ended, records the completion and hands it
// to OnComplete on a new goroutine.
func (s *Server) finish(f *runningFrame, killed bool, killMessage string) {
	s.finishAs(f, killed, false, killMessage)
}

// finishAs is finish; memoryKill marks a kill by the memory guard.
func (s *Server) finishAs(f *runningFrame, killed, memoryKill bool, killMessage string) {
	s.mu.Lock()
	key := frameKey{f.host, f.rf.GetFrameId()}
	if s.stopped || s.running[key] != f {
		s.mu.Unlock()
		return
	}
	s.remove(key)
	s.unschedule(f)

	c := FrameCompletion{
		Host:       f.host,
		FrameID:    f.rf.GetFrameId(),
		FrameName:  f.rf.GetFrameName(),
		ResourceID: f.rf.GetResourceId(),
		JobID:      f.rf.GetJobId(),
		JobName:    f.rf.GetJobName(),
		LayerID:    f.rf.GetLayerId(),
		ExitStatus: f.exitStatus,
		ExitSignal: f.exitSignal,
		RunTime:    f.runTime,
		MaxRSSKB:   f.maxRSS,
		NumCores:   f.rf.GetNumCores(),
		NumGPUs:    f.rf.GetNumGpus(),
	}
	if killed {
		// RQDs kill the process group with SIGKILL and report it as
		// status 1, signal 9.
		c.RunTime = time.Since(f.started)
		c.ExitStatus, c.ExitSignal = 1, 9
		c.Killed, c.KillMessage, c.MemoryKilled = true, killMessage, memoryKill
	}
	info := s.frameInfo(f)
	info.MaxRss, info.Rss = c.MaxRSSKB, c.MaxRSSKB
	c.Report = &reportpb.FrameCompleteReport{
		Host:       s.renderHost(f.host),
		Frame:      info,
		ExitStatus: c.ExitStatus,
		ExitSignal: c.ExitSignal,
		RunTime:    int32(math.Round(c.RunTime.Seconds())),
	}
	if !s.noHistory {
		s.completions = appendBounded(s.completions, c, s.histLimit)
	}
	if s.onComplete == nil {
		s.mu.Unlock()
		return
	}
	s.callbacks.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.callbacks.Done()
		s.onComplete(c)
	}()
}

// add registers a started frame. Callers hold s.mu.
func (s *Server) add(key frameKey, f *runningFrame) {
	if s.copies[key.frameID] > 0 {
		s.doubles[key.frameID] = struct{}{}
	}
	s.copies[key.frameID]++
	s.running[key] = f
	h := s.onHost[key.host]
	if h == nil {
		h = &hostFrames{frames: map[string]*runningFrame{}}
		s.onHost[key.host] = h
	}
	h.frames[key.frameID] = f
	h.cores += f.rf.GetNumCores()
	h.gpus += f.rf.GetNumGpus()
	h.memKB += f.memUse()
	s.totals.Frames++
	s.totals.Launched++
	s.totals.Centicores += int64(f.rf.GetNumCores())
	s.totals.GPUs += int64(f.rf.GetNumGpus())
	if s.capacity != nil {
		if cc, gpus, ok := s.capacity(key.host); ok && (h.cores > cc || h.gpus > gpus) {
			s.overCount++
			if len(s.overbooked) < 8 {
				s.overbooked = append(s.overbooked, Overbooking{Host: key.host, FrameID: key.frameID, At: f.started,
					Centicores: h.cores, CapCenticores: cc, GPUs: h.gpus, CapGPUs: gpus})
			}
		}
	}
	h.rssKB += f.rssNow
}

// remove unregisters a frame that ended. Callers hold s.mu.
func (s *Server) remove(key frameKey) {
	if f := s.running[key]; f != nil {
		h := s.onHost[key.host]
		delete(h.frames, key.frameID)
		h.cores -= f.rf.GetNumCores()
		h.gpus -= f.rf.GetNumGpus()
		h.memKB -= f.memUse()
		s.totals.Frames--
		s.totals.Ended++
		s.totals.Centicores -= int64(f.rf.GetNumCores())
		s.totals.GPUs -= int64(f.rf.GetNumGpus())
		h.rssKB -= f.rssNow
		if len(h.frames) == 0 {
			delete(s.onHost, key.host)
		}
	}
	delete(s.running, key)
	if s.copies[key.frameID]--; s.copies[key.frameID] <= 0 {
		delete(s.copies, key.frameID)
	}
}

// renderHost describes host as its RQD would. Callers hold s.mu.
func (s *Server) renderHost(host string) *reportpb.RenderHost {
	total, booked := s.coreUsage(host)
	mem := s.behavior(host).MemoryKB
	if mem <= 0 {
		mem = DefaultMemoryKB
	}
	used := int64(0)
	if h := s.onHost[host]; h != nil {
		used = h.memKB
	}
	return &reportpb.RenderHost{
		Name:         host,
		NimbyEnabled: false,
		Facility:     "local",
		NumProcs:     1,
		CoresPerProc: total,
		TotalSwap:    8 << 20,
		TotalMem:     mem,
		TotalMcp:     100 << 20,
		FreeSwap:     8 << 20,
		FreeMem:      max(mem-used, 0),
		FreeMcp:      100 << 20,
		Load:         booked,
		BootTime:     int32(s.bootTime.Unix()),
		State:        hostpb.HardwareState_UP,
		Attributes:   map[string]string{"SP_OS": "fake", "hyperthreadingMultiplier": "1"},
	}
}

// coreUsage returns the host's total and booked centicores. Callers hold
// s.mu.
func (s *Server) coreUsage(host string) (total, booked int32) {
	if h := s.onHost[host]; h != nil {
		booked = h.cores
	}
	cores := s.behavior(host).Cores
	if cores <= 0 {
		cores = DefaultCores
	}
	return max(cores*100, booked), booked
}

// frameInfo describes a running frame as its RQD would. Callers hold s.mu.
func (s *Server) frameInfo(f *runningFrame) *reportpb.RunningFrameInfo {
	rss := f.maxRSS
	if hard := f.rf.GetHardMemoryLimit(); hard > 0 {
		rss = min(rss, hard)
	}
	start := f.rf.GetStartTime()
	if start == 0 {
		start = f.started.UnixMilli()
	}
	return &reportpb.RunningFrameInfo{
		ResourceId: f.rf.GetResourceId(),
		JobId:      f.rf.GetJobId(),
		JobName:    f.rf.GetJobName(),
		FrameId:    f.rf.GetFrameId(),
		FrameName:  f.rf.GetFrameName(),
		LayerId:    f.rf.GetLayerId(),
		NumCores:   f.rf.GetNumCores(),
		StartTime:  start,
		MaxRss:     rss,
		Rss:        rss,
		MaxVsize:   rss,
		Vsize:      rss,
		Attributes: maps.Clone(f.rf.GetAttributes()),
		LluTime:    time.Now().Unix(),
		NumGpus:    f.rf.GetNumGpus(),
		MaxPss:     rss,
		Pss:        rss,
	}
}
