package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestJSONAndLevel(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(Options{Name: "cuesched", Level: "info", Format: "json", Output: &buf})
	if err != nil {
		t.Fatal(err)
	}
	l.Named("dispatch").Debug("hidden")
	l.Named("dispatch").Info("booked", "frame", "f1", "cores", 4)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want 1 line, got %q", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m["@module"] != "cuesched.dispatch" || m["frame"] != "f1" || m["@message"] != "booked" {
		t.Fatalf("unexpected record %v", m)
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := New(Options{Level: "loud"}); err == nil || !strings.Contains(err.Error(), "loud") {
		t.Fatalf("got %v", err)
	}
	if _, err := New(Options{Level: "info", Format: "xml"}); err == nil || !strings.Contains(err.Error(), "xml") {
		t.Fatalf("got %v", err)
	}
}

func TestSIGUSR1TogglesDebugForSubLoggers(t *testing.T) {
	var buf syncBuffer
	l, _ := New(Options{Name: "x", Level: "info", Output: &buf})
	sub := l.Named("cache")
	tog := NewDebugToggle(l)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tog.HandleSIGUSR1(ctx)
	time.Sleep(20 * time.Millisecond)
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Patience(2 * time.Second))
	for !sub.IsDebug() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !sub.IsDebug() {
		t.Fatal("SIGUSR1 did not turn debug on for a sub-logger")
	}
	_ = syscall.Kill(syscall.Getpid(), syscall.SIGUSR1)
	deadline = time.Now().Add(testenv.Patience(2 * time.Second))
	for sub.IsDebug() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if sub.IsDebug() {
		t.Fatal("second SIGUSR1 did not restore the base level")
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}
