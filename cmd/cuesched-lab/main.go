// Command cuesched-lab is the lab that proves cuesched, never deployed: the
// verify battery (sim), the embedded demo farm (demo) and the fake RQD that
// stands in for render nodes on a staging copy (fake-rqd). It is the only
// binary that links the test doubles and the throwaway PostgreSQL/Redis
// starters (shared/testkit).
package main

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/shared/cli"
)

// Set by -ldflags at build time.
var (
	version  = "dev"
	revision = "unknown"
)

func commands() map[string]cli.Command {
	return map[string]cli.Command{
		"sim":             {Summary: "run the verify battery: farm-scale scheduling scenarios with PASS/FAIL", Run: runSim},
		"demo":            {Summary: "run an embedded farm (Postgres, Redis, fake RQD) and watch frames flow", Run: runDemo},
		"dashboard-check": {Summary: "check the Grafana dashboard and alert rules against a real Prometheus scraping a short farm", Run: runDashcheck},
		"fake-rqd":        {Summary: "answer RQD calls for every host, to rehearse a rollout on a staging database", Run: runFakeRQD},
		"version":         cli.VersionCommand("cuesched-lab", version, revision),
	}
}

// program is this binary's command table and usage.
func program() cli.Program {
	return cli.Program{Name: "cuesched-lab", Commands: commands(), Footer: `Run 'cuesched-lab <command> -h' for a command's usage and flags. The
deployed binary is cuesched (scheduler, sidecar, rollout tooling); this one
never runs in production.
`}
}

func main() {
	c := &cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Logger: hclog.NewNullLogger()}
	os.Exit(program().Run(context.Background(), c, os.Args[1:]))
}
