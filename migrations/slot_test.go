package migrations_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/cuesched/cuesched/migrations"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// streamSlot creates a temporary pgoutput slot named slot and starts
// streaming from it on a replication connection, so the slot is active
// until the returned stop function (also run at cleanup) closes the
// connection, which drops the temporary slot.
func streamSlot(t testing.TB, dbURL, slot string) (stop func()) {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "database")
	u.RawQuery = q.Encode()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		conn.Close(ctx)
		t.Fatalf("create slot %s: %v", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, lsn, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + migrations.PublicationProc + "'"},
	})
	if err != nil {
		conn.Close(ctx)
		t.Fatalf("start replication: %v", err)
	}
	done := false
	stop = func() {
		if done {
			return
		}
		done = true
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}
	t.Cleanup(stop)
	return stop
}
