package main

import (
	"context"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/scheduler/accounting"
)

// accountingGroup is "cuesched accounting".
func accountingGroup() cli.Group {
	return cli.Group{Name: "cuesched accounting", Subs: []cli.Subcommand{
		{Name: "audit", Run: runAccountingAudit, Summary: "compare every Redis counter with SUM(proc) and every cap " +
			"with the Postgres accounting tables; exit 1 on any difference"},
	}}
}

// runAccounting is "cuesched accounting <subcommand>".
func runAccounting(ctx context.Context, c *cli.Env, args []string) int {
	return accountingGroup().Run(ctx, c, args)
}

const accountingAuditUsage = `usage: cuesched accounting audit [--timeout DURATION] [--config FILE]
                                [--database-url URL] [--redis-url URL]

Compares every Redis counter with SUM(proc) and every cap with the Postgres
accounting tables, and prints the differences. Needs Postgres and the Redis
the schedulers use.

exit status: 0 no difference; 1 drift or error; 2 bad usage. On a live farm,
bookings in flight can show as transient differences: run it again to
confirm.
`

// runAccountingAudit is "cuesched accounting audit".
func runAccountingAudit(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched accounting audit", accountingAuditUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, true)
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	v, code := cf.Resolve(c, name, true)
	if code != 0 {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	cn, code := cli.OpenConns(ctx, c, name, v, 4)
	if code != 0 {
		return code
	}
	defer cn.Close()
	if code := checkCuebot(ctx, c, name, cn, true); code != 0 {
		return code
	}
	rep, err := accounting.Audit(ctx, cn.Pool, cn.Pub)
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	rep.Write(c.Stdout)
	if len(rep.Drifts) > 0 {
		return 1
	}
	return 0
}
