// Command cuesched is the binary a studio deploys: the standalone scheduler,
// the release-publisher sidecar, and the rollout tooling. It links no test
// support (the simulator, demo and fake RQD are cmd/cuesched-lab; an import
// rule test holds that). This package only parses flags, loads configuration
// and wires packages together.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/shared/cli"
	"github.com/cuesched/cuesched/shared/logging"
)

// Set by -ldflags at build time.
var (
	version  = "dev"
	revision = "unknown"
)

func commands() map[string]cli.Command {
	return map[string]cli.Command{
		"scheduler":  {Summary: "run the standalone scheduler (one per facility)", Run: runScheduler},
		"sidecar":    {Summary: "run the release publisher next to a Cuebot", Run: runSidecar},
		"migrate":    migrateGroup().Command("plan, apply or check the rollout migrations"),
		"show":       showGroup().Command("list shows and flip b_scheduler_managed"),
		"accounting": accountingGroup().Command("audit Redis accounting against Postgres"),
		"limit":      limitGroup().Command("list limits and set cuesched's limit settings (licence denial exit statuses)"),
		"status":     {Summary: "instances, loop leader, slot lag, managed shows, drift", Run: runStatus},
		"explain":    {Summary: "why a job's frames are waiting: the gate per layer, the best host", Run: runExplain},
		"config":     {Summary: "print the annotated example configuration", Run: runConfig},
		"version":    cli.VersionCommand("cuesched", version, revision),
	}
}

// program is this binary's command table and usage.
func program() cli.Program {
	return cli.Program{Name: "cuesched", Commands: commands(), Footer: `Run 'cuesched <command> -h' for a command's usage and flags. Commands that
connect read --config FILE and the CUESCHED_<SECTION>_<KEY> environment
variables (see README.md, Configuration). The simulator, the demo and the
fake RQD are in the lab binary, cuesched-lab.
`}
}

func main() {
	// go-redis logs through a package-global logger of its own, which
	// writes raw text to stderr and would break logging.format: json. Set
	// it here, once for the process (never in a library or a test), to an
	// adapter that a daemon points at its hclog logger (cli.Env.UseLogger).
	redisLog := logging.NewRedisLog(os.Stderr)
	redis.SetLogger(redisLog)
	c := &cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Logger: hclog.NewNullLogger(),
		UseLogger: func(l hclog.Logger) { redisLog.Use(l.Named("redis")) }}
	os.Exit(run(context.Background(), c, os.Args[1:]))
}

func run(ctx context.Context, c *cli.Env, args []string) int { return program().Run(ctx, c, args) }

const configUsage = `usage: cuesched config [example]

Prints the annotated example configuration with every key and its default
(shared/config/example.yaml). One file serves both daemons (--config FILE);
every key can be overridden by the environment variable
CUESCHED_<SECTION>_<KEY>, and flags win over both.
`

func runConfig(_ context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched config", configUsage)
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	for i, a := range fs.Args() {
		if i > 0 || a != "example" {
			return fs.Fail("unexpected argument %q", a)
		}
	}
	fmt.Fprint(c.Stdout, exampleConfig())
	return 0
}
