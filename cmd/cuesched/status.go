package main

import (
	"context"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/rollout"
)

const statusUsage = `usage: cuesched status [--json] [--no-audit] [--timeout DURATION] [--config FILE]
                       [--database-url URL] [--redis-url URL]

Reports, for one Cuebot database:
  - the rollout state (cuesched migrate status in one line);
  - scheduler and sidecar instances, found by the application_name they set
    on their connections (cuesched-scheduler/<instance>,
    cuesched-sidecar/<instance>);
  - the loop leader: the scheduler session holding the accounting advisory lock;
  - cuesched replication slots: active or not, holder, lag, retained WAL;
  - Redis: reachable, bootstrapped, the sidecar's checkpoint;
  - managed shows and whether each is seeded (bookable);
  - firm host reservations (queue.reservations): host, owner job and layer,
    cores, how long held, projected ready time, expiry, backfills admitted;
  - drift between Redis and Postgres (cuesched accounting audit, summarised;
    --no-audit skips it).

exit status: 0 when nothing needs attention; 1 when something does (rollout
incomplete, managed shows without an active sidecar slot, no loop leader
while shows are managed, Redis unreachable or not bootstrapped, an unseeded
managed show, drift, an inactive sidecar slot holding WAL) or on error; 2 bad
usage. What needs attention is listed at the end.
`

// runStatus is "cuesched status".
func runStatus(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched status", statusUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, true)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	noAudit := fs.Bool("no-audit", false, "skip the Redis/Postgres drift audit (it reads every proc of the managed shows)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	v, code := cf.Resolve(c, name, false)
	if code != 0 {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	tool, cleanup, code := openTool(ctx, c, name, v, false)
	if code != 0 {
		return code
	}
	defer cleanup()
	rep, err := tool.Status(ctx, rollout.StatusOptions{Audit: !*noAudit})
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	if *asJSON {
		err = rep.WriteJSON(c.Stdout)
	} else {
		err = rep.Write(c.Stdout)
	}
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	if !rep.Healthy() {
		return 1
	}
	return 0
}
