package faults

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// process is one cuesched daemon (scheduler or sidecar) run as a real child
// process of the test, supervised the way systemd would with Restart=always:
// a process the test kills is restarted by the test (after a RestartSec-like
// delay); a process that exits on its own is also restarted, so the run can
// continue to its end, but that exit is recorded as a failure ("every
// process recovers without a restart by hand").
type process struct {
	t    testing.TB
	name string // instance name: sched-a, sidecar-1
	bin  string
	args []string
	log  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	intended bool // the running process's exit is ours (kill -9, SIGTERM)
	closing  bool
	frozen   bool
	starts   int
	kills    []time.Time
	// unexpected lists exits nobody asked for.
	unexpected []string
	// drainErr is set when the final SIGTERM did not drain cleanly.
	drainErr error
}

func newProcess(t testing.TB, bin, name, log string, args ...string) *process {
	return &process{t: t, bin: bin, name: name, args: args, log: log}
}

// start launches the process (appending to its log file).
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *process) startLocked() error {
	if p.closing {
		return errors.New("closing")
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	p.starts++
	fmt.Fprintf(f, "\n===== %s start #%d at %s =====\n", p.name, p.starts, time.Now().Format("15:04:05.000"))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	p.cmd, p.done, p.intended, p.frozen = cmd, done, false, false
	go p.wait(cmd, done)
	return nil
}

// wait records how the process ended and restarts it if nobody asked for
// the exit.
func (p *process) wait(cmd *exec.Cmd, done chan struct{}) {
	err := cmd.Wait()
	close(done)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != cmd || p.intended || p.closing {
		return
	}
	p.unexpected = append(p.unexpected, fmt.Sprintf("%s exited on its own at %s: %v",
		p.name, time.Now().Format("15:04:05.000"), err))
	// systemd would restart it; do the same so the run can finish.
	go func() {
		time.Sleep(300 * time.Millisecond)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cmd == cmd && !p.closing {
			if err := p.startLocked(); err != nil {
				p.unexpected = append(p.unexpected, fmt.Sprintf("%s: restart: %v", p.name, err))
			}
		}
	}()
}

// kill9 sends SIGKILL and waits for the process to be gone.
func (p *process) kill9() time.Time {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.intended = true
	p.mu.Unlock()
	if cmd == nil {
		return time.Now()
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	at := time.Now()
	<-done
	p.mu.Lock()
	p.kills = append(p.kills, at)
	p.mu.Unlock()
	return at
}

// crash is kill -9 followed, after restartAfter, by a restart (systemd's
// Restart=always with RestartSec).
func (p *process) crash(restartAfter time.Duration) time.Time {
	at := p.kill9()
	time.Sleep(restartAfter)
	if err := p.start(); err != nil {
		p.t.Errorf("restart %s: %v", p.name, err)
	}
	return at
}

// freeze sends SIGSTOP; thaw sends SIGCONT.
func (p *process) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP)
		p.frozen = true
	}
}

func (p *process) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT)
		p.frozen = false
	}
}

// alive reports whether the current process is running.
func (p *process) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// terminate is a systemd stop: SIGTERM, then a clean drain (exit 0) within
// timeout is expected; otherwise SIGKILL and record the failure.
func (p *process) terminate(timeout time.Duration) {
	p.mu.Lock()
	p.closing = true
	cmd, done := p.cmd, p.done
	p.intended = true
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			p.drainErr = fmt.Errorf("%s: SIGTERM drain exited with code %d", p.name, code)
		}
	case <-time.After(timeout):
		p.drainErr = fmt.Errorf("%s: did not drain within %s of SIGTERM", p.name, timeout)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// logText returns the process's log (all runs).
func (p *process) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// problems lists what the process did wrong: exits nobody asked for, a
// drain that failed, panics and data races in its log.
func (p *process) problems() []string {
	p.mu.Lock()
	out := append([]string(nil), p.unexpected...)
	if p.drainErr != nil {
		out = append(out, p.drainErr.Error())
	}
	p.mu.Unlock()
	log := p.logText()
	for _, marker := range []string{"panic:", "WARNING: DATA RACE", "fatal error:"} {
		if i := strings.Index(log, marker); i >= 0 {
			out = append(out, fmt.Sprintf("%s log contains %q:\n%s", p.name, marker, excerpt(log, i, 3000)))
		}
	}
	return out
}

func excerpt(s string, at, n int) string {
	start := max(at-200, 0)
	end := min(at+n, len(s))
	return s[start:end]
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// grepCount counts lines of the log containing every one of words.
func grepCount(log string, words ...string) int {
	n := 0
	for _, line := range bytes.Split([]byte(log), []byte("\n")) {
		ok := true
		for _, w := range words {
			if !bytes.Contains(line, []byte(w)) {
				ok = false
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}
