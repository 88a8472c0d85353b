package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/rollout"
)

const showUsage = `usage: cuesched show <subcommand> [flags]

subcommands:
  list                        every show: active, scheduler-managed, seeded in
                              Redis, live procs and booked cores, and per
                              subscription booked vs burst (Postgres and Redis)
  set-managed <show> on|off   move a show to the scheduler (on) or back to
                              Cuebot (off), with preflight checks

Run 'cuesched show <subcommand> -h' for its flags.
`

const showListUsage = `usage: cuesched show list [--database-url URL] [--redis-url URL] [--json]

Lists every show. CORES is SUM(proc.int_cores_reserved) in cores; under each
show, one row per subscription: CORES booked by its non-local procs on hosts of
that allocation, SIZE and BURST from Postgres, and the Redis counter
(int_cores/burst, whole cores) when Redis is given and answers. SEEDED is the
show's seeding marker in Redis: yes, no, stale (not managed but still marked),
? (Redis unreachable), - (no Redis given). Redis is optional here. When shows
are managed but no sidecar streams this database's slot, a WARNING says so.

flags:
`

const setManagedUsage = `usage: cuesched show set-managed <show> on|off [--wait DURATION] [--force]
                            [--database-url URL] [--redis-url URL]

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

flags:
`

// runShow dispatches "cuesched show <subcommand>".
func runShow(ctx context.Context, c *cli, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, showUsage)
		return 2
	}
	switch args[0] {
	case "list":
		return runShowList(ctx, c, args[1:])
	case "set-managed":
		return runShowSetManaged(ctx, c, args[1:])
	case "-h", "--help", "help":
		fmt.Fprint(c.stderr, showUsage)
		return 0
	}
	fmt.Fprintf(c.stderr, "cuesched show: unknown subcommand %q\n\n%s", args[0], showUsage)
	return 2
}

// connFlags are the connection flags every rollout command takes.
type connFlags struct {
	dbURL, redisURL, master, sentinels *string
}

func addConnFlags(fs *flag.FlagSet) connFlags {
	return connFlags{
		dbURL:     fs.String("database-url", "", "Cuebot PostgreSQL URL (default $CUESCHED_DATABASE_URL)"),
		redisURL:  fs.String("redis-url", "", "accounting Redis URL, redis://host:port/db (default $CUESCHED_REDIS_URL, then $CUESCHED_ACCOUNTING_REDIS_URL)"),
		master:    fs.String("sentinel-master", "", "Sentinel master name (instead of the address in --redis-url)"),
		sentinels: fs.String("sentinel-addrs", "", "comma-separated Sentinel host:port list"),
	}
}

// openTool connects to Postgres (required) and Redis (when given) and
// returns the rollout tool and a cleanup. code is non-zero on failure (the
// error is already printed).
func openTool(ctx context.Context, c *cli, name string, f connFlags) (tool *rollout.Tool, cleanup func(), code int) {
	db := envOr(c, *f.dbURL, "CUESCHED_DATABASE_URL")
	if db == "" {
		fmt.Fprintf(c.stderr, "%s: no database: pass --database-url or set CUESCHED_DATABASE_URL\n", name)
		return nil, nil, 2
	}
	rd := envOr(c, *f.redisURL, "CUESCHED_REDIS_URL")
	if rd == "" {
		rd = c.getenv("CUESCHED_ACCOUNTING_REDIS_URL")
	}
	var addrs []string
	for _, a := range strings.Split(*f.sentinels, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	pcfg, err := pgxpool.ParseConfig(db)
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: database URL: %v\n", name, err)
		return nil, nil, 2
	}
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = rollout.AppName(rollout.RoleCLI, "")
	}
	pcfg.MaxConns = 4
	var pub *publisher.Publisher
	var closers []func()
	cleanup = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if rd != "" || *f.master != "" {
		rdb, err := publisher.NewClient(publisher.ClientConfig{URL: rd, MasterName: *f.master, SentinelAddrs: addrs, PoolSize: 4})
		if err != nil {
			fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
			return nil, nil, 2
		}
		closers = append(closers, func() { _ = rdb.Close() })
		if pub, err = publisher.New(rdb, publisher.Options{Logger: c.logger}); err != nil {
			cleanup()
			fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
			return nil, nil, 1
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		cleanup()
		fmt.Fprintf(c.stderr, "%s: database: %v\n", name, err)
		return nil, nil, 1
	}
	closers = append(closers, pool.Close)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = pool.Ping(pctx)
	cancel()
	if err != nil {
		cleanup()
		fmt.Fprintf(c.stderr, "%s: connect to the database: %v\n", name, err)
		return nil, nil, 1
	}
	tool, err = rollout.New(pool, rollout.Options{Publisher: pub, Logger: c.logger})
	if err != nil {
		cleanup()
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return nil, nil, 1
	}
	return tool, cleanup, 0
}

// runShowList is "cuesched show list".
func runShowList(ctx context.Context, c *cli, args []string) int {
	const name = "cuesched show list"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	cf := addConnFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprint(c.stderr, showListUsage)
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
	tool, cleanup, code := openTool(ctx, c, name, cf)
	if code != 0 {
		return code
	}
	defer cleanup()
	list, err := tool.ListShows(ctx)
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return 1
	}
	if *asJSON {
		err = list.WriteJSON(c.stdout)
	} else {
		err = list.Write(c.stdout)
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// runShowSetManaged is "cuesched show set-managed <show> on|off".
func runShowSetManaged(ctx context.Context, c *cli, args []string) int {
	const name = "cuesched show set-managed"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	cf := addConnFlags(fs)
	wait := fs.Duration("wait", 0, "how long to wait for the scheduler to seed the show (on) or close it (off); 0 = do not wait (default 60s for on, 0 for off)")
	force := fs.Bool("force", false, "flip even if a preflight check fails (the missing sidecar, Redis or rollout)")
	fs.Usage = func() {
		fmt.Fprint(c.stderr, setManagedUsage)
		fs.PrintDefaults()
	}
	// Flags may come before, between and after the two arguments.
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) != 2 {
		fmt.Fprintf(c.stderr, "%s: want a show name and on or off, got %d argument(s)\n", name, len(pos))
		fs.Usage()
		return 2
	}
	show, state := pos[0], strings.ToLower(pos[1])
	var on bool
	switch state {
	case "on", "true", "yes":
		on = true
	case "off", "false", "no":
	default:
		fmt.Fprintf(c.stderr, "%s: %q is not on or off\n", name, pos[1])
		return 2
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
		fmt.Fprintf(c.stderr, "%s: --wait %s is negative\n", name, *wait)
		return 2
	}

	tool, cleanup, code := openTool(ctx, c, name, cf)
	if code != 0 {
		return code
	}
	defer cleanup()
	_, err := tool.Flip(ctx, rollout.FlipRequest{Show: show, On: on, Force: *force, Wait: *wait}, c.stdout)
	if err != nil {
		// Unknown show, refusal and wait errors carry the whole explanation.
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
