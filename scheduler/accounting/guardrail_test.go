package accounting

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/migrations"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// streamSidecarSlot holds an active temporary slot with the sidecar prefix,
// as a streaming sidecar does, until the returned func closes it.
func streamSidecarSlot(t *testing.T, dbURL string) func() {
	t.Helper()
	return streamSlotAs(t, dbURL, migrations.SidecarSlotPrefix+"_guard_"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_")), "")
}

// streamSlotAs streams a temporary slot of that name on a replication
// connection with that application_name ("" = the URL's).
func streamSlotAs(t *testing.T, dbURL, slot, app string) func() {
	t.Helper()
	ctx := context.Background()
	u, _ := url.Parse(dbURL)
	q := u.Query()
	q.Set("replication", "database")
	if app != "" {
		q.Set("application_name", app)
	}
	u.RawQuery = q.Encode()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err := pglogrepl.StartReplication(ctx, conn, slot, lsn, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + migrations.PublicationProc + "'"},
	}); err != nil {
		t.Fatal(err)
	}
	closed := false
	stop := func() {
		if !closed {
			closed = true
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = conn.Close(cctx)
		}
	}
	t.Cleanup(stop)
	return stop
}

func TestSidecarGuardrailMetric(t *testing.T) {
	f := newFarm(t)
	s, reg := f.service(Config{})
	ctx := context.Background()
	if err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	const name = "scheduler_accounting_sidecar_unattended"

	// No managed show: nothing to guard.
	f.addShow(showSpec{managed: false, burstCores: 10})
	if err := s.SyncManaged(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, name); v != 0 {
		t.Fatalf("unmanaged only: %s = %v, want 0", name, v)
	}

	// A managed show and no sidecar streaming: the guardrail fires.
	f.addShow(showSpec{managed: true, burstCores: 10})
	if err := s.SyncManaged(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, name); v != 1 {
		t.Fatalf("managed without sidecar: %s = %v, want 1", name, v)
	}

	// A sidecar streams its slot: the guardrail clears.
	stop := streamSidecarSlot(t, f.dbURL)
	if err := s.SyncManaged(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, name); v != 0 {
		t.Fatalf("with a streaming sidecar slot: %s = %v, want 0", name, v)
	}

	// The sidecar goes away: it fires again.
	stop()
	deadline := time.Now().Add(testenv.Patience(5 * time.Second))
	for {
		if err := s.SyncManaged(ctx); err != nil {
			t.Fatal(err)
		}
		if gauge(t, reg, name) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("guardrail did not fire after the sidecar's slot went inactive")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Another tool's slot does not count; a sidecar streaming a slot of
	// any name (sidecar.slot_name is free) does.
	stopOther := streamSlotAs(t, f.dbURL, "othertool_guard", "pg_recvlogical")
	if err := s.SyncManaged(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, name); v != 1 {
		t.Fatalf("another tool's slot: %s = %v, want 1", name, v)
	}
	stopOther()
	streamSlotAs(t, f.dbURL, "studio_release_guard", "cuesched-sidecar/cb1")
	if err := s.SyncManaged(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, name); v != 0 {
		t.Fatalf("a sidecar streaming a custom-named slot: %s = %v, want 0", name, v)
	}
}
