package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/rollout"
)

// showGroup is "cuesched show".
func showGroup() cli.Group {
	return cli.Group{Name: "cuesched show", Subs: []cli.Subcommand{
		{Name: "list", Run: runShowList, Summary: "every show: active, scheduler-managed, seeded in Redis, live procs " +
			"and booked cores, and per subscription booked vs burst (Postgres and Redis)"},
		{Name: "set-managed", Args: "<show> on|off", Run: runShowSetManaged, Summary: "move a show to the scheduler (on) " +
			"or back to Cuebot (off), with preflight checks"},
	}}
}

// runShow is "cuesched show <subcommand>".
func runShow(ctx context.Context, c *cli.Env, args []string) int {
	return showGroup().Run(ctx, c, args)
}

const showListUsage = `usage: cuesched show list [--json] [--config FILE] [--database-url URL] [--redis-url URL]

Lists every show. CORES is SUM(proc.int_cores_reserved) in cores; under each
show, one row per subscription: CORES booked by its non-local procs on hosts of
that allocation, SIZE and BURST from Postgres, and the Redis counter
(int_cores/burst, whole cores) when Redis is given and answers. SEEDED is the
show's seeding marker in Redis: yes, no, stale (not managed but still marked),
? (Redis unreachable), - (no Redis given). Redis is optional here. When shows
are managed but no sidecar streams this database's slot, a WARNING says so.
`

const setManagedUsage = `usage: cuesched show set-managed <show> on|off [--wait DURATION] [--force]
                            [--config FILE] [--database-url URL] [--redis-url URL]

Moves one show between Cuebot (off) and the scheduler (on) by flipping
show.b_scheduler_managed in a single UPDATE. Running it again is harmless:
a show already in the requested state is reported and left alone.

on: preflight first; refuses, unless --force, when the rollout is incomplete,
    when Cuebot's schema history shows a Cuebot older than V45 (it ignores the
    flag), when no sidecar streams an active replication slot (cuesched_sidecar*) of
    this database (without one Cuebot's releases never reach Redis and the
    show's counters only grow), or when Redis does not answer. Warns when
    Redis is not bootstrapped, no scheduler leads, the show has no
    subscription with burst > 0 (it could never book) or is inactive.
    Then waits (--wait, default 60s) until the scheduler's loop leader has
    seeded the show in Redis, i.e. until it is bookable.
off: flips back and explains what happens to running frames and to the
    accounting; --wait (default 0) waits until the leader closed the show
    for booking.

exit status: 0 flipped (or already so) and, when waiting, the scheduler did
its part; 1 refused, unknown show, error, or the wait timed out (the flip then
stays in effect: the message says what is missing); 2 bad usage.
`

// runShowList is "cuesched show list".
func runShowList(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched show list", showListUsage)
	cf := cli.AddConnFlags(fs, true)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	v, code := cf.Resolve(c, fs.Name(), false)
	if code != 0 {
		return code
	}
	tool, cleanup, code := openTool(ctx, c, fs.Name(), v, true)
	if code != 0 {
		return code
	}
	defer cleanup()
	list, err := tool.ListShows(ctx)
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", fs.Name(), err)
		return 1
	}
	if *asJSON {
		err = list.WriteJSON(c.Stdout)
	} else {
		err = list.Write(c.Stdout)
	}
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", fs.Name(), err)
		return 1
	}
	return 0
}

// runShowSetManaged is "cuesched show set-managed <show> on|off".
func runShowSetManaged(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched show set-managed", setManagedUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, true)
	wait := fs.Duration("wait", 0, "how long to wait for the scheduler to seed the show (on) or close it (off); 0 = do not wait (default 60s for on, 0 for off)")
	force := fs.Bool("force", false, "flip even if a preflight check fails (the missing sidecar, Redis or rollout)")
	// Flags may come before, between and after the two arguments.
	pos, code, done := fs.ParseInterleaved(args)
	if done {
		return code
	}
	if len(pos) != 2 {
		return fs.Fail("want a show name and on or off, got %d argument(s)", len(pos))
	}
	show, state := pos[0], strings.ToLower(pos[1])
	var on bool
	switch state {
	case "on", "true", "yes":
		on = true
	case "off", "false", "no":
	default:
		return fs.Fail("%q is not on or off", pos[1])
	}
	waitSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "wait" {
			waitSet = true
		}
	})
	if !waitSet && on {
		*wait = 60 * time.Second
	}
	if *wait < 0 {
		return fs.Fail("--wait %s is negative", *wait)
	}

	v, code := cf.Resolve(c, name, false)
	if code != 0 {
		return code
	}
	tool, cleanup, code := openTool(ctx, c, name, v, false)
	if code != 0 {
		return code
	}
	defer cleanup()
	_, err := tool.Flip(ctx, rollout.FlipRequest{Show: show, On: on, Force: *force, Wait: *wait}, c.Stdout)
	if err != nil {
		// Unknown show, refusal and wait errors carry the whole explanation.
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
