package rollout

import (
	"context"
	"errors"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"io"
	"strings"
	"time"

	"github.com/cuesched/cuesched/migrations"
)

// Check is one preflight finding.
type Check struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Blocking: a failed check refuses the flip unless forced.
	Blocking bool `json:"blocking"`
	// Forcible: Force overrides a failed blocking check (some cannot be:
	// without the column there is nothing to flip).
	Forcible bool   `json:"forcible"`
	Detail   string `json:"detail"`
}

// Preflight is what Flip checked before changing anything.
type Preflight struct {
	Show   Show    `json:"show"`
	On     bool    `json:"on"`
	Checks []Check `json:"checks"`
	// StaleMarker: the show is not managed but carries a seeding marker
	// (see Flip).
	StaleMarker bool `json:"stale_marker"`
}

// Refusals are the failed blocking checks.
func (p *Preflight) Refusals() []Check {
	var out []Check
	for _, c := range p.Checks {
		if !c.OK && c.Blocking {
			out = append(out, c)
		}
	}
	return out
}

// Warnings are the failed checks that do not block.
func (p *Preflight) Warnings() []Check {
	var out []Check
	for _, c := range p.Checks {
		if !c.OK && !c.Blocking {
			out = append(out, c)
		}
	}
	return out
}

// Check names.
const (
	CheckRollout     = "rollout"
	CheckCuebot      = "cuebot"
	CheckSidecar     = "sidecar"
	CheckRedis       = "redis"
	CheckBootstrap   = "bootstrap"
	CheckScheduler   = "scheduler"
	CheckBurst       = "burst"
	CheckActive      = "active"
	CheckStaleMarker = "stale-marker"
	CheckSharedLimit = "shared-limit"
)

// Preflight checks whether show can be flipped to on (managed) or off. For
// "on" it checks, in order: the rollout is applied (column, publications,
// replica identity); Cuebot is at least V45 (when its Flyway history is
// readable); a sidecar streams an active slot in this database (named
// with migrations.SidecarSlotPrefix, or streamed by a cuesched sidecar) (without it no release
// reaches Redis and the show's counters only grow); Redis answers; and, as
// warnings: Redis is bootstrapped, a scheduler instance and a loop leader
// are connected, the show has a subscription with burst > 0, the show is
// active. For "off" only the column is required.
func (t *Tool) Preflight(ctx context.Context, show Show, on bool) (*Preflight, error) {
	p := &Preflight{Show: show, On: on}
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	rep, err := migrations.Status(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	add := func(c Check) { p.Checks = append(p.Checks, c) }

	if !rep.SchedulerManagedColumn {
		add(Check{Name: CheckRollout, Blocking: true, Detail: "show.b_scheduler_managed does not exist: run cuesched migrate up first"})
		return p, nil
	}
	if !on {
		add(Check{Name: CheckRollout, OK: true, Detail: "show.b_scheduler_managed exists"})
		return p, nil
	}
	if rep.Ready() {
		add(Check{Name: CheckRollout, OK: true, Detail: "rollout applied (column, publications, proc replica identity)"})
	} else {
		add(Check{Name: CheckRollout, Blocking: true, Forcible: true, Detail: "the rollout is incomplete (" + strings.Join(rolloutGaps(rep), "; ") +
			"): the sidecar cannot stream what it needs; run cuesched migrate up (cuesched migrate status shows the details)"})
	}

	if c, ok, err := t.cuebotVersionCheck(ctx); err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	} else if ok {
		add(c)
	}

	active, elsewhere := sidecarSlots(rep)
	if len(active) > 0 {
		add(Check{Name: CheckSidecar, OK: true, Detail: "a sidecar streams slot " + strings.Join(active, ", ")})
	} else {
		d := fmt.Sprintf("no sidecar streams an active replication slot (named %s* or held by a cuesched sidecar) in database %s: without one, Cuebot's releases of this show never reach Redis and its counters only grow until the show stops booking; start cuesched sidecar next to every Cuebot first", migrations.SidecarSlotPrefix, rep.Database)
		if len(elsewhere) > 0 {
			d += fmt.Sprintf(" (active sidecar slots of other databases do not count: %s)", strings.Join(elsewhere, ", "))
		}
		add(Check{Name: CheckSidecar, Blocking: true, Forcible: true, Detail: d})
	}

	rs := t.probeRedis(ctx)
	switch {
	case !rs.Configured:
		add(Check{Name: CheckRedis, Blocking: true, Forcible: true, Detail: "no Redis given (--redis-url, $CUESCHED_ACCOUNTING_REDIS_URL or accounting.redis_url in --config): cannot check that the scheduler can seed the show"})
	case !rs.Reachable:
		add(Check{Name: CheckRedis, Blocking: true, Forcible: true, Detail: "Redis unreachable (" + rs.Error + "): the scheduler cannot seed or book the show"})
	default:
		add(Check{Name: CheckRedis, OK: true, Detail: "Redis answers"})
		if rs.Epoch == "" {
			add(Check{Name: CheckBootstrap, Detail: "Redis is not bootstrapped (acct:epoch missing): no scheduler has seeded it yet, or this is not the scheduler's Redis; booking stays paused until a scheduler leader bootstraps it"})
		} else {
			add(Check{Name: CheckBootstrap, OK: true, Detail: "Redis is bootstrapped (epoch " + rs.Epoch + ")"})
		}
		seeded, err := t.seeded(ctx, []string{show.ID})
		if err == nil && seeded[show.ID] && !show.Managed {
			p.StaleMarker = true
			add(Check{Name: CheckStaleMarker, Detail: "the show still carries a seeding marker from an earlier managed period (the scheduler's leader has not processed the flip back yet); it is removed before the flip so the scheduler seeds the show afresh"})
		}
	}

	ob, err := t.observe(ctx, migrations.SidecarSlotPrefix, migrations.SlotPrefix)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	switch {
	case ob.leader != nil:
		add(Check{Name: CheckScheduler, OK: true, Detail: "the accounting loops run on " + ob.leader.String()})
	case ob.schedulers() > 0:
		add(Check{Name: CheckScheduler, Detail: fmt.Sprintf("%d scheduler instance(s) connected but none holds the accounting loop lock (yet): nobody will seed the show until one does", ob.schedulers())})
	default:
		add(Check{Name: CheckScheduler, Detail: "no scheduler instance is connected (application_name " + appname.Format(appname.RoleScheduler, "*") + ") and nobody holds the accounting loop lock: the show will not be seeded, hence not booked, until a scheduler runs"})
	}

	var burst int
	if err := t.pool.QueryRow(ctx, `SELECT count(*) FROM subscription WHERE pk_show = $1 AND int_burst > 0`, show.ID).Scan(&burst); err != nil {
		return nil, fmt.Errorf("preflight: subscriptions: %w", err)
	}
	if burst > 0 {
		add(Check{Name: CheckBurst, OK: true, Detail: fmt.Sprintf("%d subscription(s) with burst > 0", burst)})
	} else {
		add(Check{Name: CheckBurst, Detail: "the show has no subscription with burst > 0: the booking script refuses every booking against a zero or missing burst, so the show can never book; subscribe it to an allocation first"})
	}
	if show.Active {
		add(Check{Name: CheckActive, OK: true, Detail: "the show is active"})
	} else {
		add(Check{Name: CheckActive, Detail: "the show is not active (show.b_active = false): the scheduler only dispatches active shows"})
	}
	shared, err := t.sharedLimits(ctx, show.ID)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	if len(shared) == 0 {
		add(Check{Name: CheckSharedLimit, OK: true, Detail: "no limit of the show's pending jobs is shared with a show Cuebot dispatches"})
	} else {
		add(Check{Name: CheckSharedLimit, Detail: "limit(s) " + strings.Join(shared, ", ") + " also cap pending jobs of shows Cuebot still dispatches: " +
			"the scheduler books under a lock on the limit, but Cuebot's dispatcher checks the running count without it, so the two " +
			"together can start more frames than the limit allows for as long as the shows share it: at worst the limit plus the frames Cuebot books from one stale read " +
			"(up to one host's worth of the limited frames per Cuebot booking thread, as LIMIT_MIXED measures); flip those shows too, or give them their own limit"})
	}
	return p, nil
}

// sharedLimits names the limits of the show's pending jobs that also cap
// pending jobs of shows Cuebot dispatches (not scheduler-managed).
func (t *Tool) sharedLimits(ctx context.Context, showID string) ([]string, error) {
	rows, err := t.pool.Query(ctx, `
		SELECT DISTINCT lr.str_name
		  FROM limit_record lr
		  JOIN layer_limit ll ON ll.pk_limit_record = lr.pk_limit_record
		  JOIN layer l ON l.pk_layer = ll.pk_layer
		  JOIN job j ON j.pk_job = l.pk_job
		 WHERE j.pk_show = $1 AND j.str_state = 'PENDING'
		   AND EXISTS (SELECT 1 FROM layer_limit ll2 JOIN layer l2 ON l2.pk_layer = ll2.pk_layer
		                 JOIN job j2 ON j2.pk_job = l2.pk_job JOIN show s2 ON s2.pk_show = j2.pk_show
		                WHERE ll2.pk_limit_record = lr.pk_limit_record AND j2.str_state = 'PENDING'
		                  AND j2.pk_show <> $1 AND NOT s2.b_scheduler_managed)
		 ORDER BY 1`, showID)
	if err != nil {
		return nil, fmt.Errorf("limits shared with shows Cuebot dispatches: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("limits shared with shows Cuebot dispatches: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// cuebotFlagVersion is Cuebot's schema migration that comes with the code
// honouring show.b_scheduler_managed (dispatch skips managed shows, release
// leaves their accounting rows alone, finished frames always unbook).
const cuebotFlagVersion = 45

// cuebotVersionCheck reads (only reads) Cuebot's Flyway history: Flyway
// runs at Cuebot's start-up, so the highest applied version tells which
// Cuebot last started on this database. A Cuebot older than V45 ignores the
// flag and would keep dispatching and accounting a managed show as its own:
// a blocking (forcible) check. ok is false when there is no history to read
// (a database not created by Flyway, or no privilege): nothing is claimed.
func (t *Tool) cuebotVersionCheck(ctx context.Context) (Check, bool, error) {
	var readable bool
	if err := t.pool.QueryRow(ctx, `SELECT to_regclass('flyway_schema_history') IS NOT NULL
		AND has_table_privilege('flyway_schema_history', 'SELECT')`).Scan(&readable); err != nil {
		return Check{}, false, fmt.Errorf("look for flyway_schema_history: %w", err)
	}
	if !readable {
		return Check{}, false, nil
	}
	var v *int
	if err := t.pool.QueryRow(ctx, `SELECT max(version::int) FROM flyway_schema_history
		WHERE success AND version ~ '^[0-9]{1,9}$'`).Scan(&v); err != nil {
		return Check{}, false, fmt.Errorf("read flyway_schema_history: %w", err)
	}
	if v == nil {
		return Check{}, false, nil
	}
	if *v >= cuebotFlagVersion {
		return Check{Name: CheckCuebot, OK: true, Detail: fmt.Sprintf("Cuebot's schema is at V%d (>= V%d: Cuebot honours b_scheduler_managed)", *v, cuebotFlagVersion)}, true, nil
	}
	return Check{Name: CheckCuebot, Blocking: true, Forcible: true, Detail: fmt.Sprintf(
		"Cuebot's schema history stops at V%d: a Cuebot older than V%d does not know b_scheduler_managed and would keep dispatching the show and accounting it as its own next to the scheduler; upgrade Cuebot first (--force only if your Cuebot honours the flag anyway)",
		*v, cuebotFlagVersion)}, true, nil
}

// sidecarSlots splits the active sidecar slots of the report into those of
// its database and those of other databases (slots are cluster-wide; a
// sidecar streaming another database does not release this one's procs).
func sidecarSlots(rep migrations.Report) (here, elsewhere []string) {
	for _, s := range rep.Slots {
		if !s.Active || !s.Sidecar {
			continue
		}
		if s.Database == rep.Database {
			here = append(here, s.Name)
		} else {
			elsewhere = append(elsewhere, s.Name+" ("+s.Database+")")
		}
	}
	return here, elsewhere
}

func rolloutGaps(rep migrations.Report) []string {
	var g []string
	if !rep.CuebotSchema {
		g = append(g, "not a Cuebot database")
	}
	if len(rep.Pending) > 0 {
		g = append(g, fmt.Sprintf("%d step(s) pending", len(rep.Pending)))
	}
	for _, p := range rep.Publications {
		if !p.OK {
			if p.Present {
				g = append(g, "publication "+p.Name+" differs")
			} else {
				g = append(g, "publication "+p.Name+" missing")
			}
		}
	}
	if rep.ProcReplicaIdentity != "full" {
		g = append(g, "proc replica identity is "+orDash(rep.ProcReplicaIdentity)+", not full")
	}
	if len(rep.Unreadable) > 0 {
		g = append(g, "cannot read "+strings.Join(rep.Unreadable, ", "))
	}
	return g
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// FlipRequest asks Flip to move one show.
type FlipRequest struct {
	// Show is a show name or alias.
	Show string
	// On: true moves the show to the scheduler, false back to Cuebot.
	On bool
	// Force flips despite failed forcible checks.
	Force bool
	// Wait > 0 waits that long for the scheduler to seed the show (on) or
	// to close it for booking (off); see WaitSeeded.
	Wait time.Duration
}

// FlipResult says what Flip did.
type FlipResult struct {
	Show      Show       `json:"show"`
	Preflight *Preflight `json:"preflight"`
	// Changed: the UPDATE changed the flag (false: it already had the
	// requested value).
	Changed bool `json:"changed"`
	// Forced: failed checks were overridden.
	Forced bool `json:"forced"`
	// Wait is the final state of the wait (nil when not waited).
	Wait *WaitState `json:"wait,omitempty"`
}

// RefusedError: a blocking preflight check failed and the flip was not
// forced (or cannot be). Nothing was changed.
type RefusedError struct {
	Show     string
	On       bool
	Refusals []Check
	// Forcible: Force would override every refusal.
	Forcible bool
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "refusing to set show %q managed %s: nothing was changed", e.Show, onOff(e.On))
	for _, c := range e.Refusals {
		fmt.Fprintf(&b, "\n  - %s: %s", c.Name, c.Detail)
	}
	if e.Forcible {
		b.WriteString("\n  (--force flips anyway; do so only if you know why the check fails and accept the consequence)")
	}
	return b.String()
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// Flip moves a show between Cuebot and the scheduler: it resolves the name,
// runs Preflight, refuses on a failed blocking check unless forced, removes
// a stale seeding marker (on), flips show.b_scheduler_managed in one UPDATE
// that only changes a row whose value differs (so a repeated flip is a
// reported no-op), explains what happens next on w, and optionally waits
// (WaitSeeded). The error is an *UnknownShowError, a *RefusedError, a
// *WaitError, or a database/Redis error; for a *WaitError the flip itself
// did happen.
func (t *Tool) Flip(ctx context.Context, req FlipRequest, w io.Writer) (*FlipResult, error) {
	show, err := t.FindShow(ctx, req.Show)
	if err != nil {
		return nil, err
	}
	res := &FlipResult{Show: show}
	if show.Name != req.Show {
		fmt.Fprintf(w, "%q is an alias of show %q\n", req.Show, show.Name)
	}

	if show.Managed == req.On {
		fmt.Fprintf(w, "show %q is already %s: nothing changed\n", show.Name, ownerPhrase(req.On))
	} else {
		pf, err := t.Preflight(ctx, show, req.On)
		if err != nil {
			return nil, err
		}
		res.Preflight = pf
		for _, c := range pf.Checks {
			mark := "ok  "
			switch {
			case !c.OK && c.Blocking:
				mark = "FAIL"
			case !c.OK:
				mark = "warn"
			}
			fmt.Fprintf(w, "preflight %s %-12s %s\n", mark, c.Name, c.Detail)
		}
		if refusals := pf.Refusals(); len(refusals) > 0 {
			forcible := true
			for _, c := range refusals {
				forcible = forcible && c.Forcible
			}
			if !req.Force || !forcible {
				return res, &RefusedError{Show: show.Name, On: req.On, Refusals: refusals, Forcible: forcible}
			}
			res.Forced = true
			fmt.Fprintf(w, "--force: flipping despite %d failed check(s)\n", len(refusals))
		}
		if pf.StaleMarker {
			rctx, cancel := t.redisCtx(ctx)
			err := t.pub.Unseed(rctx, show.ID)
			cancel()
			if err != nil {
				return res, fmt.Errorf("remove the stale seeding marker of %q: %w (nothing was changed)", show.Name, err)
			}
			fmt.Fprintf(w, "removed the stale seeding marker of %q\n", show.Name)
		}
		tag, err := t.pool.Exec(ctx, `UPDATE show SET b_scheduler_managed = $2
			WHERE pk_show = $1 AND b_scheduler_managed IS DISTINCT FROM $2`, show.ID, req.On)
		if err != nil {
			return res, fmt.Errorf("flip show %q: %w", show.Name, err)
		}
		res.Changed = tag.RowsAffected() == 1
		res.Show.Managed = req.On
		if res.Changed {
			t.log.Info("show flipped", "show", show.Name, "managed", req.On, "forced", res.Forced)
			fmt.Fprintf(w, "show %q is now %s (show.b_scheduler_managed = %t)\n", show.Name, ownerPhrase(req.On), req.On)
			explain(w, show.Name, req.On)
		} else {
			fmt.Fprintf(w, "show %q was set %s concurrently: nothing changed\n", show.Name, onOff(req.On))
		}
	}
	res.Show.Managed = req.On

	if req.Wait <= 0 {
		return res, nil
	}
	ws, err := t.WaitSeeded(ctx, res.Show, req.On, req.Wait, w)
	res.Wait = ws
	return res, err
}

func ownerPhrase(on bool) string {
	if on {
		return "scheduler-managed"
	}
	return "Cuebot-managed"
}

// explain tells the operator what happens to the show now. The defaults it
// quotes are those of scheduler/accounting.Config and Cuebot.
func explain(w io.Writer, show string, on bool) {
	var lines []string
	if on {
		lines = []string{
			"Cuebot stops dispatching the show at once (its dispatch query skips managed shows). Frames it already runs keep running; when they end Cuebot deletes their procs without touching the accounting tables, and the sidecar applies those releases to Redis (a proc released before the seed was never charged there, and the seed does not adopt it).",
			"The scheduler's loop leader notices the flip within its managed-poll interval (2 s by default) and seeds the show once it has been managed for the flip-settle time (10 s by default): caps, one record per live proc (Cuebot's running frames are adopted), counters, then the marker. Until then the show is \"unseeded\": the scheduler does not book it.",
			"From the seed on, the scheduler books the show and its recompute rewrites the show's accounting rows in Postgres from SUM(proc) every recompute interval (2 min by default); CueGUI's numbers lag by at most that.",
			"Roll back with: cuesched show set-managed " + show + " off",
		}
	} else {
		lines = []string{
			"The scheduler stops booking the show at once: its dispatcher only commits a proc for a managed show, and its loop leader removes the show's seeding marker within its managed-poll interval (2 s by default), after which the booking script answers \"not seeded\". Cuebot dispatches the show again.",
			"Frames the scheduler already started keep running. When they end, Cuebot releases their procs and, seeing a Cuebot-managed show (its cache of the flag expires within 30 s), updates subscription, layer_resource, job_resource, folder_resource and point itself.",
			"The sidecar stops applying this show's releases to Redis at exactly the transaction that flipped it. The show's Redis records and counters stay, unused; if the show is managed again later, the scheduler's seed reconciles them with proc.",
			"Postgres accounting rows were exact as of the scheduler's last recompute (2 min by default). Procs booked or released after it, until Cuebot sees the flip, leave those rows off by their cores: Cuebot's subscription recalculation (recalculate_subs, every 2 h) rewrites the show's subscription rows from proc; Cuebot recalculates folder_resource, job_resource, layer_resource and point nowhere, so an offset there stays (job and layer rows go away with their jobs).",
		}
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  - %s\n", l)
	}
}

// WaitState is what the wait last saw.
type WaitState struct {
	// Seeded: the show's seeding marker is in Redis.
	Seeded bool `json:"seeded"`
	// Epoch is acct:epoch ("" = Redis not bootstrapped: nothing is bookable).
	Epoch string `json:"epoch,omitempty"`
	// Managed is show.b_scheduler_managed now.
	Managed bool `json:"managed"`
	// Leader holds the accounting loop lock (nil: nobody).
	Leader *Leader `json:"leader,omitempty"`
	// Schedulers counts connected scheduler instances.
	Schedulers int `json:"schedulers"`
	// RedisError is the last Redis error ("" when Redis answered).
	RedisError string `json:"redis_error,omitempty"`
	// Waited is how long the wait took.
	Waited time.Duration `json:"waited_ns"`
}

// Bookable: managed, seeded, and Redis bootstrapped.
func (s WaitState) Bookable() bool { return s.Managed && s.Seeded && s.Epoch != "" }

// WaitError: the wait ended (timeout, or the flag changed under it) before
// the scheduler did its part. The flip stays in effect.
type WaitError struct {
	Show  string
	On    bool
	After time.Duration
	State WaitState
	// FlippedBack: someone set the flag back meanwhile.
	FlippedBack bool
}

func (e *WaitError) Error() string {
	var b strings.Builder
	s := e.State
	if e.FlippedBack {
		fmt.Fprintf(&b, "show %q was set managed %s by someone else while waiting", e.Show, onOff(!e.On))
		return b.String()
	}
	if !e.On {
		fmt.Fprintf(&b, "show %q is Cuebot-managed but still carries its seeding marker in Redis after %s: no scheduler leader has processed the flip yet", e.Show, e.After.Round(time.Second))
		b.WriteString("\n  (the scheduler's dispatcher already refuses to commit bookings for an unmanaged show; the marker goes when a leader runs its managed-shows check)")
		b.WriteString("\n  - " + leaderLine(s))
		return b.String()
	}
	fmt.Fprintf(&b, "show %q is scheduler-managed but NOT bookable yet: not seeded in Redis after %s", e.Show, e.After.Round(time.Second))
	b.WriteString("\n  - " + leaderLine(s))
	switch {
	case s.RedisError != "":
		b.WriteString("\n  - Redis: " + s.RedisError)
	case s.Epoch == "":
		b.WriteString("\n  - Redis is not bootstrapped (acct:epoch missing): a leader bootstraps it first; if one runs, check that --redis-url is the scheduler's Redis")
	case s.Leader != nil:
		b.WriteString("\n  - Redis is bootstrapped; the leader should seed the show once it has been managed for its flip-settle time: check its log for \"managed-shows check failed\" or seed errors, and that --redis-url is the scheduler's Redis")
	}
	b.WriteString("\n  Cuebot no longer dispatches the show and the scheduler will not book it until it is seeded.")
	b.WriteString("\n  Check again with: cuesched status   Roll back with: cuesched show set-managed " + e.Show + " off")
	return b.String()
}

func leaderLine(s WaitState) string {
	switch {
	case s.Leader != nil:
		return fmt.Sprintf("loop leader: %s, since %s", s.Leader, s.Leader.Since.UTC().Format(time.RFC3339))
	case s.Schedulers > 0:
		return fmt.Sprintf("loop leader: none: %d scheduler instance(s) connected, none holds the accounting lock", s.Schedulers)
	default:
		return "loop leader: none: no scheduler is connected to this database (is a scheduler running? it identifies itself as " + appname.Format(appname.RoleScheduler, "<instance>") + ")"
	}
}

// WaitSeeded waits up to timeout for the scheduler to act on a flip: for
// on, until the show is seeded in Redis by the loop leader (its marker is
// present and Redis is bootstrapped), so it is bookable; for off, until the
// leader has removed the marker (the show is closed for booking). It
// prints what it waits for and every change of what it sees on w. A
// timeout, or the flag flipping the other way meanwhile, is a *WaitError.
func (t *Tool) WaitSeeded(ctx context.Context, show Show, on bool, timeout time.Duration, w io.Writer) (*WaitState, error) {
	if t.pub == nil {
		return nil, errors.New("cannot wait: no Redis given (--redis-url)")
	}
	start := time.Now()
	deadline := start.Add(timeout)
	if on {
		fmt.Fprintf(w, "waiting up to %s for the scheduler's loop leader to seed %q in Redis (caps, live procs, counters, marker %s)...\n",
			timeout, show.Name, "acct:show:"+show.ID)
	} else {
		fmt.Fprintf(w, "waiting up to %s for the scheduler's loop leader to close %q for booking (remove its marker)...\n", timeout, show.Name)
	}
	var last string
	for {
		st, err := t.waitState(ctx, show)
		if err != nil {
			return nil, err
		}
		st.Waited = time.Since(start)
		if d := describeWait(st, on); d != last {
			fmt.Fprintf(w, "  [%5.1fs] %s\n", st.Waited.Seconds(), d)
			last = d
		}
		switch {
		case st.Managed != on:
			return &st, &WaitError{Show: show.Name, On: on, After: st.Waited, State: st, FlippedBack: true}
		case on && st.Bookable():
			fmt.Fprintf(w, "show %q is seeded: bookable by the scheduler (after %s)\n", show.Name, st.Waited.Round(100*time.Millisecond))
			return &st, nil
		case !on && !st.Seeded && st.RedisError == "":
			fmt.Fprintf(w, "show %q is closed for booking by the scheduler (after %s)\n", show.Name, st.Waited.Round(100*time.Millisecond))
			return &st, nil
		}
		if !time.Now().Before(deadline) {
			return &st, &WaitError{Show: show.Name, On: on, After: st.Waited, State: st}
		}
		tm := time.NewTimer(min(t.opts.PollInterval, time.Until(deadline)))
		select {
		case <-ctx.Done():
			tm.Stop()
			return &st, ctx.Err()
		case <-tm.C:
		}
	}
}

func (t *Tool) waitState(ctx context.Context, show Show) (WaitState, error) {
	var st WaitState
	if err := t.pool.QueryRow(ctx, `SELECT b_scheduler_managed FROM show WHERE pk_show = $1`, show.ID).Scan(&st.Managed); err != nil {
		return st, fmt.Errorf("read show %q: %w", show.Name, err)
	}
	ob, err := t.observe(ctx, migrations.SidecarSlotPrefix, migrations.SlotPrefix)
	if err != nil {
		return st, err
	}
	st.Leader, st.Schedulers = ob.leader, ob.schedulers()
	rs := t.probeRedis(ctx)
	if !rs.Reachable {
		st.RedisError = rs.Error
		return st, nil
	}
	st.Epoch = rs.Epoch
	seeded, err := t.seeded(ctx, []string{show.ID})
	if err != nil {
		st.RedisError = err.Error()
		return st, nil
	}
	st.Seeded = seeded[show.ID]
	return st, nil
}

func describeWait(s WaitState, on bool) string {
	var parts []string
	switch {
	case s.Leader != nil:
		parts = append(parts, "leader "+s.Leader.String())
	case s.Schedulers > 0:
		parts = append(parts, fmt.Sprintf("no leader (%d scheduler instance(s) connected)", s.Schedulers))
	default:
		parts = append(parts, "no scheduler connected")
	}
	switch {
	case s.RedisError != "":
		parts = append(parts, "Redis error: "+s.RedisError)
	case s.Epoch == "":
		parts = append(parts, "Redis not bootstrapped")
	}
	if s.RedisError == "" {
		if s.Seeded {
			parts = append(parts, "marker present")
		} else {
			parts = append(parts, "marker absent")
		}
	}
	if s.Managed != on {
		parts = append(parts, "flag is now "+onOff(s.Managed))
	}
	return strings.Join(parts, "; ")
}
