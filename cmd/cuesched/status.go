package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/scheduler/rollout"
)

const statusUsage = `usage: cuesched status [--database-url URL] [--redis-url URL] [--json] [--no-audit]

Reports, for one Cuebot database:
  - the rollout state (cuesched migrate status in one line);
  - scheduler and sidecar instances, found by the application_name they set
    on their connections (cuesched-scheduler/<instance>,
    cuesched-sidecar/<instance>);
  - the loop leader: the scheduler session holding the accounting advisory lock;
  - cuesched replication slots: active or not, holder, lag, retained WAL;
  - Redis: reachable, bootstrapped, the sidecar's checkpoint;
  - managed shows and whether each is seeded (bookable);
  - drift between Redis and Postgres (cuesched accounting audit, summarised;
    --no-audit skips it).

exit status: 0 when nothing needs attention; 1 when something does (rollout
incomplete, managed shows without an active sidecar slot, no loop leader
while shows are managed, Redis unreachable or not bootstrapped, an unseeded
managed show, drift, an inactive sidecar slot holding WAL) or on error; 2 bad
usage. What needs attention is listed at the end.

flags:
`

// runStatus is "cuesched status".
func runStatus(ctx context.Context, c *cli, args []string) int {
	const name = "cuesched status"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	cf := addConnFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	noAudit := fs.Bool("no-audit", false, "skip the Redis/Postgres drift audit (it reads every proc of the managed shows)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(c.stderr, statusUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	tool, cleanup, code := openTool(ctx, c, name, cf)
	if code != 0 {
		return code
	}
	defer cleanup()
	rep, err := tool.Status(ctx, rollout.StatusOptions{Audit: !*noAudit})
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return 1
	}
	if *asJSON {
		err = rep.WriteJSON(c.stdout)
	} else {
		err = rep.Write(c.stdout)
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return 1
	}
	if !rep.Healthy() {
		return 1
	}
	return 0
}
