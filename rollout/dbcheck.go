package rollout

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/migrations"
)

// NotCuebotError says that a command was pointed at a database that is not
// the Cuebot database (or not one cuesched was rolled out on), in words an
// operator can act on: which database, on which server, what is missing.
type NotCuebotError struct {
	Database string // current_database()
	Server   string // host:port (or the socket directory) the URL names
	// Missing are the Cuebot tables the database lacks, most telling first.
	Missing []string
	// NoRollout: the Cuebot tables are there but the rollout column
	// show.b_scheduler_managed is not (`cuesched migrate up` was never run).
	NoRollout bool
}

func (e *NotCuebotError) Error() string {
	where := fmt.Sprintf("database %q on %s", e.Database, e.Server)
	if e.NoRollout {
		return where + " is a Cuebot database without the cuesched rollout (no column show.b_scheduler_managed); run `cuesched migrate status` and `cuesched migrate up` on it"
	}
	what := fmt.Sprintf("no table %q", e.Missing[0])
	if n := len(e.Missing) - 1; n == 1 {
		what += " and 1 other Cuebot table"
	} else if n > 1 {
		what += fmt.Sprintf(" and %d other Cuebot tables", n)
	}
	return where + " is not a Cuebot database (" + what + "); point --database-url or CUESCHED_DATABASE_URL at the Cuebot database"
}

// Querier is what CheckCuebotDatabase reads through (a pool, a connection).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckCuebotDatabase is the one check the read-only tools (explain,
// status, show, accounting) make before their own queries, so a wrong
// database URL gets one clear line instead of a raw SQL error such as
// `relation "layer" does not exist`. It returns a *NotCuebotError when a
// Cuebot table is missing, or, with needRollout, when the rollout column
// show.b_scheduler_managed is; cfg (may be nil) names the server in the
// message. Any other error is a failure to ask.
func CheckCuebotDatabase(ctx context.Context, db Querier, cfg *pgx.ConnConfig, needRollout bool) error {
	var (
		dbName  string
		missing []string
		column  bool
	)
	err := db.QueryRow(ctx, `
		SELECT current_database(),
		       coalesce((SELECT array_agg(t ORDER BY o) FROM unnest($1::text[]) WITH ORDINALITY AS u(t, o)
		                  WHERE to_regclass(t) IS NULL), '{}'),
		       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('show')
		                 AND attname = 'b_scheduler_managed' AND NOT attisdropped)`,
		cuebotTablesByTelling()).Scan(&dbName, &missing, &column)
	if err != nil {
		return fmt.Errorf("look for the Cuebot tables: %w", err)
	}
	if len(missing) == 0 && (column || !needRollout) {
		return nil
	}
	return &NotCuebotError{Database: dbName, Server: serverOf(cfg), Missing: missing, NoRollout: len(missing) == 0}
}

// IsNotCuebot reports whether err is (or wraps) a *NotCuebotError.
func IsNotCuebot(err error) bool {
	var nc *NotCuebotError
	return errors.As(err, &nc)
}

// cuebotTablesByTelling is migrations.CuebotTables with the tables every
// tool reads first, so the message names the one a user has heard of.
func cuebotTablesByTelling() []string {
	first := []string{"layer", "job", "frame", "show", "host", "proc"}
	out := append([]string(nil), first...)
	seen := map[string]bool{}
	for _, t := range first {
		seen[t] = true
	}
	for _, t := range migrations.CuebotTables() {
		if !seen[t] {
			out = append(out, t)
		}
	}
	return out
}

func serverOf(cfg *pgx.ConnConfig) string {
	if cfg == nil || cfg.Host == "" {
		return "the configured server"
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return cfg.Host
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}
