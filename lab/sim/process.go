package sim

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// A scheduler instance runs either in this process (scheduler.New, the
// battery's default: the scenarios read its state directly) or, when
// Options.SchedulerBin names the deployed binary, as a child process
// `cuesched scheduler --config FILE` (SCALE: the product measured as it is
// deployed, its RSS and CPU its own). A child reads the configuration the
// in-process instance would get, reaches the fake RQD through
// rqd.address_override and serves /metrics on a loopback port, which the
// world scrapes where it would gather the in-process registry.

// childDrain bounds a child scheduler's SIGTERM drain before it is killed.
const childDrain = 30 * time.Second

// startChild starts scheduler i as a child process of Options.SchedulerBin
// with cfg (its metrics listener and RQD address are set here).
func (w *World) startChild(ctx context.Context, i int, cfg config.Config) error {
	if w.childDir == "" {
		dir, err := os.MkdirTemp("", "cuesched-sim-")
		if err != nil {
			return err
		}
		w.childDir = dir
	}
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg.Metrics.Listen = addr
	cfg.RQD.AddressOverride = w.Fake.Addr()
	cfg.Logging.Level = "warn"
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("scheduler%d", i)
	cfgPath := filepath.Join(w.childDir, name+".yaml")
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(w.childDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(w.Opts.SchedulerBin, "scheduler", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Only the file configures the child: no CUESCHED_* of this
	// environment overrides what the in-process instance would get.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUESCHED_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", w.Opts.SchedulerBin, err)
	}
	ictx, cancel := context.WithCancel(ctx)
	in := &instance{cancel: cancel, done: make(chan struct{}), child: cmd, metricsURL: "http://" + addr + "/metrics"}
	w.scheds = append(w.scheds, in)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	go func() {
		defer close(in.done)
		var err error
		select {
		case err = <-exited:
			if ictx.Err() == nil {
				w.Note("scheduler %d (pid %d) exited on its own: %v; its log ends: %s", i, cmd.Process.Pid, err, tail(logPath, 400))
				return
			}
		case <-ictx.Done():
			// The world stops it (SIGTERM, the deployed drain) unless Kill
			// has (in.dead is written before the cancel).
			if !in.dead {
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			select {
			case err = <-exited:
			case <-time.After(childDrain):
				_ = cmd.Process.Kill()
				<-exited
				w.Note("scheduler %d (pid %d) still running %s after SIGTERM: killed", i, cmd.Process.Pid, childDrain)
				return
			}
		}
		if err != nil && !in.dead {
			w.Note("scheduler %d (pid %d) did not drain cleanly on SIGTERM: %v; its log ends: %s", i, cmd.Process.Pid, err, tail(logPath, 400))
		}
	}()
	return nil
}

// gather reads an instance's metrics: its registry in this process, or a
// child's /metrics.
func (in *instance) gather() ([]*dto.MetricFamily, error) {
	if in.reg != nil {
		return in.reg.Gather()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", in.metricsURL, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

// gauge is the value of an unlabelled gauge of the instance (ok false if
// it has none).
func (in *instance) gauge(name string) (float64, bool) {
	fams, err := in.gather()
	if err != nil {
		return 0, false
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// childPIDs are the live child schedulers' process ids.
func (w *World) childPIDs() []int {
	var out []int
	for _, in := range w.scheds {
		if in.child != nil && !in.dead {
			out = append(out, in.child.Process.Pid)
		}
	}
	return out
}

// tail is the last n bytes of a file, on one line.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.Join(strings.Fields(string(b)), " ")
}

// procStatus reads a field of /proc/PID/status in bytes (VmRSS, VmHWM).
func procStatus(pid int, field string) int64 {
	path := "/proc/self/status"
	if pid > 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb); err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
