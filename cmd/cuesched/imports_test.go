package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The deployed binary links no test support, in the spirit of Kubernetes'
// .import-restrictions: these prefixes may appear only in the lab binary
// (cmd/cuesched-lab), in lab/ and shared/testkit/ themselves, and in tests.
var forbiddenImports = []string{
	"testing", // Go's test framework
	"github.com/cuesched/cuesched/shared/testkit", // doubles, seeders, throwaway servers
	"github.com/cuesched/cuesched/lab",            // simulator, demo, whole-system suites
	"golang.org/x/image",                          // the lab's charts
}

// notProduction are the packages allowed to import test support.
var notProduction = []string{
	"github.com/cuesched/cuesched/cmd/cuesched-lab",
	"github.com/cuesched/cuesched/shared/testkit",
	"github.com/cuesched/cuesched/lab",
	"github.com/cuesched/cuesched/bench", // the benchmark report and its charts
}

func hasPrefix(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// forbiddenIn returns the forbidden packages among deps.
func forbiddenIn(deps []string) []string {
	var bad []string
	for _, d := range deps {
		if hasPrefix(d, forbiddenImports) {
			bad = append(bad, d)
		}
	}
	return bad
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

func TestDeployedBinaryLinksNoTestSupport(t *testing.T) {
	t.Parallel()
	deps := goList(t, "-deps", ".")
	if len(deps) < 50 {
		t.Fatalf("go list -deps found only %d packages: %v", len(deps), deps)
	}
	if bad := forbiddenIn(deps); len(bad) > 0 {
		t.Errorf("cmd/cuesched links test support: %v (move it behind cmd/cuesched-lab)", bad)
	}
}

// Every production package, not only what the binary links today: a
// scheduler package that imported a double would reach the binary with
// the next wiring change.
func TestProductionPackagesImportNoTestSupport(t *testing.T) {
	t.Parallel()
	lines := goList(t, "-f", `{{.ImportPath}}:{{join .Deps ","}}`, "github.com/cuesched/cuesched/...")
	checked := 0
	for _, l := range lines {
		pkg, deps, _ := strings.Cut(l, ":")
		if hasPrefix(pkg, notProduction) || pkg == "github.com/cuesched/cuesched" {
			continue
		}
		checked++
		if bad := forbiddenIn(strings.Split(deps, ",")); len(bad) > 0 {
			t.Errorf("%s imports test support: %v", pkg, bad)
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d production packages", checked)
	}
}

// The rule itself catches what it is for.
func TestForbiddenImportsRule(t *testing.T) {
	t.Parallel()
	deps := []string{"fmt", "testing", "github.com/cuesched/cuesched/shared/testkit/fakerqd",
		"github.com/cuesched/cuesched/lab/sim", "golang.org/x/image/font", "github.com/cuesched/cuesched/shared/config",
		"github.com/cuesched/cuesched/shared/testkitchen"}
	got := strings.Join(forbiddenIn(deps), " ")
	want := "testing github.com/cuesched/cuesched/shared/testkit/fakerqd github.com/cuesched/cuesched/lab/sim golang.org/x/image/font"
	if got != want {
		t.Fatalf("forbiddenIn = %q, want %q", got, want)
	}
}
