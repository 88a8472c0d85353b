package explain

import (
	"context"
	"fmt"
	"time"
)

// SilentAfter is how long a host may go without an RQD report
// (host_stat.ts_ping) before its procs are suspect: three missed reports
// at RQD's default one-minute interval.
const SilentAfter = 3 * time.Minute

// SilentProc is a proc of a scheduler-managed show that has run longer than
// its layer's longest successful frame (layer_usage.int_clock_time_high)
// on a host whose RQD has not reported for longer than SilentAfter.
//
// Such a frame is most likely dead with its RQD (a crash or a host that
// went away mid-frame). Neither cuesched nor the sidecar can tell: the
// frame stays RUNNING and its cores stay booked (in Postgres and in the
// Redis accounting) until Cuebot's host-report and orphaned-proc handling
// clears the proc. cuesched only reports them.
type SilentProc struct {
	Show, Host, Job, Frame string
	ProcID                 string
	Cores                  int64 // centicores
	Age, Expected          time.Duration
	Silent                 time.Duration // since the host's last report
}

// silentProcsSQL: $1 the silence threshold in seconds. Layers without a
// successful frame yet have no expectation and are left out.
const silentProcsSQL = `
SELECT sh.str_name, h.str_name, j.str_name, f.str_name, p.pk_proc, p.int_cores_reserved,
       extract(epoch FROM now() - p.ts_booked)::float8,
       lu.int_clock_time_high::float8,
       extract(epoch FROM now() - hs.ts_ping)::float8
FROM proc p
JOIN host h        ON h.pk_host = p.pk_host
JOIN host_stat hs  ON hs.pk_host = p.pk_host
JOIN show sh       ON sh.pk_show = p.pk_show
JOIN job j         ON j.pk_job = p.pk_job
JOIN frame f       ON f.pk_frame = p.pk_frame
JOIN layer_usage lu ON lu.pk_layer = p.pk_layer
WHERE sh.b_scheduler_managed
  AND hs.ts_ping < now() - make_interval(secs => $1::float8)
  AND lu.int_clock_time_high > 0
  AND p.ts_booked < now() - make_interval(secs => lu.int_clock_time_high)
ORDER BY p.ts_booked, p.pk_proc`

// SilentProcs lists the procs of managed shows past their layer's expected
// runtime on hosts silent for longer than silentAfter (SilentAfter if 0).
func SilentProcs(ctx context.Context, db DB, silentAfter time.Duration) ([]SilentProc, error) {
	if silentAfter <= 0 {
		silentAfter = SilentAfter
	}
	rows, err := db.Query(ctx, silentProcsSQL, silentAfter.Seconds())
	if err != nil {
		return nil, fmt.Errorf("procs on silent hosts: %w", err)
	}
	defer rows.Close()
	var out []SilentProc
	for rows.Next() {
		var p SilentProc
		var age, expected, silent float64
		if err := rows.Scan(&p.Show, &p.Host, &p.Job, &p.Frame, &p.ProcID, &p.Cores, &age, &expected, &silent); err != nil {
			return nil, fmt.Errorf("procs on silent hosts: %w", err)
		}
		p.Age = time.Duration(age * float64(time.Second)).Round(time.Second)
		p.Expected = time.Duration(expected * float64(time.Second))
		p.Silent = time.Duration(silent * float64(time.Second)).Round(time.Second)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("procs on silent hosts: %w", err)
	}
	return out, nil
}
