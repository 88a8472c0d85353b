package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Requirements are the replication resources cuesched needs on the server.
type Requirements struct {
	// Slots is how many replication slots cuesched uses in total (the
	// sidecar's and the scheduler's host-cache feed). Existing slots named
	// with SlotPrefix count towards it.
	Slots int
	// Senders is how many WAL sender processes those slots keep busy.
	// Active cuesched slots count towards it.
	Senders int
	// SchemaToCome skips the Cuebot-tables check: the caller creates the
	// baseline schema right after (migrate up --baseline), so everything
	// else is checked before anything is created.
	SchemaToCome bool
}

// DefaultRequirements: one slot and sender for the sidecar, one for the
// scheduler's host-cache feed.
func DefaultRequirements() Requirements { return Requirements{Slots: 2, Senders: 2} }

// PreflightError lists every problem Preflight found.
type PreflightError struct {
	Database string
	Problems []string
}

func (e *PreflightError) Error() string {
	return fmt.Sprintf("preflight failed for database %q:\n  - %s", e.Database, strings.Join(e.Problems, "\n  - "))
}

// Preflight checks that the database conn is connected to can take the
// rollout and run cuesched, with DefaultRequirements. See PreflightWith.
func Preflight(ctx context.Context, conn *pgx.Conn) error {
	return PreflightWith(ctx, conn, DefaultRequirements())
}

// PreflightWith checks, and reports all failures at once as a
// *PreflightError:
//   - the target is a Cuebot database (its core tables exist);
//   - the server is a primary (not a read-only standby);
//   - wal_level is logical;
//   - enough free replication slots and WAL senders for req;
//   - the role can replicate (REPLICATION or superuser).
func PreflightWith(ctx context.Context, conn *pgx.Conn, req Requirements) error {
	st, err := Status(ctx, conn)
	if err != nil {
		return err
	}
	var problems []string
	if !st.CuebotSchema && !req.SchemaToCome {
		problems = append(problems, fmt.Sprintf(
			"database %q is not a Cuebot database: tables %s are missing; point --database-url at Cuebot's database (or use --baseline to create a demo schema in an empty database)",
			st.Database, strings.Join(st.MissingTables, ", ")))
	}
	var standby bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
		return err
	}
	if standby {
		problems = append(problems, "the server is a read-only standby; run migrate against the primary")
	}
	if st.WALLevel != "logical" {
		problems = append(problems, fmt.Sprintf(
			"wal_level is %q but cuesched needs logical decoding: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = 'logical') and restart PostgreSQL (a reload is not enough)",
			st.WALLevel))
	}
	ours, oursActive := 0, 0
	for _, s := range st.Slots {
		ours++
		if s.Active {
			oursActive++
		}
	}
	if need := req.Slots - ours; need > 0 {
		if free := st.MaxReplicationSlots - st.ReplicationSlotsUsed; free < need {
			problems = append(problems, fmt.Sprintf(
				"max_replication_slots = %d with %d in use leaves %d free, cuesched needs %d more: raise max_replication_slots in postgresql.conf (restart required) or drop unused slots",
				st.MaxReplicationSlots, st.ReplicationSlotsUsed, free, need))
		}
	}
	if need := req.Senders - oursActive; need > 0 {
		if free := st.MaxWALSenders - st.WALSendersUsed; free < need {
			problems = append(problems, fmt.Sprintf(
				"max_wal_senders = %d with %d in use leaves %d free, cuesched needs %d more: raise max_wal_senders in postgresql.conf (restart required)",
				st.MaxWALSenders, st.WALSendersUsed, free, need))
		}
	}
	if !st.CanReplicate {
		problems = append(problems, fmt.Sprintf(
			"role %q can neither replicate nor is it a superuser: as a superuser run ALTER ROLE %s REPLICATION (and allow it replication connections in pg_hba.conf)",
			st.Role, quoteIdent(st.Role)))
	}
	if len(problems) > 0 {
		return &PreflightError{Database: st.Database, Problems: problems}
	}
	return nil
}
