package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cuesched/cuesched/shared/redact"
)

var (
	// ErrSlotBusy means another consumer holds the replication slot (SQLSTATE
	// 55006), or, for a temporary slot, that its name is still taken by a
	// previous session that has not exited yet. It is retriable: Run keeps
	// retrying with backoff, which is how a hot standby waits for the active
	// consumer to die.
	ErrSlotBusy = errors.New("replication slot is busy (held by another consumer)")
	// ErrSlotMissing means a permanent slot does not exist and Config.CreateSlot
	// is false. Run returns it.
	ErrSlotMissing = errors.New("replication slot does not exist")
	// ErrSlotLost means a permanent slot was invalidated by the server
	// (wal_status 'lost', e.g. max_slot_wal_keep_size exceeded) and
	// Config.CreateSlot is false. With CreateSlot the slot is dropped and
	// re-created with a new snapshot instead.
	ErrSlotLost = errors.New("replication slot was invalidated (wal_status lost)")
	// ErrResync, returned (wrapped) by a Consumer method, asks the stream to
	// rebuild the consumer from a fresh consistent snapshot: a temporary slot
	// reconnects and calls Snapshot again; a permanent slot is dropped and
	// re-created with a snapshot (changes not yet acknowledged are covered by
	// the new snapshot, so nothing is lost).
	ErrResync = errors.New("consumer requested a resynchronisation from a new snapshot")

	// ErrRefused, returned (wrapped) by a Consumer method, stops Run for
	// good: the consumer found a condition no retry can fix (e.g. its
	// target belongs to another database). Run returns it.
	ErrRefused = errors.New("consumer refuses to stream")

	errConfig = errors.New("replication: invalid configuration")
)

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// ValidSlotName reports whether name is a legal replication slot name
// (lower-case letters, digits and underscores, at most 63 characters).
func ValidSlotName(name string) bool { return slotNameRE.MatchString(name) }

// SlotInfo is a row of pg_replication_slots.
type SlotInfo struct {
	Name      string
	Plugin    string
	Type      string // "logical" or "physical"
	Database  string
	Temporary bool
	Active    bool
	ActivePID int64
	// RestartLSN is the oldest WAL the slot retains; ConfirmedFlushLSN is
	// the position the consumer acknowledged (streaming resumes after it).
	RestartLSN        LSN
	ConfirmedFlushLSN LSN
	// WALStatus is reserved, extended, unreserved or lost.
	WALStatus string
}

const slotQuery = `SELECT slot_name::text AS name, coalesce(plugin::text, '') AS plugin, slot_type AS type,
  coalesce(database::text, '') AS database, temporary, active, coalesce(active_pid, 0)::int8 AS active_pid,
  coalesce(restart_lsn::text, '0/0') AS restart_lsn, coalesce(confirmed_flush_lsn::text, '0/0') AS confirmed_flush_lsn,
  coalesce(wal_status, '') AS wal_status, current_database()::text AS current_db
FROM pg_replication_slots WHERE slot_name = `

// readSlot reads a slot on any connection (replication or normal) with the
// simple protocol. found is false when the slot does not exist.
func readSlot(ctx context.Context, conn *pgconn.PgConn, name string) (info SlotInfo, currentDB string, found bool, err error) {
	if !ValidSlotName(name) {
		return info, "", false, fmt.Errorf("%w: bad slot name %q", errConfig, name)
	}
	err = simpleQuery(ctx, conn, slotQuery+quoteLiteral(name), func(r Row) error {
		found = true
		var rs, cf string
		errs := []error{}
		get := func(dst *string, col string) {
			v, err := r.String(col)
			errs = append(errs, err)
			*dst = v
		}
		get(&info.Name, "name")
		get(&info.Plugin, "plugin")
		get(&info.Type, "type")
		get(&info.Database, "database")
		get(&rs, "restart_lsn")
		get(&cf, "confirmed_flush_lsn")
		get(&info.WALStatus, "wal_status")
		get(&currentDB, "current_db")
		var e1, e2, e3 error
		info.Temporary, e1 = r.Bool("temporary")
		info.Active, e2 = r.Bool("active")
		info.ActivePID, e3 = r.Int64("active_pid")
		errs = append(errs, e1, e2, e3)
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("read pg_replication_slots: %w", err)
		}
		var perr error
		if info.RestartLSN, perr = pglogrepl.ParseLSN(rs); perr != nil {
			return perr
		}
		if info.ConfirmedFlushLSN, perr = pglogrepl.ParseLSN(cf); perr != nil {
			return perr
		}
		return nil
	})
	return info, currentDB, found, err
}

// ReadSlot returns the named slot's row of pg_replication_slots, or found =
// false. connString is an ordinary (non-replication) connection string.
func ReadSlot(ctx context.Context, connString, name string) (SlotInfo, bool, error) {
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return SlotInfo{}, false, err
	}
	defer conn.Close(context.Background())
	info, _, found, err := readSlot(ctx, conn, name)
	return info, found, err
}

// CreatePermanentSlot creates a permanent pgoutput slot if it does not exist
// yet (no snapshot is exported: use a Stream with CreateSlot for a consistent
// initial load). It returns whether it created the slot and the slot's
// consistent point (zero if it already existed).
func CreatePermanentSlot(ctx context.Context, connString, name string) (created bool, consistentPoint LSN, err error) {
	if !ValidSlotName(name) {
		return false, 0, fmt.Errorf("%w: bad slot name %q", errConfig, name)
	}
	cfg, err := replicationConfig(connString, "")
	if err != nil {
		return false, 0, err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, 0, err
	}
	defer conn.Close(context.Background())
	res, err := pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
		fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'nothing')", name)))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return false, 0, nil
		}
		return false, 0, err
	}
	cp, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	return true, cp, err
}

// DropSlot drops a slot. A missing slot is not an error; a slot held by a
// consumer gives an error wrapping ErrSlotBusy.
func DropSlot(ctx context.Context, connString, name string) error {
	if !ValidSlotName(name) {
		return fmt.Errorf("%w: bad slot name %q", errConfig, name)
	}
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return dropSlotSQL(ctx, conn, name)
}

func dropSlotSQL(ctx context.Context, conn *pgconn.PgConn, name string) error {
	_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = "+quoteLiteral(name)).ReadAll()
	return classifyPG(err)
}

// classifyPG marks a busy slot with ErrSlotBusy.
func classifyPG(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		return fmt.Errorf("%w: %w", ErrSlotBusy, err)
	}
	return err
}

// replicationConfig parses connString and turns it into a logical
// replication connection with the session settings the text decoder needs.
// appName names the walsender session when connString names none (default
// cuesched-replication).
func replicationConfig(connString, appName string) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("%w: connection string: %w", errConfig, redact.Error(err, connString))
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["DateStyle"] = "ISO, MDY"
	cfg.RuntimeParams["TimeZone"] = "UTC"
	cfg.RuntimeParams["IntervalStyle"] = "postgres"
	cfg.RuntimeParams["bytea_output"] = "hex"
	cfg.RuntimeParams["extra_float_digits"] = "3"
	if appName == "" {
		appName = "cuesched-replication"
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = appName
	}
	return cfg, nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// simpleQuery runs sql with the simple protocol (the only one a replication
// connection accepts) and calls fn with every row of every result set,
// decoded by column type.
func simpleQuery(ctx context.Context, conn *pgconn.PgConn, sql string, fn func(Row) error) error {
	mrr := conn.Exec(ctx, sql)
	var ferr error
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		fds := rr.FieldDescriptions()
		var cs *columnSet
		if len(fds) > 0 {
			cols := make([]Column, len(fds))
			for i, fd := range fds {
				cols[i] = Column{Name: fd.Name, TypeOID: fd.DataTypeOID, TypeMod: fd.TypeModifier}
			}
			cs = newColumnSet(cols)
		}
		for ferr == nil && rr.NextRow() {
			raw := rr.Values()
			vals := make([]Datum, len(raw))
			for i, b := range raw {
				if b == nil {
					vals[i] = Datum{State: Null}
					continue
				}
				v, err := DecodeText(cs.cols[i].TypeOID, b)
				if err != nil {
					ferr = fmt.Errorf("column %q: %w", cs.cols[i].Name, err)
					break
				}
				vals[i] = Datum{State: Present, Value: v}
			}
			if ferr == nil {
				ferr = fn(Row{cols: cs, values: vals})
			}
		}
		if _, err := rr.Close(); err != nil && ferr == nil {
			ferr = err
		}
	}
	if err := mrr.Close(); err != nil && ferr == nil {
		ferr = err
	}
	return ferr
}
