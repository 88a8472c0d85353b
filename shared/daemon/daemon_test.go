package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/metrics"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newDaemon(t *testing.T) (*Daemon, *lockedBuf) {
	t.Helper()
	cfg := config.Default()
	cfg.Metrics.Listen = "127.0.0.1:0"
	var out lockedBuf
	d, err := New("test", cfg, &out, metrics.Build{Version: "v"})
	if err != nil {
		t.Fatal(err)
	}
	return d, &out
}

// The tests below send real signals to this process; they must not run in
// parallel with each other.

func TestSIGTERMDrainsCleanly(t *testing.T) {
	d, out := newDaemon(t)
	started := make(chan struct{})
	drained := false
	go func() {
		<-started
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
	}()
	err := d.Run(context.Background(), func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // finish in-flight work
		drained = true
		return ctx.Err()
	})
	if err != nil {
		t.Fatalf("Run after SIGTERM: %v", err)
	}
	if !drained {
		t.Fatal("Run returned before the work drained")
	}
	if !strings.Contains(out.String(), "drained cleanly") {
		t.Fatalf("log lacks the drain message:\n%s", out)
	}
}

func TestDrainTimeout(t *testing.T) {
	d, _ := newDaemon(t)
	d.DrainTimeout = 100 * time.Millisecond
	started := make(chan struct{})
	go func() {
		<-started
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
	}()
	release := make(chan struct{})
	defer close(release)
	err := d.Run(context.Background(), func(ctx context.Context) error {
		close(started)
		<-release // ignores cancellation
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "drain did not finish") {
		t.Fatalf("want a drain timeout error, got %v", err)
	}
}

func TestRunServesEndpointsAndReturnsErrors(t *testing.T) {
	boom := errors.New("boom")
	// The port is only a hint: another process may bind it before Run
	// does, so a clash (Run fails to listen, before running the mode) is
	// retried on another, as testenv does for its servers.
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		d, _ := newDaemon(t)
		var port int
		if port, err = testenv.FreePort(); err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		d.Config.Metrics.Listen = addr
		d.Health.SetCheck("x", func() error { return errors.New("warming up") })
		err = d.Run(context.Background(), func(ctx context.Context) error {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 || !strings.Contains(string(body), "x: warming up") {
				t.Errorf("readyz: %d %q", resp.StatusCode, body)
			}
			return boom
		})
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		t.Logf("port %d taken before Run bound it; another", port)
	}
	if !errors.Is(err, boom) {
		t.Fatalf("Run must return the mode's error, got %v", err)
	}
}
