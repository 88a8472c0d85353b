// Package cli is the command-line convention both binaries follow
// (cuesched, the deployed one, and cuesched-lab, the simulator and demo):
// a table of commands and command groups, -h/--help on stdout with exit 0,
// a bad flag or argument named on stderr with exit 2, and one table of
// connection settings (flag, else CUESCHED_<SECTION>_<KEY>, else the key in
// --config FILE) for every command that connects.
package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Env is what every command gets: where to write, and the environment.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Logger         hclog.Logger
	// UseLogger, when set, is called by a daemon with its logger once its
	// configuration is loaded, so process-wide log sinks the binary set up
	// in main (go-redis's logger) follow logging.format and level.
	UseLogger func(hclog.Logger)
}

// Command is one entry of a binary's command table.
type Command struct {
	Summary string
	Run     func(ctx context.Context, c *Env, args []string) int
	// Subs are the subcommands Run dispatches to (nil for a leaf command).
	Subs []Subcommand
}

// Program is a binary: its name, its commands and a few lines of trailing
// help for its usage.
type Program struct {
	Name     string // "cuesched"
	Commands map[string]Command
	Footer   string // printed after the command list
}

// Run runs the command args name, with the help conventions: no command
// prints the usage on stderr (exit 2), -h/--help/help print it on stdout,
// "help <command> [<subcommand>]" is "<command> [<subcommand>] -h", and
// --version runs the "version" command.
func (p Program) Run(ctx context.Context, c *Env, args []string) int {
	if len(args) == 0 {
		p.usage(c.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		p.usage(c.Stdout)
		return 0
	case "--version", "-version":
		if v, ok := p.Commands["version"]; ok {
			return v.Run(ctx, c, args[1:])
		}
	case "help":
		if len(args) == 1 {
			p.usage(c.Stdout)
			return 0
		}
		return p.Run(ctx, c, append(args[1:len(args):len(args)], "-h"))
	}
	cmd, ok := p.Commands[args[0]]
	if !ok {
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(c.Stderr, "%s: unknown flag %q\n\n", p.Name, args[0])
		} else {
			fmt.Fprintf(c.Stderr, "%s: unknown command %q\n\n", p.Name, args[0])
		}
		p.usage(c.Stderr)
		return 2
	}
	return cmd.Run(ctx, c, args[1:])
}

func (p Program) usage(w io.Writer) {
	names := make([]string, 0, len(p.Commands))
	for n := range p.Commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "usage: %s <command> [flags]\n", p.Name)
	fmt.Fprintf(w, "       %s help [<command> [<subcommand>]]\n", p.Name)
	fmt.Fprintf(w, "       %s --version\n", p.Name)
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, p.Commands[n].Summary)
	}
	if p.Footer != "" {
		fmt.Fprintf(w, "\n%s", EnsureNewline(p.Footer))
	}
}

// VersionCommand prints "<name> <version> (<revision>)".
func VersionCommand(name, version, revision string) Command {
	usage := fmt.Sprintf("usage: %s version\n       %s --version\n\nPrints the version and the revision it was built from.\n", name, name)
	return Command{Summary: "print the version", Run: func(_ context.Context, c *Env, args []string) int {
		fs := NewFlagSet(c, name+" version", usage)
		if code, done := fs.ParseArgs(args); done {
			return code
		}
		if fs.NArg() > 0 {
			return fs.Fail("unexpected argument %q", fs.Arg(0))
		}
		fmt.Fprintf(c.Stdout, "%s %s (%s)\n", name, version, revision)
		return 0
	}}
}
