package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/shared/cli"
)

// limitGroup is "cuesched limit".
func limitGroup() cli.Group {
	return cli.Group{Name: "cuesched limit", Subs: []cli.Subcommand{
		{Name: "list", Run: runLimitList, Summary: "every limit: its max, the frames running under it, and cuesched's settings (denial exit statuses)"},
		{Name: "set-denials", Args: "<limit> <status>[,<status>…]|none", Run: runLimitSetDenials,
			Summary: "name the exit statuses the limit's licence denials produce: a frame that ended with one is relaunched without spending a retry"},
		{Name: "set-per-host", Args: "<limit> on|off", Run: runLimitSetPerHost,
			Summary: "make the limit node-locked (on: it counts hosts holding a seat, not frames) or per-frame again (off, Cuebot's meaning)"},
	}}
}

const limitListUsage = `usage: cuesched limit list [--config FILE] [--database-url URL]

Lists every limit (Cuebot's limit_record): its max, whether it counts
frames (Cuebot's meaning) or hosts (node-locked: cuesched limit
set-per-host, rollout 0010), what runs under it now (frames: the RUNNING
frames of its layers, as Cuebot and the scheduler count them; hosts: the
hosts running one of its layers' procs) and the exit statuses cuesched
treats as its licence denials (cuesched_limit, rollout 0007). Postgres
only.
`

const limitSetDenialsUsage = `usage: cuesched limit set-denials <limit> <status>[,<status>…]|none
                             [--config FILE] [--database-url URL]

Names the exit statuses a licence denial of the limit produces (the render
command's exit status when the licence server refuses a seat), in
cuesched's own table (cuesched_limit, rollout 0007; Cuebot's tables are not
changed). A frame of a scheduler-managed show whose last run ended with one
of them is relaunched by the scheduler without spending a retry, and one
Cuebot marked DEAD for it (its retries were already spent) goes back to
WAITING. "none" clears the list. Cuebot's own dispatcher (shows it still
dispatches) does not read it.

exit status: 0 set; 1 unknown limit, rollout step missing, or error; 2 bad
usage.
`

func runLimitList(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched limit list", limitListUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, false)
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
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cn, has, code := openLimits(ctx, c, name, v)
	if code != 0 {
		return code
	}
	defer cn.Close()
	denials, perHost := `'{}'::integer[]`, `false`
	if has.denials {
		denials = `COALESCE((SELECT cl.int_denial_exit_statuses FROM cuesched_limit cl WHERE cl.pk_limit_record = lr.pk_limit_record), '{}')`
	}
	if has.perHost {
		perHost = `COALESCE((SELECT cl.b_per_host FROM cuesched_limit cl WHERE cl.pk_limit_record = lr.pk_limit_record), false)`
	}
	rows, err := cn.Pool.Query(ctx, `SELECT lr.str_name, COALESCE(lr.int_max_value, 0), ph.on,
		CASE WHEN ph.on THEN
		  (SELECT count(DISTINCT p.pk_host) FROM layer_limit ll JOIN proc p ON p.pk_layer = ll.pk_layer
		    WHERE ll.pk_limit_record = lr.pk_limit_record)
		ELSE
		  (SELECT COALESCE(SUM(ls.int_running_count), 0) FROM layer_limit ll JOIN layer_stat ls ON ls.pk_layer = ll.pk_layer
		    WHERE ll.pk_limit_record = lr.pk_limit_record) END::bigint, `+denials+`
		FROM limit_record lr CROSS JOIN LATERAL (SELECT `+perHost+` AS on) ph ORDER BY lr.str_name`)
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	defer rows.Close()
	fmt.Fprintf(c.Stdout, "%-24s %6s %-6s %8s  %s\n", "LIMIT", "MAX", "COUNTS", "RUNNING", "DENIAL EXIT STATUSES")
	for rows.Next() {
		var n string
		var maxv, running int64
		var on bool
		var codes []int32
		if err := rows.Scan(&n, &maxv, &on, &running, &codes); err != nil {
			fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
			return 1
		}
		counts := "frames"
		if on {
			counts = "hosts"
		}
		fmt.Fprintf(c.Stdout, "%-24s %6d %-6s %8d  %s\n", n, maxv, counts, running, statusList(codes))
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	switch {
	case !has.denials:
		fmt.Fprintf(c.Stdout, "(rollout step 0007_limit_settings is not applied: run cuesched migrate up)\n")
	case !has.perHost:
		fmt.Fprintf(c.Stdout, "(rollout step 0010_limit_per_host is not applied: run cuesched migrate up)\n")
	}
	return 0
}

func statusList(codes []int32) string {
	if len(codes) == 0 {
		return "-"
	}
	s := make([]string, len(codes))
	for i, v := range codes {
		s[i] = strconv.Itoa(int(v))
	}
	return strings.Join(s, ",")
}

// parseStatuses reads "1,42" or "none" into sorted distinct exit statuses.
func parseStatuses(arg string) ([]int32, error) {
	if arg == "none" {
		return []int32{}, nil
	}
	seen := map[int32]bool{}
	var out []int32
	for _, f := range strings.Split(arg, ",") {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil || f == "" {
			return nil, fmt.Errorf("exit status %q is not an integer (want e.g. 42 or 42,43, or none)", f)
		}
		if v == 0 {
			return nil, errors.New("exit status 0 is success, not a denial")
		}
		if !seen[int32(v)] {
			seen[int32(v)] = true
			out = append(out, int32(v))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func runLimitSetDenials(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched limit set-denials", limitSetDenialsUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, false)
	pos, code, done := fs.ParseInterleaved(args)
	if done {
		return code
	}
	v, code := cf.Resolve(c, name, false)
	if code != 0 {
		return code
	}
	if len(pos) != 2 {
		return fs.Fail("want a limit and its exit statuses (or none), got %d argument(s)", len(pos))
	}
	codes, err := parseStatuses(pos[1])
	if err != nil {
		return fs.Fail("%v", err)
	}
	if code := setLimit(ctx, c, name, v, pos[0], func(h limitSchema) bool { return h.denials },
		"table cuesched_limit is missing: rollout step 0007_limit_settings is not applied",
		`INSERT INTO cuesched_limit (pk_limit_record, int_denial_exit_statuses) VALUES ($1, $2)
		ON CONFLICT (pk_limit_record) DO UPDATE SET int_denial_exit_statuses = EXCLUDED.int_denial_exit_statuses, ts_updated = now()`,
		codes); code != 0 {
		return code
	}
	fmt.Fprintf(c.Stdout, "limit %s: denial exit statuses %s\n", pos[0], statusList(codes))
	return 0
}

// setLimit writes one of cuesched's settings of a limit (upsert: $1 the
// limit's id, $2 value) once the database has it (present; else missing
// is the error, with the step to apply).
func setLimit(ctx context.Context, c *cli.Env, name string, v cli.ConnValues, limit string,
	present func(limitSchema) bool, missing, upsert string, value any) int {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cn, has, code := openLimits(ctx, c, name, v)
	if code != 0 {
		return code
	}
	defer cn.Close()
	if !present(has) {
		fmt.Fprintf(c.Stderr, "%s: %s (run cuesched migrate up)\n", name, missing)
		return 1
	}
	id, code := limitID(ctx, c, name, cn, limit)
	if code != 0 {
		return code
	}
	if _, err := cn.Pool.Exec(ctx, upsert, id, value); err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// limitSchema says which of cuesched's limit settings the database has.
type limitSchema struct {
	denials bool // cuesched_limit (rollout 0007)
	perHost bool // cuesched_limit.b_per_host (rollout 0010)
}

// openLimits opens the tool's connections, checks that the database is a
// Cuebot database (rollout.CheckCuebotDatabase, as the other tools do) and
// reports which of cuesched's limit settings exist. code is non-zero on
// failure (the error is printed).
func openLimits(ctx context.Context, c *cli.Env, name string, v cli.ConnValues) (cn *cli.Conns, has limitSchema, code int) {
	cn, code = cli.OpenConns(ctx, c, name, v, 1)
	if code != 0 {
		return nil, has, code
	}
	if code := checkCuebot(ctx, c, name, cn, false); code != 0 {
		cn.Close()
		return nil, has, code
	}
	if err := cn.Pool.QueryRow(ctx, `SELECT to_regclass('cuesched_limit') IS NOT NULL,
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('cuesched_limit')
		          AND attname = 'b_per_host' AND NOT attisdropped)`).Scan(&has.denials, &has.perHost); err != nil {
		cn.Close()
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return nil, has, 1
	}
	return cn, has, 0
}

// limitID finds a limit by name (or id); code is 1, with the error printed,
// when there is none.
func limitID(ctx context.Context, c *cli.Env, name string, cn *cli.Conns, limit string) (string, int) {
	var id string
	err := cn.Pool.QueryRow(ctx, `SELECT pk_limit_record FROM limit_record WHERE str_name = $1 OR pk_limit_record = $1
		ORDER BY (str_name = $1) DESC LIMIT 1`, limit).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		fmt.Fprintf(c.Stderr, "%s: no limit named %q (cuesched limit list)\n", name, limit)
		return "", 1
	}
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return "", 1
	}
	return id, 0
}

const limitSetPerHostUsage = `usage: cuesched limit set-per-host <limit> on|off
                              [--config FILE] [--database-url URL]

Makes the limit node-locked (on) or per-frame again (off, the default and
Cuebot's meaning), in cuesched's own table (cuesched_limit.b_per_host,
rollout 0010; Cuebot's tables are not changed). A node-locked limit of max
K lets at most K hosts hold a seat at once, and a host holding one runs any
number of the limit's frames: the scheduler checks the seat atomically in
its booking script (every instance shares it), releases it when the host's
last frame of the limit ends, and places the limit's frames on hosts that
already hold a seat first. Cuebot's own dispatcher (shows it still
dispatches) keeps counting frames against the same max.

exit status: 0 set; 1 unknown limit, rollout step missing, or error; 2 bad
usage.
`

func runLimitSetPerHost(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched limit set-per-host", limitSetPerHostUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, false)
	pos, code, done := fs.ParseInterleaved(args)
	if done {
		return code
	}
	v, code := cf.Resolve(c, name, false)
	if code != 0 {
		return code
	}
	if len(pos) != 2 {
		return fs.Fail("want a limit and on or off, got %d argument(s)", len(pos))
	}
	var on bool
	switch pos[1] {
	case "on":
		on = true
	case "off":
	default:
		return fs.Fail("want on or off, got %q", pos[1])
	}
	if code := setLimit(ctx, c, name, v, pos[0], func(h limitSchema) bool { return h.perHost },
		"column cuesched_limit.b_per_host is missing: rollout step 0010_limit_per_host is not applied",
		`INSERT INTO cuesched_limit (pk_limit_record, b_per_host) VALUES ($1, $2)
		ON CONFLICT (pk_limit_record) DO UPDATE SET b_per_host = EXCLUDED.b_per_host, ts_updated = now()`,
		on); code != 0 {
		return code
	}
	if on {
		fmt.Fprintf(c.Stdout, "limit %s: node-locked (counts hosts holding a seat)\n", pos[0])
	} else {
		fmt.Fprintf(c.Stdout, "limit %s: per frame (Cuebot's meaning)\n", pos[0])
	}
	return 0
}
