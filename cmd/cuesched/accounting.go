package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"
)

const accountingUsage = `usage: cuesched accounting <subcommand> [flags]

subcommands:
  audit   compare every Redis counter with SUM(proc) and every cap with the
          Postgres accounting tables; exit 1 on any difference
`

// runAccounting dispatches "cuesched accounting <subcommand>".
func runAccounting(ctx context.Context, c *cli, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, accountingUsage)
		return 2
	}
	switch args[0] {
	case "audit":
		return runAccountingAudit(ctx, c, args[1:])
	case "-h", "--help", "help":
		fmt.Fprint(c.stderr, accountingUsage)
		return 0
	}
	fmt.Fprintf(c.stderr, "cuesched accounting: unknown subcommand %q\n\n%s", args[0], accountingUsage)
	return 2
}

// runAccountingAudit is "cuesched accounting audit".
func runAccountingAudit(ctx context.Context, c *cli, args []string) int {
	fs := flag.NewFlagSet("cuesched accounting audit", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	dbURL := fs.String("database-url", "", "Cuebot PostgreSQL URL (default $CUESCHED_DATABASE_URL)")
	redisURL := fs.String("redis-url", "", "accounting Redis URL, redis://host:port/db (default $CUESCHED_REDIS_URL)")
	master := fs.String("sentinel-master", "", "Sentinel master name (instead of the address in --redis-url)")
	sentinels := fs.String("sentinel-addrs", "", "comma-separated Sentinel host:port list")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintln(c.stderr, "usage: cuesched accounting audit --database-url URL --redis-url URL")
		fmt.Fprintln(c.stderr, "\nPrints the differences between Redis and Postgres; exits 0 when there are none,")
		fmt.Fprintln(c.stderr, "1 on drift or error, 2 on bad usage. On a live farm, bookings in flight can show")
		fmt.Fprintln(c.stderr, "as transient differences: run it again to confirm.")
		fmt.Fprintln(c.stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.stderr, "cuesched accounting audit: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	db := envOr(c, *dbURL, "CUESCHED_DATABASE_URL")
	rd := envOr(c, *redisURL, "CUESCHED_REDIS_URL")
	if db == "" {
		fmt.Fprintln(c.stderr, "cuesched accounting audit: no database: pass --database-url or set CUESCHED_DATABASE_URL")
		return 2
	}
	var addrs []string
	for _, a := range strings.Split(*sentinels, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if rd == "" && *master == "" {
		fmt.Fprintln(c.stderr, "cuesched accounting audit: no Redis: pass --redis-url (or --sentinel-master and --sentinel-addrs) or set CUESCHED_REDIS_URL")
		return 2
	}
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: rd, MasterName: *master, SentinelAddrs: addrs})
	if err != nil {
		fmt.Fprintf(c.stderr, "cuesched accounting audit: %v\n", err)
		return 2
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		fmt.Fprintf(c.stderr, "cuesched accounting audit: database URL: %v\n", err)
		return 2
	}
	defer pool.Close()
	pub, err := publisher.New(rdb, publisher.Options{Logger: c.logger})
	if err != nil {
		fmt.Fprintf(c.stderr, "cuesched accounting audit: %v\n", err)
		return 1
	}
	rep, err := accounting.Audit(ctx, pool, pub)
	if err != nil {
		fmt.Fprintf(c.stderr, "cuesched accounting audit: %v\n", err)
		return 1
	}
	rep.Write(c.stdout)
	if len(rep.Drifts) > 0 {
		return 1
	}
	return 0
}
