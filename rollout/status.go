package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"
	schedexplain "github.com/cuesched/cuesched/scheduler/explain"
	"github.com/cuesched/cuesched/scheduler/reservations"
)

// StatusOptions tune Status.
type StatusOptions struct {
	// Audit runs accounting.Audit (needs Redis) for the drift summary.
	Audit bool
	// AuditSample is how many drifts to keep verbatim (default 10).
	AuditSample int
}

// StatusReport is "cuesched status": the cuesched processes connected to
// the database, the loop leader, the replication slots, the managed shows,
// the rollout state and the Redis drift.
type StatusReport struct {
	Database string    `json:"database"`
	Time     time.Time `json:"time"`
	// Rollout summarises migrations.Status.
	Rollout RolloutSummary `json:"rollout"`
	// Instances are the scheduler, sidecar and other cuesched processes
	// seen in pg_stat_activity (application_name, see AppName).
	Instances []Instance `json:"instances"`
	// Leader holds the accounting loop lock (nil: nobody).
	Leader *Leader `json:"leader"`
	// Slots are this database's cuesched replication slots.
	Slots []Slot `json:"slots"`
	// Redis is the accounting Redis.
	Redis RedisState `json:"redis"`
	// Managed are the scheduler-managed shows.
	Managed []ShowInfo `json:"managed_shows"`
	// Reservations are the firm host reservations held in Redis
	// (scheduler/reservations).
	Reservations []reservations.Reservation `json:"reservations"`
	// ReservationsSkipped says why they were not read ("" when they were).
	ReservationsSkipped string `json:"reservations_skipped,omitempty"`
	// Audit is the drift summary (nil when skipped or impossible).
	Audit *AuditSummary `json:"audit,omitempty"`
	// AuditSkipped says why there is no audit ("" when there is one).
	AuditSkipped string `json:"audit_skipped,omitempty"`
	// SilentProcs are procs of managed shows older than their layer's
	// longest frame on hosts whose RQD has not reported for
	// schedexplain.SilentAfter: probably dead with their RQD, RUNNING and
	// booked until Cuebot clears them.
	SilentProcs []schedexplain.SilentProc `json:"silent_procs,omitempty"`
	// Attention lists what an operator should act on; empty means healthy.
	Attention []string `json:"attention"`
}

// RolloutSummary is the part of migrations.Report status shows.
type RolloutSummary struct {
	Ready        bool     `json:"ready"`
	Applied      int      `json:"applied"`
	Pending      []string `json:"pending,omitempty"`
	ManagedShows int      `json:"managed_shows"`
	WALLevel     string   `json:"wal_level"`
	// Warnings are migrations.Report.Warnings.
	Warnings []string `json:"warnings,omitempty"`
}

// AuditSummary condenses an accounting.AuditReport.
type AuditSummary struct {
	Shows  int `json:"shows"`
	Procs  int `json:"procs"`
	Keys   int `json:"keys"`
	Drifts int `json:"drifts"`
	// ByKind counts drifts per kind (counter, cap, marker, record).
	ByKind map[string]int `json:"by_kind,omitempty"`
	// ByTable counts drifts per key namespace (sub, folder, job, layer,
	// point, proc, show, epoch).
	ByTable map[string]int `json:"by_table,omitempty"`
	// Sample are the first drifts.
	Sample []accounting.Drift `json:"sample,omitempty"`
}

// Healthy: nothing needs attention.
func (r *StatusReport) Healthy() bool { return len(r.Attention) == 0 }

// Status gathers the report. It only reads. Problems of the system are in
// Attention; an error means the report could not be made (e.g. Postgres
// unreachable).
func (t *Tool) Status(ctx context.Context, o StatusOptions) (*StatusReport, error) {
	if o.AuditSample <= 0 {
		o.AuditSample = 10
	}
	r := &StatusReport{Time: time.Now().UTC()}
	attention := func(format string, a ...any) { r.Attention = append(r.Attention, fmt.Sprintf(format, a...)) }

	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	rep, err := migrations.Status(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	r.Database = rep.Database
	r.Rollout = RolloutSummary{Ready: rep.Ready(), Applied: len(rep.Applied), ManagedShows: rep.ManagedShows,
		WALLevel: rep.WALLevel, Warnings: rep.Warnings}
	for _, s := range rep.Pending {
		r.Rollout.Pending = append(r.Rollout.Pending, s.String())
	}

	ob, err := t.observe(ctx, migrations.SidecarSlotPrefix, migrations.SlotPrefix)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	r.Instances, r.Leader, r.Slots = ob.instances, ob.leader, ob.slots

	if rep.SchedulerManagedColumn {
		list, err := t.listShows(ctx) // probes Redis too
		if err != nil {
			return nil, fmt.Errorf("status: %w", err)
		}
		r.Redis = list.Redis
		for _, s := range list.Shows {
			if s.Managed {
				r.Managed = append(r.Managed, s)
			}
		}
	} else {
		r.Redis = t.probeRedis(ctx)
	}

	// What needs attention.
	if !r.Rollout.Ready {
		attention("the rollout is not complete (%s): run cuesched migrate up", strings.Join(rolloutGaps(rep), "; "))
	}
	for _, w := range rep.Warnings {
		if isGuardrailWarning(w) {
			continue // reported below, restricted to this database
		}
		attention("%s", w)
	}
	if w := guardrail(rep); w != "" {
		attention("%s", w)
	}
	if rep.ManagedShows > 0 {
		switch {
		case r.Leader == nil && countRole(r.Instances, appname.RoleScheduler) == 0:
			attention("%d show(s) are scheduler-managed but no scheduler is connected and nobody holds the accounting loop lock", rep.ManagedShows)
		case r.Leader == nil:
			attention("no scheduler holds the accounting loop lock: recompute, limit reseed and seeding of flipped shows are not running")
		}
	}
	if rep.SchedulerManagedColumn && rep.CuebotSchema {
		sp, err := schedexplain.SilentProcs(ctx, t.pool, schedexplain.SilentAfter)
		if err != nil {
			attention("could not look for procs on silent hosts: %v", err)
		}
		r.SilentProcs = sp
		if len(sp) > 0 {
			var cores int64
			for _, p := range sp {
				cores += p.Cores
			}
			p := sp[0]
			attention("%d proc(s) of managed shows (%d cores) have run past their layer's longest frame on hosts whose RQD has not reported for over %s "+
				"(e.g. %s/%s on %s: %s old, host silent for %s): their frames stay RUNNING and their cores booked until Cuebot clears the procs; check those RQDs (rollout runbook: RQD dies mid-frame)",
				len(sp), cores/100, schedexplain.SilentAfter, p.Job, p.Frame, p.Host, p.Age, p.Silent)
		}
	}
	for _, s := range ob.slots {
		if !s.Active && !s.Temporary && s.Sidecar {
			attention("sidecar slot %s is inactive and retains %s of WAL: no sidecar streams it", s.Name, humanBytes(s.RetainedBytes))
		}
		if s.WALStatus == "lost" || s.WALStatus == "unreserved" {
			attention("slot %s has wal_status %q: the server has removed or is about to remove WAL it needs", s.Name, s.WALStatus)
		}
	}

	switch {
	case !r.Redis.Configured:
		r.ReservationsSkipped = "no Redis given"
	case !r.Redis.Reachable:
		r.ReservationsSkipped = "Redis unreachable"
	default:
		rs, err := t.reservationsOf(ctx)
		if err != nil {
			r.ReservationsSkipped = err.Error()
			attention("could not read the host reservations: %v", err)
		}
		r.Reservations = rs
	}
	switch {
	case !r.Redis.Configured:
		r.AuditSkipped = "no Redis given"
	case !r.Redis.Reachable:
		r.AuditSkipped = "Redis unreachable"
		attention("Redis unreachable: %s", r.Redis.Error)
	default:
		if rep.ManagedShows > 0 && r.Redis.Epoch == "" {
			attention("Redis is not bootstrapped (acct:epoch missing): every scheduler has paused booking until the leader rebuilds it")
		}
		for _, s := range r.Managed {
			if s.Seeded != SeededYes {
				attention("managed show %q is not seeded in Redis (%s): the scheduler does not book it yet", s.Name, s.Seeded)
			}
		}
		if !o.Audit {
			r.AuditSkipped = "--no-audit"
			break
		}
		if !rep.SchedulerManagedColumn {
			r.AuditSkipped = "no b_scheduler_managed column"
			break
		}
		if rep.ManagedShows == 0 {
			// Nothing is accounted in Redis; the audit would only report
			// a missing acct:epoch, which is normal before any show is
			// managed.
			r.AuditSkipped = "no managed shows"
			break
		}
		ar, err := accounting.Audit(ctx, t.pool, t.pub)
		if err != nil {
			r.AuditSkipped = "audit failed: " + err.Error()
			attention("the accounting audit failed: %v", err)
			break
		}
		r.Audit = summarize(ar, o.AuditSample)
		if r.Audit.Drifts > 0 {
			attention("accounting drift: %d difference(s) between Redis and Postgres (%s); bookings in flight show as transient drift: confirm with cuesched accounting audit",
				r.Audit.Drifts, countsString(r.Audit.ByTable))
		}
	}
	return r, nil
}

// guardrail is the spec's guardrail narrowed to this database: shows are
// managed but no sidecar slot of this database is active ("" when fine).
func guardrail(rep migrations.Report) string {
	here, elsewhere := sidecarSlots(rep)
	if rep.ManagedShows == 0 || len(here) > 0 {
		return ""
	}
	msg := fmt.Sprintf("%d show(s) are scheduler-managed but no sidecar slot (%s*) of database %s is active: their releases do not reach Redis and their counters only grow; start cuesched sidecar",
		rep.ManagedShows, migrations.SidecarSlotPrefix, rep.Database)
	if len(elsewhere) > 0 {
		msg += " (active sidecar slots of other databases: " + strings.Join(elsewhere, ", ") + ")"
	}
	return msg
}

// isGuardrailWarning recognises migrations.Status's cluster-wide guardrail
// warning, which Status replaces by a check restricted to this database.
func isGuardrailWarning(w string) bool {
	return strings.Contains(w, "no sidecar replication slot") && strings.Contains(w, migrations.SidecarSlotPrefix)
}

func countRole(in []Instance, role string) int {
	n := 0
	for _, i := range in {
		if i.Role == role {
			n++
		}
	}
	return n
}

func summarize(ar *accounting.AuditReport, sample int) *AuditSummary {
	s := &AuditSummary{Shows: ar.Shows, Procs: ar.Procs, Keys: ar.Keys, Drifts: len(ar.Drifts),
		ByKind: map[string]int{}, ByTable: map[string]int{}}
	for i, d := range ar.Drifts {
		s.ByKind[d.Kind]++
		s.ByTable[keyTable(d.Key)]++
		if i < sample {
			s.Sample = append(s.Sample, d)
		}
	}
	return s
}

// keyTable names the namespace of an accounting key: acct:sub:... -> sub.
func keyTable(key string) string {
	switch key {
	case publisher.EpochKey:
		return "epoch"
	case publisher.SeqKey:
		return "seq"
	}
	rest, ok := strings.CutPrefix(key, "acct:")
	if !ok {
		return "other"
	}
	ns, _, _ := strings.Cut(rest, ":")
	return ns
}

func countsString(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// WriteJSON writes the report as indented JSON.
func (r *StatusReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Write writes the report for a person.
func (r *StatusReport) Write(w io.Writer) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	rollout := "ready"
	if !r.Rollout.Ready {
		rollout = "NOT ready"
		if len(r.Rollout.Pending) > 0 {
			rollout += ", pending " + strings.Join(r.Rollout.Pending, ", ")
		}
	}
	p("database:   %s (rollout %s; %d step(s) applied; wal_level %s)", r.Database, rollout, r.Rollout.Applied, r.Rollout.WALLevel)
	if r.Leader != nil {
		p("loop leader: %s, since %s", r.Leader, r.Leader.Since.UTC().Format(time.RFC3339))
	} else {
		p("loop leader: none (nobody holds the accounting loop lock)")
	}

	p("\ninstances:")
	if len(r.Instances) == 0 {
		p("  none connected (cuesched processes identify themselves as %s)", appname.Format("<role>", "<instance>"))
	} else {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ROLE\tINSTANCE\tCONNS\tFROM\tSINCE\tSTATE")
		for _, in := range r.Instances {
			var state []string
			if in.Leader {
				state = append(state, "loop leader")
			}
			if len(in.Slots) > 0 {
				state = append(state, "streams "+strings.Join(in.Slots, ", "))
			}
			if in.Role == appname.RoleSidecar && len(in.Slots) == 0 {
				state = append(state, "standby (holds no slot)")
			}
			if in.Role == appname.RoleScheduler && !in.Leader {
				state = append(state, "follower")
			}
			since := ""
			if len(in.Conns) > 0 {
				since = in.Conns[0].Since.UTC().Format(time.RFC3339)
			}
			name := in.Name
			if name == "" {
				name = "(unnamed)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\n", in.Role, name, len(in.Conns), strings.Join(in.Addrs(), ","), since, strings.Join(state, "; "))
		}
		_ = tw.Flush()
	}

	p("\nreplication slots:")
	if len(r.Slots) == 0 {
		p("  none (no %s* slot in this database)", migrations.SlotPrefix)
	} else {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  SLOT\tKIND\tSTATE\tHOLDER\tLAG\tRETAINED WAL\tWAL STATUS")
		for _, s := range r.Slots {
			kind := "permanent"
			if s.Temporary {
				kind = "temporary"
			}
			if s.Sidecar {
				kind += ", sidecar"
			}
			state, holder := "inactive", "-"
			if s.Active {
				state = "active"
				holder = fmt.Sprintf("%s (pid %d)", orDash(s.Holder), s.ActivePID)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, kind, state, holder, humanBytes(s.LagBytes), humanBytes(s.RetainedBytes), orDash(s.WALStatus))
		}
		_ = tw.Flush()
	}

	p("\nredis:")
	switch {
	case !r.Redis.Configured:
		p("  not given (--redis-url): seeding and drift not checked")
	case !r.Redis.Reachable:
		p("  UNREACHABLE: %s", r.Redis.Error)
	default:
		boot := "bootstrapped (epoch " + r.Redis.Epoch + ")"
		if r.Redis.Epoch == "" {
			boot = "NOT bootstrapped (acct:epoch missing)"
		}
		lsn := r.Redis.SidecarLSN
		if lsn == "" {
			lsn = "none"
		}
		p("  reachable, %s, sidecar checkpoint %s", boot, lsn)
	}

	p("\nmanaged shows: %d", len(r.Managed))
	if len(r.Managed) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  SHOW\tACTIVE\tSEEDED\tPROCS\tCORES")
		for _, s := range r.Managed {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\n", s.Name, yesNo(s.Active), s.Seeded, s.Procs, cores(s.Centicores))
		}
		_ = tw.Flush()
	}

	writeReservations(&b, r)

	p("\ndrift:")
	switch {
	case r.Audit == nil:
		p("  not audited (%s)", r.AuditSkipped)
	case r.Audit.Drifts == 0:
		p("  none (%d show(s), %d proc(s), %d key(s) compared)", r.Audit.Shows, r.Audit.Procs, r.Audit.Keys)
	default:
		p("  %d difference(s) over %d show(s), %d proc(s), %d key(s)", r.Audit.Drifts, r.Audit.Shows, r.Audit.Procs, r.Audit.Keys)
		p("  by table: %s", countsString(r.Audit.ByTable))
		p("  by kind:  %s", countsString(r.Audit.ByKind))
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  KIND\tKEY\tFIELD\tREDIS\tPOSTGRES")
		for _, d := range r.Audit.Sample {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", d.Kind, d.Key, orDash(d.Field), d.Redis, d.Postgres)
		}
		_ = tw.Flush()
		if len(r.Audit.Sample) < r.Audit.Drifts {
			p("  ... %d more: cuesched accounting audit lists them all", r.Audit.Drifts-len(r.Audit.Sample))
		}
	}

	if len(r.Attention) == 0 {
		p("\nstatus: OK")
	} else {
		p("\nstatus: NEEDS ATTENTION")
		for _, a := range r.Attention {
			p("  - %s", a)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
