package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fullMode selects the randomized, repeated suite (make faults).
func fullMode() bool { return os.Getenv("CUESCHED_FAULTS") == "full" }

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// cueschedBinary builds cmd/cuesched once per test binary and returns its
// path. The directory is named like testenv's temp dirs and carries our pid
// in owner.pid, so testenv's sweep of dirs whose owner is gone removes it on
// a later run (testenv.Main exits the process, so nothing runs after the
// tests to remove it now).
func cueschedBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() { binPath, binErr = buildBinary() })
	if binErr != nil {
		t.Fatalf("build cuesched: %v", binErr)
	}
	return binPath
}

func buildBinary() (string, error) {
	dir, err := os.MkdirTemp("", "cuesched-testenv-faultsbin-")
	if err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, ".owner.pid.tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "owner.pid")); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "cuesched")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/cuesched/cuesched/cmd/cuesched")
	cmd := exec.Command(goTool(), args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %v: %w\n%s", args, err, b)
	}
	return out, nil
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		return filepath.Join(strings.TrimSpace(string(out)), "bin", "go")
	}
	return "go"
}
