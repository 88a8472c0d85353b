package fakerqd_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cuesched/cuesched/proto/hostpb"
	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// harness is a fake with a real gRPC client connected over loopback.
type harness struct {
	fake   *fakerqd.Server
	client rqdpb.RqdInterfaceClient
	done   chan fakerqd.FrameCompletion
}

func start(t *testing.T, cfg fakerqd.Config) *harness {
	t.Helper()
	h := &harness{done: make(chan fakerqd.FrameCompletion, 1024)}
	cfg.OnComplete = func(c fakerqd.FrameCompletion) { h.done <- c }
	fake, err := fakerqd.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.fake = fake
	conn, err := grpc.NewClient(fake.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.client = rqdpb.NewRqdInterfaceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		fake.Stop()
	})
	return h
}

func ctxFor(t *testing.T, host string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return fakerqd.WithHost(ctx, host)
}

func newFrame(cores int32) *rqdpb.RunFrame {
	return &rqdpb.RunFrame{
		ResourceId:      uuid.NewString(),
		JobId:           uuid.NewString(),
		JobName:         "testshow-sh01-artist_job",
		FrameId:         uuid.NewString(),
		FrameName:       "0001-render",
		LayerId:         uuid.NewString(),
		Command:         "true",
		UserName:        "artist",
		LogDir:          "/tmp/logs",
		Show:            "testshow",
		Shot:            "sh01",
		StartTime:       time.Now().UnixMilli(),
		NumCores:        cores,
		NumGpus:         0,
		Os:              "linux",
		SoftMemoryLimit: 1_600_000,
		HardMemoryLimit: 2_000_000,
		Environment:     map[string]string{"CUE_THREADS": fmt.Sprint(cores / 100)},
	}
}

func (h *harness) launch(t *testing.T, host string, rf *rqdpb.RunFrame) error {
	t.Helper()
	_, err := h.client.LaunchFrame(ctxFor(t, host), &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: rf})
	return err
}

func (h *harness) mustLaunch(t *testing.T, host string, rf *rqdpb.RunFrame) {
	t.Helper()
	if err := h.launch(t, host, rf); err != nil {
		t.Fatalf("LaunchFrame on %s: %v", host, err)
	}
}

func (h *harness) wait(t *testing.T) fakerqd.FrameCompletion {
	t.Helper()
	select {
	case c := <-h.done:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a frame completion")
	}
	panic("unreachable")
}

func (h *harness) expectNoCompletion(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case c := <-h.done:
		t.Fatalf("unexpected completion of %s on %s", c.FrameID, c.Host)
	case <-time.After(d):
	}
}

func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("status %v (%v), want %v", got, err, want)
	}
}

func TestLaunchRunsAndCompletesPerHost(t *testing.T) {
	h := start(t, fakerqd.Config{Default: fakerqd.Behavior{RunTime: 200 * time.Millisecond}})

	frames := map[string]*rqdpb.RunFrame{}
	for _, host := range []string{"render-01", "render-02", "render-03"} {
		rf := newFrame(200)
		frames[rf.FrameId] = rf
		// LaunchFrame returns while the frame is still running.
		h.mustLaunch(t, host, rf)
		if got := h.fake.Running(host); len(got) != 1 || got[0].FrameId != rf.FrameId {
			t.Errorf("Running(%s) = %v", host, got)
		}
	}

	seenHosts := map[string]bool{}
	for range frames {
		c := h.wait(t)
		rf := frames[c.FrameID]
		if rf == nil {
			t.Fatalf("completion for unknown frame %q", c.FrameID)
		}
		seenHosts[c.Host] = true
		if c.ResourceID != rf.ResourceId || c.JobID != rf.JobId || c.LayerID != rf.LayerId ||
			c.FrameName != rf.FrameName || c.JobName != rf.JobName || c.NumCores != 200 {
			t.Errorf("completion does not echo the RunFrame: %+v", c)
		}
		if c.ExitStatus != 0 || c.ExitSignal != 0 || c.Killed {
			t.Errorf("exit %d signal %d killed %v, want a clean exit", c.ExitStatus, c.ExitSignal, c.Killed)
		}
		if c.RunTime != 200*time.Millisecond || c.MaxRSSKB != rf.HardMemoryLimit/2 {
			t.Errorf("run time %v max rss %d", c.RunTime, c.MaxRSSKB)
		}
		r := c.Report
		if r.GetHost().GetName() != c.Host || r.GetFrame().GetFrameId() != rf.FrameId ||
			r.GetFrame().GetResourceId() != rf.ResourceId || r.GetFrame().GetNumCores() != 200 ||
			r.GetFrame().GetStartTime() != rf.StartTime || r.GetFrame().GetMaxRss() != c.MaxRSSKB {
			t.Errorf("report does not match the frame: %v", r)
		}
	}
	if len(seenHosts) != 3 {
		t.Errorf("completions came from hosts %v", seenHosts)
	}
	if got := h.fake.Running(""); len(got) != 0 {
		t.Errorf("%d frames still running", len(got))
	}
	launches := h.fake.Launches()
	if len(launches) != 3 {
		t.Fatalf("%d launches recorded", len(launches))
	}
	for _, l := range launches {
		if !l.Started || l.Code != codes.OK || l.RunFrame == nil || l.At.IsZero() {
			t.Errorf("launch record %+v", l)
		}
	}
	if d := h.fake.DoubleLaunches(); len(d) != 0 {
		t.Errorf("DoubleLaunches = %v", d)
	}
	if got := len(h.fake.Completions()); got != 3 {
		t.Errorf("Completions() has %d entries", got)
	}
}

func TestHostIdentification(t *testing.T) {
	h := start(t, fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour}})

	// Dialing the host name through the fake's dialer: :authority names
	// the host, no metadata needed.
	conn, err := grpc.NewClient("passthrough:///render-07:8444",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(h.fake.DialContext))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rf := newFrame(100)
	if _, err := rqdpb.NewRqdInterfaceClient(conn).LaunchFrame(ctx, &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: rf}); err != nil {
		t.Fatal(err)
	}
	if got := h.fake.Running("render-07"); len(got) != 1 {
		t.Errorf("frame not running on render-07: %v", h.fake.Launches())
	}

	// Dialing Resolve(host) with an explicit authority.
	conn2, err := grpc.NewClient(h.fake.Resolve("render-08"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("render-08:8444"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	resp, err := rqdpb.NewRqdInterfaceClient(conn2).ReportStatus(ctx, &rqdpb.RqdStaticReportStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetHostReport().GetHost().GetName(); got != "render-08" {
		t.Errorf("host name %q, want render-08", got)
	}

	// Metadata wins over :authority.
	if _, err := rqdpb.NewRqdInterfaceClient(conn).LaunchFrame(fakerqd.WithHost(ctx, "render-09"),
		&rqdpb.RqdStaticLaunchFrameRequest{RunFrame: newFrame(100)}); err != nil {
		t.Fatal(err)
	}
	if got := h.fake.Running("render-09"); len(got) != 1 {
		t.Errorf("metadata host not used: %v", h.fake.Launches())
	}

	// Dialing the fake's own address without metadata: refused.
	_, err = h.client.LaunchFrame(ctx, &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: newFrame(100)})
	wantCode(t, err, codes.InvalidArgument)
	conn3, err := grpc.NewClient(h.fake.Resolve("x"), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn3.Close()
	_, err = rqdpb.NewRqdInterfaceClient(conn3).ReportStatus(ctx, &rqdpb.RqdStaticReportStatusRequest{})
	wantCode(t, err, codes.InvalidArgument)
	if l := h.fake.Launches(); l[len(l)-1].Host != "" || l[len(l)-1].Started {
		t.Errorf("unidentified launch recorded as %+v", l[len(l)-1])
	}
}

func TestLaunchValidation(t *testing.T) {
	h := start(t, fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour}})

	noUID := newFrame(100)
	zeroUID := newFrame(100)
	zeroUID.Uid = proto.Int32(0)
	fractional := newFrame(150)
	noCores := newFrame(0)
	noID := newFrame(100)
	noID.FrameId = ""
	goodUID := newFrame(100)
	goodUID.Uid = proto.Int32(1001)

	wantCode(t, h.launch(t, "h1", nil), codes.InvalidArgument)
	wantCode(t, h.launch(t, "h1", zeroUID), codes.InvalidArgument)
	wantCode(t, h.launch(t, "h1", fractional), codes.InvalidArgument)
	wantCode(t, h.launch(t, "h1", noCores), codes.InvalidArgument)
	wantCode(t, h.launch(t, "h1", noID), codes.InvalidArgument)
	h.mustLaunch(t, "h1", noUID)
	h.mustLaunch(t, "h1", goodUID)

	// The same frame again on the same host is refused, like a real RQD...
	wantCode(t, h.launch(t, "h1", noUID), codes.InvalidArgument)
	if d := h.fake.DoubleLaunches(); len(d) != 0 {
		t.Errorf("refused relaunch counted as a double launch: %v", d)
	}
	// ...but another host knows nothing about it: a double launch.
	h.mustLaunch(t, "h2", noUID)
	if d := h.fake.DoubleLaunches(); len(d) != 1 || d[0] != noUID.FrameId {
		t.Errorf("DoubleLaunches = %v, want [%s]", d, noUID.FrameId)
	}

	var started int
	for _, l := range h.fake.Launches() {
		if l.Started {
			started++
		}
	}
	if n := len(h.fake.Launches()); n != 9 || started != 3 {
		t.Errorf("%d launches recorded, %d started; want 9 and 3", n, started)
	}
}

func TestFailureModes(t *testing.T) {
	tests := []struct {
		name       string
		b          fakerqd.Behavior
		launchCode codes.Code
		otherCode  codes.Code // for ReportStatus
		completes  bool
		exitStatus int32
		exitSignal int32
		oom        bool
	}{
		{name: "succeed", b: fakerqd.Behavior{}, completes: true},
		{name: "refuse", b: fakerqd.Behavior{Mode: fakerqd.RefuseLaunch}, launchCode: codes.Aborted},
		{name: "refuse with code", b: fakerqd.Behavior{Mode: fakerqd.RefuseLaunch, RefuseCode: codes.ResourceExhausted}, launchCode: codes.ResourceExhausted},
		{name: "refuse but start", b: fakerqd.Behavior{Mode: fakerqd.RefuseLaunch, StartDespiteError: true}, launchCode: codes.Aborted, completes: true},
		{name: "unreachable", b: fakerqd.Behavior{Mode: fakerqd.Unreachable}, launchCode: codes.Unavailable, otherCode: codes.Unavailable},
		{name: "unreachable but start", b: fakerqd.Behavior{Mode: fakerqd.Unreachable, StartDespiteError: true}, launchCode: codes.Unavailable, otherCode: codes.Unavailable, completes: true},
		{name: "garbage", b: fakerqd.Behavior{Mode: fakerqd.Garbage}, launchCode: codes.Internal, otherCode: codes.Internal},
		{name: "exit non-zero", b: fakerqd.Behavior{Mode: fakerqd.ExitNonZero}, completes: true, exitStatus: 1},
		{name: "exit code 3", b: fakerqd.Behavior{Mode: fakerqd.ExitNonZero, ExitStatus: 3}, completes: true, exitStatus: 3},
		{name: "oom", b: fakerqd.Behavior{Mode: fakerqd.OOM}, completes: true, exitStatus: 1, exitSignal: 9, oom: true},
		{name: "oom by rqd", b: fakerqd.Behavior{Mode: fakerqd.OOM, ExitSignal: 33}, completes: true, exitStatus: 1, exitSignal: 33, oom: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The behaviour is set for one host only; "other" keeps the default.
			h := start(t, fakerqd.Config{Hosts: map[string]fakerqd.Behavior{"bad": tc.b}})

			rf := newFrame(100)
			wantCode(t, h.launch(t, "bad", rf), tc.launchCode)
			_, err := h.client.ReportStatus(ctxFor(t, "bad"), &rqdpb.RqdStaticReportStatusRequest{})
			wantCode(t, err, tc.otherCode)

			launches := h.fake.Launches()
			if len(launches) != 1 || launches[0].Code != tc.launchCode || launches[0].Started != tc.completes || launches[0].Host != "bad" {
				t.Errorf("launch record %+v", launches)
			}
			if !tc.completes {
				h.expectNoCompletion(t, 50*time.Millisecond)
			} else {
				c := h.wait(t)
				if c.FrameID != rf.FrameId || c.ExitStatus != tc.exitStatus || c.ExitSignal != tc.exitSignal {
					t.Errorf("completion %s exit %d signal %d, want %s exit %d signal %d",
						c.FrameID, c.ExitStatus, c.ExitSignal, rf.FrameId, tc.exitStatus, tc.exitSignal)
				}
				if c.Report.GetExitStatus() != tc.exitStatus || c.Report.GetExitSignal() != tc.exitSignal {
					t.Errorf("report exit %d signal %d", c.Report.GetExitStatus(), c.Report.GetExitSignal())
				}
				if over := c.MaxRSSKB > rf.HardMemoryLimit; over != tc.oom {
					t.Errorf("max rss %d vs hard limit %d: over=%v, want %v", c.MaxRSSKB, rf.HardMemoryLimit, over, tc.oom)
				}
				if c.Report.GetFrame().GetMaxRss() != c.MaxRSSKB {
					t.Errorf("report max rss %d, completion %d", c.Report.GetFrame().GetMaxRss(), c.MaxRSSKB)
				}
			}

			// Another host is unaffected.
			h.mustLaunch(t, "other", newFrame(100))
			if c := h.wait(t); c.Host != "other" || c.ExitStatus != 0 {
				t.Errorf("default host completion %+v", c)
			}
		})
	}
}

func TestBehaviorChanges(t *testing.T) {
	h := start(t, fakerqd.Config{Default: fakerqd.Behavior{Mode: fakerqd.Unreachable}})
	wantCode(t, h.launch(t, "a", newFrame(100)), codes.Unavailable)

	h.fake.SetHost("a", fakerqd.Behavior{RunTimeFunc: func(rf *rqdpb.RunFrame) time.Duration {
		return time.Duration(rf.NumCores/100) * 10 * time.Millisecond
	}})
	h.mustLaunch(t, "a", newFrame(300))
	if c := h.wait(t); c.RunTime != 30*time.Millisecond {
		t.Errorf("RunTimeFunc gave %v, want 30ms", c.RunTime)
	}
	wantCode(t, h.launch(t, "b", newFrame(100)), codes.Unavailable)

	h.fake.SetDefault(fakerqd.Behavior{})
	h.mustLaunch(t, "b", newFrame(100))
	h.wait(t)

	h.fake.SetHost("a", fakerqd.Behavior{Mode: fakerqd.RefuseLaunch})
	wantCode(t, h.launch(t, "a", newFrame(100)), codes.Aborted)
	h.fake.ClearHost("a")
	h.mustLaunch(t, "a", newFrame(100))
	h.wait(t)
}

func TestKillRunningFrame(t *testing.T) {
	h := start(t, fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour}})
	rf := newFrame(200)
	h.mustLaunch(t, "render-01", rf)
	kill := func(host, frameID, msg string) error {
		_, err := h.client.KillRunningFrame(ctxFor(t, host), &rqdpb.RqdStaticKillRunningFrameRequest{FrameId: frameID, Message: msg})
		return err
	}

	wantCode(t, kill("render-01", rf.FrameId, ""), codes.FailedPrecondition)
	wantCode(t, kill("render-02", rf.FrameId, "wrong host"), codes.NotFound)
	wantCode(t, kill("render-01", uuid.NewString(), "unknown frame"), codes.NotFound)

	time.Sleep(20 * time.Millisecond)
	if err := kill("render-01", rf.FrameId, "manual kill"); err != nil {
		t.Fatal(err)
	}
	c := h.wait(t)
	if !c.Killed || c.KillMessage != "manual kill" || c.ExitSignal != 9 || c.ExitStatus != 1 || c.FrameID != rf.FrameId {
		t.Errorf("kill completion %+v", c)
	}
	if c.RunTime < 20*time.Millisecond || c.RunTime > time.Minute {
		t.Errorf("killed frame run time %v", c.RunTime)
	}
	wantCode(t, kill("render-01", rf.FrameId, "again"), codes.NotFound)
	h.expectNoCompletion(t, 30*time.Millisecond)

	// After the kill the frame may run again (a retry), which is not a
	// double launch.
	h.mustLaunch(t, "render-01", rf)
	if d := h.fake.DoubleLaunches(); len(d) != 0 {
		t.Errorf("relaunch after kill counted as a double launch: %v", d)
	}
}

func TestReportStatusAndCapacity(t *testing.T) {
	h := start(t, fakerqd.Config{
		Default: fakerqd.Behavior{RunTime: time.Hour},
		Hosts: map[string]fakerqd.Behavior{
			"small": {RunTime: time.Hour, Cores: 4, MemoryKB: 16 << 20},
		},
	})
	a, b := newFrame(200), newFrame(100)
	h.mustLaunch(t, "small", a)
	h.mustLaunch(t, "small", b)
	wantCode(t, h.launch(t, "small", newFrame(200)), codes.Aborted)
	h.mustLaunch(t, "small", newFrame(100))

	resp, err := h.client.ReportStatus(ctxFor(t, "small"), &rqdpb.RqdStaticReportStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetHostReport()
	if r.GetHost().GetName() != "small" || r.GetHost().GetState() != hostpb.HardwareState_UP ||
		r.GetHost().GetTotalMem() != 16<<20 || r.GetHost().GetFreeMem() >= 16<<20 {
		t.Errorf("host %v", r.GetHost())
	}
	if ci := r.GetCoreInfo(); ci.GetTotalCores() != 400 || ci.GetBookedCores() != 400 || ci.GetIdleCores() != 0 {
		t.Errorf("core info %v", ci)
	}
	if len(r.GetFrames()) != 3 {
		t.Fatalf("%d running frames reported, want 3", len(r.GetFrames()))
	}
	ids := map[string]bool{}
	for _, f := range r.GetFrames() {
		ids[f.GetFrameId()] = true
		if f.GetResourceId() == "" || f.GetMaxRss() > 2_000_000 {
			t.Errorf("frame info %v", f)
		}
	}
	if !ids[a.FrameId] || !ids[b.FrameId] {
		t.Errorf("reported frames %v miss a or b", ids)
	}

	st, err := h.client.GetRunningFrameStatus(ctxFor(t, "small"), &rqdpb.RqdStaticGetRunningFrameStatusRequest{FrameId: a.FrameId})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetRunningFrameInfo().GetResourceId() != a.ResourceId {
		t.Errorf("status %v", st)
	}
	_, err = h.client.GetRunningFrameStatus(ctxFor(t, "small"), &rqdpb.RqdStaticGetRunningFrameStatusRequest{FrameId: "nope"})
	wantCode(t, err, codes.NotFound)

	// Hosts without Cores accept any number of cores.
	for i := 0; i < 10; i++ {
		h.mustLaunch(t, "big", newFrame(6400))
	}
	resp, err = h.client.ReportStatus(ctxFor(t, "big"), &rqdpb.RqdStaticReportStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ci := resp.GetHostReport().GetCoreInfo(); ci.GetBookedCores() != 64000 || ci.GetIdleCores() != 0 {
		t.Errorf("big host core info %v", ci)
	}

	// Unimplemented methods say so.
	_, err = h.client.Lock(ctxFor(t, "small"), &rqdpb.RqdStaticLockRequest{Cores: 100})
	wantCode(t, err, codes.Unimplemented)
}

// Many clients launching and killing at once: every started frame completes
// exactly once. Meant to run under -race.
func TestConcurrentLaunchesAndKills(t *testing.T) {
	var mu sync.Mutex
	completed := map[string]int{}
	fake, err := fakerqd.Start(fakerqd.Config{
		Default: fakerqd.Behavior{RunTimeFunc: func(rf *rqdpb.RunFrame) time.Duration {
			if rf.FrameName == "long" {
				return time.Hour
			}
			return time.Millisecond
		}},
		OnComplete: func(c fakerqd.FrameCompletion) {
			mu.Lock()
			completed[c.FrameID]++
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	conn, err := grpc.NewClient(fake.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rqdpb.NewRqdInterfaceClient(conn)

	const hosts, perHost = 10, 20
	var wg sync.WaitGroup
	errs := make(chan error, hosts*perHost*2)
	for i := 0; i < hosts; i++ {
		wg.Add(1)
		go func(host string) {
			defer wg.Done()
			ctx := fakerqd.WithHost(context.Background(), host)
			for j := 0; j < perHost; j++ {
				rf := newFrame(100)
				if j%2 == 0 {
					rf.FrameName = "long"
				}
				if _, err := client.LaunchFrame(ctx, &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: rf}); err != nil {
					errs <- err
					continue
				}
				go func() { _, _ = client.ReportStatus(ctx, &rqdpb.RqdStaticReportStatusRequest{}) }()
				if rf.FrameName == "long" {
					if _, err := client.KillRunningFrame(ctx, &rqdpb.RqdStaticKillRunningFrameRequest{FrameId: rf.FrameId, Message: "test"}); err != nil {
						errs <- err
					}
				}
			}
		}(fmt.Sprintf("host-%02d", i))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for {
		mu.Lock()
		n := len(completed)
		mu.Unlock()
		if n == hosts*perHost || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(completed) != hosts*perHost {
		t.Fatalf("%d frames completed, want %d", len(completed), hosts*perHost)
	}
	for id, n := range completed {
		if n != 1 {
			t.Errorf("frame %s completed %d times", id, n)
		}
	}
	if d := fake.DoubleLaunches(); len(d) != 0 {
		t.Errorf("DoubleLaunches = %v", d)
	}
}

func TestStop(t *testing.T) {
	completions := make(chan fakerqd.FrameCompletion, 10)
	fake, err := fakerqd.Start(fakerqd.Config{
		Default:    fakerqd.Behavior{RunTime: 50 * time.Millisecond},
		OnComplete: func(c fakerqd.FrameCompletion) { completions <- c },
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(fake.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rqdpb.NewRqdInterfaceClient(conn)
	ctx, cancel := context.WithTimeout(fakerqd.WithHost(context.Background(), "h"), 5*time.Second)
	defer cancel()
	if _, err := client.LaunchFrame(ctx, &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: newFrame(100)}); err != nil {
		t.Fatal(err)
	}

	addr := fake.Addr()
	fake.Stop()
	fake.Stop() // idempotent
	select {
	case c := <-completions:
		t.Fatalf("frame %s completed after Stop", c.FrameID)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := client.LaunchFrame(ctx, &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: newFrame(100)}); err == nil {
		t.Error("LaunchFrame succeeded after Stop")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("listener still open after Stop")
	}
}

// OnLaunch sees every LaunchFrame call, refused ones too; NoHistory keeps
// the history empty; Listen picks the address; RunningCount counts.
func TestOnLaunchNoHistoryListen(t *testing.T) {
	var mu sync.Mutex
	var seen []fakerqd.Launch
	h := start(t, fakerqd.Config{
		Listen:    "127.0.0.1:0",
		NoHistory: true,
		Default:   fakerqd.Behavior{RunTime: time.Hour},
		Hosts:     map[string]fakerqd.Behavior{"down": {Mode: fakerqd.Unreachable}},
		OnLaunch: func(l fakerqd.Launch) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, l)
		},
	})
	rf := newFrame(100)
	h.mustLaunch(t, "up", rf)
	wantCode(t, h.launch(t, "down", newFrame(100)), codes.Unavailable)
	wantCode(t, h.launch(t, "up", rf), codes.InvalidArgument)

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("OnLaunch saw %d calls, want 3", len(seen))
	}
	want := []struct {
		host    string
		code    codes.Code
		started bool
	}{{"up", codes.OK, true}, {"down", codes.Unavailable, false}, {"up", codes.InvalidArgument, false}}
	for i, w := range want {
		if l := seen[i]; l.Host != w.host || l.Code != w.code || l.Started != w.started || l.RunFrame.GetFrameId() == "" {
			t.Errorf("launch %d: host %q code %v started %v; want %q %v %v", i, l.Host, l.Code, l.Started, w.host, w.code, w.started)
		}
	}
	if n := len(h.fake.Launches()); n != 0 {
		t.Errorf("NoHistory kept %d launches", n)
	}
	if n := h.fake.RunningCount(); n != 1 {
		t.Errorf("RunningCount %d, want 1", n)
	}
}

// TestMemoryGuard: frames use their max RSS from the start; a launch that
// takes a guarded host's RSS past its memory kills the frame furthest over
// its booking (CUE_MEMORY), reported as RQD reports a killed process
// (status 1, signal 9) with its max RSS and MemoryKilled; an unguarded host
// never kills.
func TestMemoryGuard(t *testing.T) {
	const gb = 1 << 20
	rss := map[string]int64{}
	var mu sync.Mutex
	b := fakerqd.Behavior{RunTime: time.Hour, MemoryKB: 10 * gb, MemoryGuard: true,
		MaxRSSFunc: func(rf *rqdpb.RunFrame) int64 { mu.Lock(); defer mu.Unlock(); return rss[rf.GetFrameId()] }}
	h := start(t, fakerqd.Config{Default: b, Hosts: map[string]fakerqd.Behavior{"free": {RunTime: time.Hour, MemoryKB: 10 * gb, MaxRSSFunc: b.MaxRSSFunc}}})
	frame := func(booked, used int64) *rqdpb.RunFrame {
		rf := newFrame(100)
		rf.Environment["CUE_MEMORY"] = fmt.Sprint(booked)
		mu.Lock()
		rss[rf.GetFrameId()] = used
		mu.Unlock()
		return rf
	}
	honest := frame(4*gb, 4*gb) // uses what it booked
	greedy := frame(2*gb, 5*gb) // 3 GB over its booking
	h.mustLaunch(t, "guarded", honest)
	h.mustLaunch(t, "guarded", greedy) // 9 GB of 10: fits
	h.expectNoCompletion(t, 100*time.Millisecond)
	late := frame(2*gb, 3*gb) // 12 GB: the greedy frame (3 GB over) dies, not the newest (1 GB over)
	h.mustLaunch(t, "guarded", late)
	c := h.wait(t)
	if c.FrameID != greedy.GetFrameId() || !c.Killed || !c.MemoryKilled || c.ExitStatus != 1 || c.ExitSignal != 9 ||
		c.MaxRSSKB != 5*gb || c.Report.GetFrame().GetMaxRss() != 5*gb {
		t.Fatalf("memory kill = %+v (greedy %s)", c, greedy.GetFrameId())
	}
	h.expectNoCompletion(t, 100*time.Millisecond) // 7 GB left: fits
	if kills, over := h.fake.MemoryStats(); kills != 1 || over != 1 {
		t.Fatalf("memory stats = %d kills, %d overcommits; want 1, 1", kills, over)
	}
	// A frame that alone exceeds the host: it is the one killed.
	huge := frame(gb, 9*gb)
	h.mustLaunch(t, "guarded", huge)
	if c := h.wait(t); c.FrameID != huge.GetFrameId() || !c.MemoryKilled {
		t.Fatalf("killed %s, want the huge frame", c.FrameID)
	}
	// Without the guard the host overcommits silently.
	h.mustLaunch(t, "free", frame(gb, 9*gb))
	h.mustLaunch(t, "free", frame(gb, 9*gb))
	h.expectNoCompletion(t, 100*time.Millisecond)
	if kills, _ := h.fake.MemoryStats(); kills != 2 {
		t.Fatalf("kills = %d, want 2", kills)
	}
}

// TestMemoryGuardPeak: with PeakAt a frame counts no memory until it
// reaches its peak partway through its run; the kill comes then.
func TestMemoryGuardPeak(t *testing.T) {
	const gb = 1 << 20
	b := fakerqd.Behavior{RunTime: 2 * time.Second, MemoryKB: 10 * gb, MemoryGuard: true, PeakAt: 0.25,
		MaxRSSFunc: func(rf *rqdpb.RunFrame) int64 { return 6 * gb }}
	h := start(t, fakerqd.Config{Default: b})
	a, c := newFrame(100), newFrame(100)
	a.Environment["CUE_MEMORY"], c.Environment["CUE_MEMORY"] = fmt.Sprint(4*gb), fmt.Sprint(2*gb)
	h.mustLaunch(t, "h", a)
	h.mustLaunch(t, "h", c) // 12 GB once both peak: c (4 GB over) dies at its peak
	if kills, _ := h.fake.MemoryStats(); kills != 0 {
		t.Fatalf("killed at launch, before the peak")
	}
	got := h.wait(t)
	if got.FrameID != c.GetFrameId() || !got.MemoryKilled || got.RunTime >= 2*time.Second {
		t.Fatalf("completion %+v, want c killed at its peak", got)
	}
}
