package replication

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
)

// Tables tells a consumer's own tables apart from same-named tables in other
// schemas. It maps each table name the consumer handles to the schema that
// name resolves to on the connection's search_path: the table its own
// unqualified queries (snapshot, lookups) read. A publication may carry a
// table of the same name in another schema (shadow.proc next to
// public.proc); a streamed Relation is one of the consumer's tables only if
// its namespace is the schema its name resolved to (Owns).
type Tables map[string]string

// Owns reports whether rel is one of the tables: its name is in t and its
// namespace is the schema that name resolved to.
func (t Tables) Owns(rel *Relation) bool {
	if rel == nil {
		return false
	}
	schema, ok := t[rel.Table]
	return ok && schema == rel.Schema
}

// Ignored remembers the relations a consumer has ignored, so that each is
// logged once. The zero value is ready; it is not safe for concurrent use.
type Ignored struct{ seen map[string]bool }

// Admit reports whether ch is of one of the tables (Owns). A change of any
// other relation is ignored, logged once per relation with its LSN: at INFO
// for a same-named table in another schema (its rows are not Cuebot's, and
// applying them would corrupt the consumer's state), at DEBUG for any other
// table the publication carries.
func (t Tables) Admit(ch *Change, ig *Ignored, log hclog.Logger) bool {
	rel := ch.Relation
	if t.Owns(rel) {
		return true
	}
	name := "?"
	if rel != nil {
		name = rel.QualifiedName()
	}
	if ig.seen[name] {
		return false
	}
	if ig.seen == nil {
		ig.seen = map[string]bool{}
	}
	ig.seen[name] = true
	if rel != nil {
		if schema, lookAlike := t[rel.Table]; lookAlike {
			log.Info("ignoring changes of a table that is not Cuebot's (same name, another schema)",
				"relation", name, "cuebot_table", schema+"."+rel.Table, "op", ch.Op, "lsn", ch.LSN)
			return false
		}
	}
	log.Debug("ignoring changes of a relation this consumer does not read", "relation", name, "op", ch.Op, "lsn", ch.LSN)
	return false
}

// String lists the tables as schema.table, sorted (for logs).
func (t Tables) String() string {
	out := make([]string, 0, len(t))
	for name, schema := range t {
		out = append(out, schema+"."+name)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// ResolveTables finds the schema each of names resolves to on the search_path
// of the connection query runs on (to_regclass, as an unqualified name in
// any other query would). query runs sql (no parameters, so it works in a
// snapshot transaction on a replication connection) and calls fn with each
// row's columns as text. A name that does not resolve to a table (missing,
// or a view) is a configuration error, which makes Stream.Run return when a
// Consumer's Snapshot or Resume returns it: the consumer could not tell its
// rows from anyone else's.
func ResolveTables(ctx context.Context, query TextQuery, names ...string) (Tables, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no table to resolve", errConfig)
	}
	lits := make([]string, len(names))
	for i, n := range names {
		if !identRE.MatchString(n) || strings.ToLower(n) != n {
			return nil, fmt.Errorf("%w: table name %q is not a plain lower-case identifier", errConfig, n)
		}
		lits[i] = "'" + n + "'"
	}
	sql := `SELECT t.name, n.nspname::text
		FROM unnest(ARRAY[` + strings.Join(lits, ", ") + `]::text[]) AS t(name)
		JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(pg_catalog.quote_ident(t.name))
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p')`
	t := Tables{}
	err := query(ctx, sql, func(cols []string) error {
		if len(cols) != 2 || cols[0] == "" || cols[1] == "" {
			return fmt.Errorf("replication: resolve tables: unexpected row %q", cols)
		}
		t[cols[0]] = cols[1]
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("replication: resolve the schema of %s: %w", strings.Join(names, ", "), err)
	}
	var missing []string
	for _, n := range names {
		if _, ok := t[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: no table %s on the search_path", errConfig, strings.Join(missing, ", "))
	}
	return t, nil
}

// TextQuery runs sql and calls fn with each row's columns as text ("" for
// NULL): what ResolveTables and the consumers' seeding queries need, from a
// snapshot or from a plain connection alike.
type TextQuery func(ctx context.Context, sql string, fn func(cols []string) error) error

// SnapshotText adapts a SnapshotQuerier to a TextQuery.
func SnapshotText(q SnapshotQuerier) TextQuery {
	return func(ctx context.Context, sql string, fn func([]string) error) error {
		return q.Query(ctx, sql, func(r Row) error {
			cols := make([]string, r.Len())
			for i := range cols {
				if d := r.At(i); d.State == Present {
					cols[i] = fmt.Sprint(d.Value)
				}
			}
			return fn(cols)
		})
	}
}

// Queryer is what QueryText needs: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// QueryText adapts a pool, connection or transaction to a TextQuery.
func QueryText(q Queryer) TextQuery {
	return func(ctx context.Context, sql string, fn func([]string) error) error {
		rows, err := q.Query(ctx, sql)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return err
			}
			cols := make([]string, len(vals))
			for i, v := range vals {
				if v != nil {
					cols[i] = fmt.Sprint(v)
				}
			}
			if err := fn(cols); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}
