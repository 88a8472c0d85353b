// Package clitest holds a binary's command-line convention against its
// command table (shared/cli): every command and subcommand answers -h,
// --help and "help" on stdout with exit 0, names a bad flag on stderr with
// exit 2, and reads every environment variable its usage names. The checks
// walk the table, so a new command is covered without being listed. Test
// support: only _test.go files import it.
package clitest

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/shared/cli"
	"github.com/cuesched/cuesched/shared/testkit/redacttest"
)

// Binary is the program under test.
type Binary struct {
	Program cli.Program
	// Positionals are the arguments a leaf needs before it reads its
	// connection settings (nil: none). A new leaf that needs some fails
	// UsageEnvIsRead until it is listed.
	Positionals func(path string) []string
	// MinEnvCommands is how many leaves at least name a connection
	// variable in their usage.
	MinEnvCommands int
	// ConnectArgs are the arguments that make a leaf use its connection
	// settings, for NoSecretInOutput (nil: Positionals).
	ConnectArgs func(path string) []string
}

// RunContext runs the entry point with env until ctx ends; the output
// buffers are safe for a command that logs from several goroutines.
func (b Binary) RunContext(ctx context.Context, env map[string]string, args ...string) (int, string, string) {
	out, errb := &SyncBuffer{}, &SyncBuffer{}
	c := &cli.Env{Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger()}
	code := b.Program.Run(ctx, c, args)
	return code, out.String(), errb.String()
}

// Run runs the binary's entry point with captured output.
func (b Binary) Run(getenv func(string) string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	c := &cli.Env{Stdout: &out, Stderr: &errb, Getenv: getenv, Logger: hclog.NewNullLogger()}
	code := b.Program.Run(context.Background(), c, args)
	return code, out.String(), errb.String()
}

// Path is a command as typed: ["status"], ["migrate", "up"].
type Path []string

func (p Path) String() string { return strings.Join(p, " ") }

// Paths is every command and every subcommand; leaf reports whether it
// runs something itself (not a group).
func (b Binary) Paths() (paths []Path, leaf map[string]bool) {
	cmds := b.Program.Commands
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	leaf = map[string]bool{}
	for _, n := range names {
		paths = append(paths, Path{n})
		leaf[n] = len(cmds[n].Subs) == 0
		for _, s := range cmds[n].Subs {
			p := Path{n, s.Name}
			paths = append(paths, p)
			leaf[p.String()] = true
		}
	}
	return paths, leaf
}

// CheckAll runs every check of the convention.
func CheckAll(t *testing.T, b Binary) {
	t.Run("HelpEveryCommand", func(t *testing.T) { t.Parallel(); HelpEveryCommand(t, b) })
	t.Run("HelpSubcommandsDiffer", func(t *testing.T) { t.Parallel(); HelpSubcommandsDiffer(t, b) })
	t.Run("TopLevelUsage", func(t *testing.T) { t.Parallel(); TopLevelUsage(t, b) })
	t.Run("UnknownFlag", func(t *testing.T) { t.Parallel(); UnknownFlag(t, b) })
	t.Run("UsageEnvIsRead", func(t *testing.T) { t.Parallel(); UsageEnvIsRead(t, b) })
	t.Run("NoSecretInOutput", func(t *testing.T) { t.Parallel(); NoSecretInOutput(t, b) })
}

// NoSecretInOutput: every leaf that takes connection settings (--config,
// --database-url), fed malformed or unreachable database and Redis URLs
// that carry a password (redacttest.Cases) in the environment, in --config
// FILE and in its flags, fails without printing the password anywhere.
// A leaf without such flags reads no connection setting (UsageEnvIsRead
// holds it to what its usage names) and is run with them in its
// environment only when it takes no time (version).
func NoSecretInOutput(t *testing.T, b Binary) {
	name := b.Program.Name
	dir := t.TempDir()
	args := b.ConnectArgs
	if args == nil {
		args = b.Positionals
	}
	if args == nil {
		args = func(string) []string { return nil }
	}
	paths, leaf := b.Paths()
	runs := 0
	check := func(env map[string]string, limit time.Duration, mustFail bool, what string, argv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		code, out, errOut := b.RunContext(ctx, env, argv...)
		label := name + " " + strings.Join(argv, " ") + " (" + what + ")"
		redacttest.CheckOutput(t, label, out+errOut)
		if mustFail && code == 0 {
			t.Errorf("%s: exit 0 with unusable connection settings", label)
		}
		runs++
	}
	for _, p := range paths {
		if !leaf[p.String()] {
			continue
		}
		_, usage, _ := b.Run(nil, append(append([]string{}, p...), "-h")...)
		hasConfig := strings.Contains(usage, "\n  -config ")
		hasDB := strings.Contains(usage, "\n  -database-url ")
		hasRedis := strings.Contains(usage, "\n  -redis-url ")
		if !hasConfig && !hasDB {
			if p.String() == "version" {
				check(redacttest.Cases()[0].Env(), time.Minute, false, "environment", p)
			}
			continue
		}
		base := append(append([]string{}, p...), args(p.String())...)
		for _, c := range redacttest.Cases() {
			// A daemon given two well-formed URLs retries until its
			// deadline: its output so far is checked all the same.
			limit := time.Minute
			if c.Unreachable {
				limit = 3 * time.Second
			}
			check(c.Env(), limit, !c.Unreachable, c.Name+", environment", base)
			if hasConfig {
				check(nil, limit, !c.Unreachable, c.Name+", --config", append(append([]string{}, base...), "--config", c.ConfigFile(t, dir)))
			}
			if hasDB {
				fl := c.Flags()
				if !hasRedis {
					fl = fl[:2]
				}
				check(nil, limit, !c.Unreachable, c.Name+", flags", append(append([]string{}, base...), fl...))
			}
		}
	}
	if runs < len(redacttest.Cases()) {
		t.Errorf("only %d runs: no command of %s takes connection settings?", runs, name)
	}
}

// HelpEveryCommand: -h, --help and "help <path>" print the path's usage.
func HelpEveryCommand(t *testing.T, b Binary) {
	name := b.Program.Name
	paths, _ := b.Paths()
	for _, p := range paths {
		want := "usage: " + name + " " + p.String()
		for _, h := range []string{"-h", "--help"} {
			args := append(append([]string{}, p...), h)
			code, out, errOut := b.Run(nil, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, want) {
				t.Errorf("%s %s: exit %d (want 0), stderr %q (want empty), stdout lacks %q:\n%s", name, strings.Join(args, " "), code, errOut, want, out)
			}
		}
		code, out, errOut := b.Run(nil, append([]string{"help"}, p...)...)
		if code != 0 || errOut != "" || !strings.Contains(out, want) {
			t.Errorf("%s help %s: exit %d, stderr %q, stdout lacks %q", name, p, code, errOut, want)
		}
	}
}

// HelpSubcommandsDiffer: each subcommand prints its own usage, not its
// group's or a sibling's.
func HelpSubcommandsDiffer(t *testing.T, b Binary) {
	name := b.Program.Name
	for cmdName, cmd := range b.Program.Commands {
		if len(cmd.Subs) == 0 {
			continue
		}
		_, groupOut, _ := b.Run(nil, cmdName, "-h")
		for _, s := range cmd.Subs {
			if !strings.Contains(groupOut, s.Name) {
				t.Errorf("%s %s -h does not list %s:\n%s", name, cmdName, s.Name, groupOut)
			}
		}
		seen := map[string]string{}
		for _, s := range cmd.Subs {
			_, out, _ := b.Run(nil, cmdName, s.Name, "-h")
			if out == groupOut {
				t.Errorf("%s %s %s -h prints the group's usage", name, cmdName, s.Name)
			}
			if other, ok := seen[out]; ok {
				t.Errorf("%s %s %s -h and %s -h print the same usage", name, cmdName, s.Name, other)
			}
			seen[out] = s.Name
			_, out2, _ := b.Run(nil, cmdName, "help", s.Name)
			if out2 != out {
				t.Errorf("%s %s help %s differs from %s %s %s -h", name, cmdName, s.Name, name, cmdName, s.Name)
			}
		}
	}
}

// TopLevelUsage: the binary's own usage lists every command; no command or
// an unknown one is exit 2.
func TopLevelUsage(t *testing.T, b Binary) {
	name := b.Program.Name
	head := "usage: " + name + " <command>"
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, errOut := b.Run(nil, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, head) {
			t.Errorf("%s %v: exit %d, stderr %q, stdout %q", name, args, code, errOut, out)
		}
		for cmd := range b.Program.Commands {
			if !strings.Contains(out, "\n  "+cmd+" ") {
				t.Errorf("%s %v does not list %s", name, args, cmd)
			}
		}
	}
	code, out, errOut := b.Run(nil)
	if code != 2 || out != "" || !strings.Contains(errOut, head) {
		t.Errorf("%s without arguments: exit %d (want 2), stdout %q, stderr %q", name, code, out, errOut)
	}
	code, _, errOut = b.Run(nil, "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, stderr %q", code, errOut)
	}
}

// UnknownFlag: every path names an unknown flag on stderr and exits 2.
func UnknownFlag(t *testing.T, b Binary) {
	paths, _ := b.Paths()
	paths = append(paths, Path{})
	for _, p := range paths {
		args := append(append([]string{}, p...), "--no-such-flag")
		code, out, errOut := b.Run(nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "-no-such-flag") {
			t.Errorf("%s %s: exit %d (want 2), stdout %q, stderr %q (want the flag named)", b.Program.Name, strings.Join(args, " "), code, out, errOut)
		}
	}
}

// EnvNameRE matches a CUESCHED_* environment variable name.
var EnvNameRE = regexp.MustCompile(`CUESCHED_[A-Z0-9]+(?:_[A-Z0-9]+)*`)

// EnvRecorder is a getenv that records what was read and answers "".
type EnvRecorder struct {
	mu   sync.Mutex
	read map[string]bool
}

// NewEnvRecorder returns an empty recorder.
func NewEnvRecorder() *EnvRecorder { return &EnvRecorder{read: map[string]bool{}} }

// Getenv records k and returns "".
func (r *EnvRecorder) Getenv(k string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read[k] = true
	return ""
}

// Read reports whether k was read.
func (r *EnvRecorder) Read(k string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.read[k]
}

// UsageEnvIsRead: every environment variable a command's usage names is
// one of the shared connection settings, and the command reads it.
func UsageEnvIsRead(t *testing.T, b Binary) {
	name := b.Program.Name
	table := map[string]bool{}
	for _, s := range cli.ConnSettings() {
		table[s.Env()] = true
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	paths, leaf := b.Paths()
	mentioning := 0
	for _, p := range paths {
		_, usage, _ := b.Run(nil, append(append([]string{}, p...), "-h")...)
		names := EnvNameRE.FindAllString(usage, -1)
		for _, n := range names {
			if !table[n] {
				t.Errorf("%s %s -h names $%s, which is not a connection setting (cli.ConnSettings)", name, p, n)
			}
		}
		if len(names) == 0 || !leaf[p.String()] {
			continue
		}
		mentioning++
		// Run it with a --config that does not exist: a command reads its
		// settings' variables, then fails loading the file before it
		// connects to anything.
		rec := NewEnvRecorder()
		var pos []string
		if b.Positionals != nil {
			pos = b.Positionals(p.String())
		}
		args := append(append(append([]string{}, p...), pos...), "--config", missing)
		code, _, errOut := b.Run(rec.Getenv, args...)
		if code == 0 || !strings.Contains(errOut, missing) {
			t.Errorf("%s %s: exit %d, stderr %q; want a failure naming %s", name, strings.Join(args, " "), code, errOut, missing)
		}
		for _, n := range names {
			if !rec.Read(n) {
				t.Errorf("%s %s -h names $%s but the command does not read it", name, p, n)
			}
		}
	}
	if mentioning < b.MinEnvCommands {
		t.Errorf("only %d commands name a connection variable in their usage (want at least %d)", mentioning, b.MinEnvCommands)
	}
}

// SyncBuffer is a bytes.Buffer safe for a command writing in one goroutine
// while the test reads in another.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *SyncBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *SyncBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
