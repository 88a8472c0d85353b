package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/shared/config"
)

// These tests walk commands() and the subcommands each group dispatches
// through, so a new command or subcommand is covered without being listed.

// runCLI runs the binary's entry point with captured output.
func runCLI(getenv func(string) string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	c := &cli{stdout: &out, stderr: &errb, getenv: getenv, logger: hclog.NewNullLogger()}
	code := run(context.Background(), c, args)
	return code, out.String(), errb.String()
}

// cmdPath is a command as typed: ["status"], ["migrate", "up"].
type cmdPath []string

func (p cmdPath) String() string { return strings.Join(p, " ") }

// allPaths is every command and every subcommand; leaf reports whether it
// runs something itself (not a group).
func allPaths() (paths []cmdPath, leaf map[string]bool) {
	cmds := commands()
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	leaf = map[string]bool{}
	for _, n := range names {
		paths = append(paths, cmdPath{n})
		leaf[n] = len(cmds[n].subs) == 0
		for _, s := range cmds[n].subs {
			p := cmdPath{n, s.name}
			paths = append(paths, p)
			leaf[p.String()] = true
		}
	}
	return paths, leaf
}

func TestHelpEveryCommand(t *testing.T) {
	t.Parallel()
	paths, _ := allPaths()
	if len(paths) < len(commands())+5 {
		t.Fatalf("only %d command paths: %v", len(paths), paths)
	}
	for _, p := range paths {
		want := "usage: cuesched " + p.String()
		for _, h := range []string{"-h", "--help"} {
			args := append(append([]string{}, p...), h)
			code, out, errOut := runCLI(nil, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, want) {
				t.Errorf("cuesched %s: exit %d (want 0), stderr %q (want empty), stdout lacks %q:\n%s", strings.Join(args, " "), code, errOut, want, out)
			}
		}
		// "cuesched help <command> [<subcommand>]" is the same.
		code, out, errOut := runCLI(nil, append([]string{"help"}, p...)...)
		if code != 0 || errOut != "" || !strings.Contains(out, want) {
			t.Errorf("cuesched help %s: exit %d, stderr %q, stdout lacks %q", p, code, errOut, want)
		}
	}
}

// Each subcommand prints its own usage, not its group's or a sibling's.
func TestHelpSubcommandsDiffer(t *testing.T) {
	t.Parallel()
	for name, cmd := range commands() {
		if len(cmd.subs) == 0 {
			continue
		}
		_, groupOut, _ := runCLI(nil, name, "-h")
		for _, s := range cmd.subs {
			if !strings.Contains(groupOut, s.name) {
				t.Errorf("cuesched %s -h does not list %s:\n%s", name, s.name, groupOut)
			}
		}
		seen := map[string]string{}
		for _, s := range cmd.subs {
			_, out, _ := runCLI(nil, name, s.name, "-h")
			if out == groupOut {
				t.Errorf("cuesched %s %s -h prints the group's usage", name, s.name)
			}
			if other, ok := seen[out]; ok {
				t.Errorf("cuesched %s %s -h and %s -h print the same usage", name, s.name, other)
			}
			seen[out] = s.name
			// "cuesched <group> help <subcommand>" is the same.
			_, out2, _ := runCLI(nil, name, "help", s.name)
			if out2 != out {
				t.Errorf("cuesched %s help %s differs from cuesched %s %s -h", name, s.name, name, s.name)
			}
		}
	}
}

func TestTopLevelUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, errOut := runCLI(nil, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "usage: cuesched <command>") {
			t.Errorf("cuesched %v: exit %d, stderr %q, stdout %q", args, code, errOut, out)
		}
		for name := range commands() {
			if !strings.Contains(out, "\n  "+name+" ") {
				t.Errorf("cuesched %v does not list %s", args, name)
			}
		}
	}
	code, out, errOut := runCLI(nil)
	if code != 2 || out != "" || !strings.Contains(errOut, "usage: cuesched <command>") {
		t.Errorf("cuesched without arguments: exit %d (want 2), stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runCLI(nil, "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, stderr %q", code, errOut)
	}
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

func TestUnknownFlag(t *testing.T) {
	t.Parallel()
	paths, _ := allPaths()
	paths = append(paths, cmdPath{})
	for _, p := range paths {
		args := append(append([]string{}, p...), "--no-such-flag")
		code, out, errOut := runCLI(nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "-no-such-flag") {
			t.Errorf("cuesched %s: exit %d (want 2), stdout %q, stderr %q (want the flag named)", strings.Join(args, " "), code, out, errOut)
		}
	}
}

// The environment variables of the connection settings are the config
// keys' overrides: the tools and the daemons read the same name.
func TestConnEnvIsTheConfigOverride(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	want := map[string]string{
		keyDatabaseURL:    "postgres://u@db.example:5432/cuebot",
		keyRedisURL:       "redis://redis.example:6379/3",
		keySentinelMaster: "acct",
		keySentinelAddrs:  "s1:26379,s2:26379",
	}
	for _, s := range connSettings() {
		if s.env() != config.EnvName(s.key) {
			t.Errorf("%s: env %s, config override %s", s.key, s.env(), config.EnvName(s.key))
		}
		if want[s.key] == "" {
			t.Fatalf("no test value for %s", s.key)
		}
		env[s.env()] = want[s.key]
	}
	cfg, err := config.Load("", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range connSettings() {
		if got := configValue(cfg, s.key); got != want[s.key] {
			t.Errorf("config.Load with $%s=%q: %s = %q", s.env(), want[s.key], s.key, got)
		}
	}
}

var envNameRE = regexp.MustCompile(`CUESCHED_[A-Z0-9]+(?:_[A-Z0-9]+)*`)

// positionals are the arguments a leaf needs before it reads its
// connection settings. A new leaf that needs some fails TestUsageEnvIsRead
// until it is listed here.
func positionals(p cmdPath) []string {
	switch p.String() {
	case "show set-managed":
		return []string{"alpha", "on"}
	}
	return nil
}

type envRecorder struct {
	mu   sync.Mutex
	read map[string]bool
}

func (r *envRecorder) getenv(k string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read[k] = true
	return ""
}

// Every environment variable a command's usage names is one of the shared
// connection settings, and the command reads it.
func TestUsageEnvIsRead(t *testing.T) {
	t.Parallel()
	table := map[string]bool{}
	for _, s := range connSettings() {
		table[s.env()] = true
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	paths, leaf := allPaths()
	mentioning := 0
	for _, p := range paths {
		_, usage, _ := runCLI(nil, append(append([]string{}, p...), "-h")...)
		names := envNameRE.FindAllString(usage, -1)
		for _, n := range names {
			if !table[n] {
				t.Errorf("cuesched %s -h names $%s, which is not a connection setting (connSettings)", p, n)
			}
		}
		if len(names) == 0 || !leaf[p.String()] {
			continue
		}
		mentioning++
		// Run it with a --config that does not exist: a command reads its
		// settings' variables, then fails loading the file before it
		// connects to anything.
		rec := &envRecorder{read: map[string]bool{}}
		args := append(append(append([]string{}, p...), positionals(p)...), "--config", missing)
		code, _, errOut := runCLI(rec.getenv, args...)
		if code == 0 || !strings.Contains(errOut, missing) {
			t.Errorf("cuesched %s: exit %d, stderr %q; want a failure naming %s", strings.Join(args, " "), code, errOut, missing)
		}
		for _, n := range names {
			if !rec.read[n] {
				t.Errorf("cuesched %s -h names $%s but the command does not read it", p, n)
			}
		}
	}
	if mentioning < 5 {
		t.Errorf("only %d commands name a connection variable in their usage", mentioning)
	}
}

// The README and the operator docs name only variables that something
// reads: a config override (every connection setting among them) or a test
// harness knob.
func TestDocsEnvNames(t *testing.T) {
	t.Parallel()
	rec := &envRecorder{read: map[string]bool{}}
	if _, err := config.Load("", rec.getenv); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range connSettings() {
		if !rec.read[s.env()] {
			t.Errorf("config.Load does not read $%s", s.env())
		}
		if !bytes.Contains(readme, []byte(s.env())) {
			t.Errorf("README.md does not document $%s", s.env())
		}
	}
	docs, _ := filepath.Glob("../../docs/*.md")
	for _, f := range append(docs, "../../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range envNameRE.FindAllString(string(b), -1) {
			if !rec.read[n] && !strings.HasPrefix(n, "CUESCHED_TEST_") && !strings.HasPrefix(n, "CUESCHED_BENCH_") {
				t.Errorf("%s names $%s, which nothing reads", f, n)
			}
		}
	}
}
