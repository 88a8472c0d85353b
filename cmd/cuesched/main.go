// Command cuesched is the one cuesched binary: the standalone scheduler, the
// release-publisher sidecar, and the rollout tooling. This package only parses
// flags, loads configuration and wires packages together.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Set by -ldflags at build time.
var (
	version  = "dev"
	revision = "unknown"
)

// cli is what every subcommand gets: where to write, and the environment.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	logger         hclog.Logger
}

type command struct {
	summary string
	run     func(ctx context.Context, c *cli, args []string) int
	// subs are the subcommands run dispatches to (nil for a leaf command).
	subs []subcommand
}

func commands() map[string]command {
	return map[string]command{
		"scheduler":  {summary: "run the standalone scheduler (one per facility)", run: runScheduler},
		"sidecar":    {summary: "run the release publisher next to a Cuebot", run: runSidecar},
		"migrate":    migrateGroup().command("plan, apply or check the rollout migrations"),
		"show":       showGroup().command("list shows and flip b_scheduler_managed"),
		"accounting": accountingGroup().command("audit Redis accounting against Postgres"),
		"status":     {summary: "instances, loop leader, slot lag, managed shows, drift", run: runStatus},
		"explain":    {summary: "why a job's frames are waiting: the gate per layer, the best host", run: runExplain},
		"sim":        {summary: "run the verify battery: farm-scale scheduling scenarios with PASS/FAIL", run: runSim},
		"fake-rqd":   {summary: "answer RQD calls for every host, to rehearse a rollout on a staging database", run: runFakeRQD},
		"demo":       {summary: "run an embedded farm (Postgres, Redis, fake RQD) and watch frames flow", run: runDemo},
		"config":     {summary: "print the annotated example configuration", run: runConfig},
		"version":    {summary: "print the version", run: runVersion},
	}
}

func main() {
	c := &cli{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, logger: hclog.NewNullLogger()}
	os.Exit(run(context.Background(), c, os.Args[1:]))
}

func run(ctx context.Context, c *cli, args []string) int {
	cmds := commands()
	if len(args) == 0 {
		usage(c.stderr, cmds)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(c.stdout, cmds)
		return 0
	case "--version", "-version":
		return runVersion(ctx, c, args[1:])
	case "help":
		if len(args) == 1 {
			usage(c.stdout, cmds)
			return 0
		}
		// "help <command> [<subcommand>]" is "<command> [<subcommand>] -h".
		return run(ctx, c, append(args[1:len(args):len(args)], "-h"))
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(c.stderr, "cuesched: unknown flag %q\n\n", args[0])
		} else {
			fmt.Fprintf(c.stderr, "cuesched: unknown command %q\n\n", args[0])
		}
		usage(c.stderr, cmds)
		return 2
	}
	return cmd.run(ctx, c, args[1:])
}

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: cuesched <command> [flags]")
	fmt.Fprintln(w, "       cuesched help [<command> [<subcommand>]]")
	fmt.Fprintln(w, "       cuesched --version")
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'cuesched <command> -h' for a command's usage and flags. Commands that")
	fmt.Fprintln(w, "connect read --config FILE and the CUESCHED_<SECTION>_<KEY> environment")
	fmt.Fprintln(w, "variables (see README.md, Configuration).")
}

const versionUsage = `usage: cuesched version
       cuesched --version

Prints the version and the revision it was built from.
`

func runVersion(_ context.Context, c *cli, args []string) int {
	fs := newFlagSet(c, "cuesched version", versionUsage)
	if code, done := fs.parse(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.fail("unexpected argument %q", fs.Arg(0))
	}
	fmt.Fprintf(c.stdout, "cuesched %s (%s)\n", version, revision)
	return 0
}

const configUsage = `usage: cuesched config [example]

Prints the annotated example configuration with every key and its default
(shared/config/example.yaml). One file serves both daemons (--config FILE);
every key can be overridden by the environment variable
CUESCHED_<SECTION>_<KEY>, and flags win over both.
`

func runConfig(_ context.Context, c *cli, args []string) int {
	fs := newFlagSet(c, "cuesched config", configUsage)
	if code, done := fs.parse(args); done {
		return code
	}
	for i, a := range fs.Args() {
		if i > 0 || a != "example" {
			return fs.fail("unexpected argument %q", a)
		}
	}
	fmt.Fprint(c.stdout, exampleConfig())
	return 0
}
