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
}

func commands() map[string]command {
	return map[string]command{
		"scheduler":  {"run the standalone scheduler (one per facility)", runScheduler},
		"sidecar":    {"run the release publisher next to a Cuebot", runSidecar},
		"migrate":    {"plan, apply or check the rollout migrations", runMigrate},
		"show":       {"list shows and flip b_scheduler_managed", runShow},
		"accounting": {"audit Redis accounting against Postgres", runAccounting},
		"status":     {"instances, loop leader, slot lag, managed shows, drift", runStatus},
		"explain":    {"why a job's frames are waiting: the gate per layer, the best host", runExplain},
		"sim":        {"run the verify battery: farm-scale scheduling scenarios with PASS/FAIL", runSim},
		"fake-rqd":   {"answer RQD calls for every host, to rehearse a rollout on a staging database", runFakeRQD},
		"demo":       {"run an embedded farm (Postgres, Redis, fake RQD) and watch frames flow", runDemo},
		"config":     {"print the annotated example configuration", runConfig},
		"version":    {"print the version", runVersion},
	}
}

func main() {
	c := &cli{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, logger: hclog.NewNullLogger()}
	os.Exit(run(context.Background(), c, os.Args[1:]))
}

func run(ctx context.Context, c *cli, args []string) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(c.stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(c.stderr, "cuesched: unknown command %q\n\n", args[0])
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
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'cuesched <command> -h' for a command's flags.")
}

// notBuilt is the answer of a subcommand whose capability has not landed.
func notBuilt(c *cli, name, what string) int {
	fmt.Fprintf(c.stderr, "cuesched %s: not built yet: %s\n", name, what)
	return 3
}

func runVersion(_ context.Context, c *cli, _ []string) int {
	fmt.Fprintf(c.stdout, "cuesched %s (%s)\n", version, revision)
	return 0
}

func runConfig(_ context.Context, c *cli, args []string) int {
	if len(args) > 0 && args[0] != "example" {
		fmt.Fprintln(c.stderr, "usage: cuesched config [example]")
		return 2
	}
	fmt.Fprint(c.stdout, exampleConfig())
	return 0
}

func envOr(c *cli, flagValue, env string) string {
	if strings.TrimSpace(flagValue) != "" {
		return flagValue
	}
	return c.getenv(env)
}
