package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/shared/cli"
	"github.com/cuesched/cuesched/shared/testkit/clitest"

	"github.com/cuesched/cuesched/shared/config"
)

// bin is this binary for the command-line convention checks.
func bin() clitest.Binary {
	return clitest.Binary{Program: program(), MinEnvCommands: 5, Positionals: func(path string) []string {
		if path == "show set-managed" {
			return []string{"alpha", "on"}
		}
		return nil
	}}
}

// runCLI runs the binary's entry point with captured output.
func runCLI(getenv func(string) string, args ...string) (int, string, string) {
	return bin().Run(getenv, args...)
}

func TestCLIConvention(t *testing.T) {
	t.Parallel()
	if paths, _ := bin().Paths(); len(paths) < len(commands())+5 {
		t.Fatalf("only %d command paths: %v", len(paths), paths)
	}
	clitest.CheckAll(t, bin())
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errOut := runCLI(nil, args...)
		if code != 0 || errOut != "" || out != "cuesched "+version+" ("+revision+")\n" {
			t.Errorf("cuesched %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// The README and the operator docs name only variables that something
// reads: a config override (every connection setting among them) or a test
// harness knob.
func TestDocsEnvNames(t *testing.T) {
	t.Parallel()
	rec := clitest.NewEnvRecorder()
	if _, err := config.Load("", rec.Getenv); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cli.ConnSettings() {
		if !rec.Read(s.Env()) {
			t.Errorf("config.Load does not read $%s", s.Env())
		}
		if !bytes.Contains(readme, []byte(s.Env())) {
			t.Errorf("README.md does not document $%s", s.Env())
		}
	}
	docs, _ := filepath.Glob("../../docs/*.md")
	for _, f := range append(docs, "../../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range clitest.EnvNameRE.FindAllString(string(b), -1) {
			if !rec.Read(n) && !strings.HasPrefix(n, "CUESCHED_TEST_") && !strings.HasPrefix(n, "CUESCHED_BENCH_") && !strings.HasPrefix(n, "CUESCHED_SIM_") && n != "CUESCHED_ALLOW_NO_PROMTOOL" {
				t.Errorf("%s names $%s, which nothing reads", f, n)
			}
		}
	}
}
