package migrations

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// advisoryLockKey is the session advisory lock Up holds ("cuesched" as a
// 64-bit integer). Any other tool may use it to serialize with migrate up.
const advisoryLockKey int64 = 0x6375657363686564

// Plan returns the rollout steps not yet recorded in the version table of
// the database conn is connected to, in the order Up would apply them. It
// only reads.
func Plan(ctx context.Context, conn *pgx.Conn) ([]Step, error) {
	steps, err := Steps()
	if err != nil {
		return nil, err
	}
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}
	var pending []Step
	for _, s := range steps {
		if _, ok := applied[s.Version]; !ok {
			pending = append(pending, s)
		}
	}
	return pending, nil
}

type appliedRow struct {
	name, checksum string
}

// appliedVersions reads the version table; a missing table means nothing
// is applied.
func appliedVersions(ctx context.Context, conn *pgx.Conn) (map[int]appliedRow, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: look up %s: %w", VersionTable, err)
	}
	out := map[int]appliedRow{}
	if !exists {
		return out, nil
	}
	rows, err := conn.Query(ctx, `SELECT version, name, checksum FROM `+VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", VersionTable, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var r appliedRow
		if err := rows.Scan(&v, &r.name, &r.checksum); err != nil {
			return nil, err
		}
		out[v] = r
	}
	return out, rows.Err()
}

// Up applies the pending rollout steps in order and returns those it
// applied. Each step runs in its own transaction together with its row in
// the version table (no-transaction steps run statement by statement and
// are recorded afterwards). A session advisory lock serializes concurrent
// callers: a second Up waits for the first and then finds nothing to do.
// On error the steps applied so far stay applied and are returned.
//
// Up does not run Preflight; callers that target a live database should.
func Up(ctx context.Context, conn *pgx.Conn) (applied []Step, err error) {
	if err := advisoryLock(ctx, conn); err != nil {
		return nil, err
	}
	defer func() {
		// Unlock on a fresh context so a cancelled ctx still releases
		// the lock (it would be released with the session anyway).
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, advisoryLockKey); uerr != nil && err == nil && !conn.IsClosed() {
			err = fmt.Errorf("migrations: release advisory lock: %w", uerr)
		}
	}()
	pending, err := Plan(ctx, conn)
	if err != nil {
		return nil, err
	}
	for _, s := range pending {
		if err := applyStep(ctx, conn, s); err != nil {
			return applied, err
		}
		applied = append(applied, s)
	}
	return applied, nil
}

// lockPollInterval is how often Up retries the advisory lock while another
// Up holds it.
const lockPollInterval = 100 * time.Millisecond

// advisoryLock takes the session advisory lock by polling
// pg_try_advisory_lock rather than blocking in pg_advisory_lock: a session
// blocked inside a statement keeps a snapshot open, and CREATE INDEX
// CONCURRENTLY in the session holding the lock waits for every older
// snapshot to go away, which would deadlock the two.
func advisoryLock(ctx context.Context, conn *pgx.Conn) error {
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, advisoryLockKey).Scan(&ok); err != nil {
			return fmt.Errorf("migrations: take advisory lock: %w", err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrations: waiting for another migrate up to finish: %w", ctx.Err())
		case <-time.After(lockPollInterval):
		}
	}
}

const recordStep = `INSERT INTO ` + VersionTable + ` (version, name, checksum) VALUES ($1, $2, $3)
	ON CONFLICT (version) DO NOTHING`

func applyStep(ctx context.Context, conn *pgx.Conn, s Step) error {
	if s.NoTransaction {
		stmts := SplitStatements(s.SQL)
		for _, stmt := range stmts {
			if err := dropInvalidIndex(ctx, conn, stmt); err != nil {
				return stepError(s, err)
			}
			if _, err := conn.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
				return stepError(s, err)
			}
		}
		if _, err := conn.Exec(ctx, recordStep, s.Version, s.Name, s.Checksum); err != nil {
			return stepError(s, err)
		}
		return nil
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, recordStep, s.Version, s.Name, s.Checksum)
		return err
	})
	if err != nil {
		return stepError(s, err)
	}
	return nil
}

func stepError(s Step, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return fmt.Errorf("migrations: step %s: %w (a long-running transaction holds a lock on the table; nothing was changed by this step, run migrate up again)", s, err)
	}
	return fmt.Errorf("migrations: step %s (%s): %w", s, s.File, err)
}

var createIndexConcurrently = regexp.MustCompile(`(?is)^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+("?[A-Za-z_][A-Za-z0-9_]*"?)`)

// dropInvalidIndex: an interrupted CREATE INDEX CONCURRENTLY leaves an
// INVALID index behind, which IF NOT EXISTS would then skip forever. Before
// such a statement, an invalid index of exactly that name is dropped (it is
// unused by the planner anyway).
func dropInvalidIndex(ctx context.Context, conn *pgx.Conn, stmt string) error {
	m := createIndexConcurrently.FindStringSubmatch(stripComments(stmt))
	if m == nil {
		return nil
	}
	name := strings.Trim(m[1], `"`)
	var invalid bool
	err := conn.QueryRow(ctx, `SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)`, name).Scan(&invalid)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !invalid) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+pgx.Identifier{name}.Sanitize(), pgx.QueryExecModeSimpleProtocol)
	return err
}

// ApplyBaseline creates the Cuebot-compatible baseline schema and its seed
// rows in one transaction. It is for demos and tests and refuses a database
// that already has any table, view or sequence outside the system schemas.
// It does not apply the rollout; call Up afterwards.
func ApplyBaseline(ctx context.Context, conn *pgx.Conn) error {
	var n int
	var sample []string
	err := conn.QueryRow(ctx, `
		SELECT count(*), coalesce((array_agg(n.nspname || '.' || c.relname ORDER BY c.relname))[1:5], '{}')
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE c.relkind IN ('r', 'v', 'm', 'S', 'p', 'f')
		   AND n.nspname NOT IN ('pg_catalog', 'information_schema')
		   AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%'`).Scan(&n, &sample)
	if err != nil {
		return fmt.Errorf("migrations: inspect database: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("migrations: refusing to create the baseline schema in database %q: it is not empty (%d relations, e.g. %s); --baseline is only for an empty database",
			conn.Config().Database, n, strings.Join(sample, ", "))
	}
	files, err := Baseline()
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, f := range files {
			if _, err := tx.Exec(ctx, f.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("migrations: %s: %w", f.Name, err)
			}
		}
		return nil
	})
}

// SplitStatements splits SQL text into statements at top-level semicolons,
// honouring quotes, dollar quotes and comments. Statements that are empty
// or only comments are dropped.
func SplitStatements(sql string) []string {
	var out []string
	start := 0
	i := 0
	n := len(sql)
	flush := func(end int) {
		stmt := strings.TrimSpace(sql[start:end])
		if strings.TrimSpace(stripComments(stmt)) != "" {
			out = append(out, stmt)
		}
	}
	for i < n {
		c := sql[i]
		switch {
		case c == '-' && i+1 < n && sql[i+1] == '-':
			for i < n && sql[i] != '\n' {
				i++
			}
			continue
		case c == '/' && i+1 < n && sql[i+1] == '*':
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				i = n
			} else {
				i += end + 4
			}
			continue
		case c == '\'' || c == '"':
			i++
			for i < n {
				if sql[i] == c {
					if i+1 < n && sql[i+1] == c { // doubled quote
						i += 2
						continue
					}
					break
				}
				i++
			}
			i++
			continue
		case c == '$':
			if tag := dollarTag(sql[i:]); tag != "" {
				end := strings.Index(sql[i+len(tag):], tag)
				if end < 0 {
					i = n
				} else {
					i += len(tag) + end + len(tag)
				}
				continue
			}
		case c == ';':
			flush(i)
			start = i + 1
		}
		i++
	}
	flush(n)
	return out
}

var dollarTagRe = regexp.MustCompile(`^\$[A-Za-z_]*\$`)

func dollarTag(s string) string { return dollarTagRe.FindString(s) }

// stripComments removes -- line comments (good enough for the directive
// and regexp checks above; not used to rewrite SQL that is executed).
func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}
