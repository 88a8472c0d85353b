// Package failfast holds back work that cannot run, so it does not eat the
// farm: a layer whose frames keep failing fast (exit within seconds, again
// and again) is backed off, exponentially and per layer, out of the
// priority lottery and out of every dispatch pass.
//
// The scheduler does not see completions (Cuebot handles them), so the
// signal is Cuebot's own per-layer counters, layer_usage: failed runs
// (int_frame_fail_count), their summed clock time (int_clock_time_fail)
// and successful runs (int_frame_success_count). The loop leader judges
// every pending layer of the managed shows each Interval, against the
// counters it recorded when it last judged the layer (cuesched_layer_backoff,
// rollout 0008), in one statement:
//
//   - a success since: healthy, level 0, not held;
//   - at least Failures failed runs since, averaging at most RunTime each:
//     failing fast, held for BackoffMin × 2^level (at most BackoffMax),
//     level + 1;
//   - at least Failures failed runs since, slower than that: a real
//     failure, not poison; level 0;
//   - fewer: not judged yet (the counters keep accumulating).
//
// While a layer is held its counters are moved forward at every judgement,
// so the stragglers that fail after the hold began do not count against
// the probe that follows it: when the hold ends the layer books again
// normally and is judged on those runs alone.
//
// A released layer's retry window is a probe of a fixed size, not of a
// fixed time: it is judged again only once at least Probe runs have failed
// since (Failures decides the first hold, Probe every one after). Judged on
// the next interval's worth of runs instead, the frames a retry window
// starts would scale with how fast the passes run, so a loaded scheduler
// would starve the layer it only meant to slow down. A layer backed off to
// BackoffMax still runs a probe of Probe frames every BackoffMax.
//
// The hold lives in Postgres, so every instance honours it (the pending-job
// and layer queries of package jobs skip a held layer, and a job whose
// waiting layers are all held is not drawn), it survives a failover, and
// `cuesched explain` shows it with the time the layer is tried again.
// Licence denials count as failures like any other fast exit: a layer
// denied a seat again and again is work that cannot run either.
package failfast

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/daemon"
)

// Config tunes the judgement (queue.fail_fast_*).
type Config struct {
	Interval time.Duration
	Failures int
	// Probe is how many failed runs a layer released from a hold needs
	// before it is judged again (queue.fail_fast_probe); below Failures,
	// Failures.
	Probe      int
	RunTime    time.Duration
	BackoffMin time.Duration
	BackoffMax time.Duration
}

// JudgeSQL judges every pending layer of the managed shows and returns
// the layers newly held. $1 failures, $2 run time (s), $3 backoff min (s),
// $4 backoff max (s), $5 probe (failed runs that judge a layer released
// from a hold, level > 0).
const JudgeSQL = `
WITH cur AS (
    SELECT l.pk_layer, lu.int_frame_fail_count::bigint AS fails, lu.int_frame_success_count::bigint AS succ,
           lu.int_clock_time_fail::bigint AS clk
      FROM layer_stat ls
      JOIN layer l       ON l.pk_layer = ls.pk_layer
      JOIN job j         ON j.pk_job = l.pk_job AND j.str_state = 'PENDING'
      JOIN show s        ON s.pk_show = j.pk_show AND s.b_scheduler_managed
      JOIN layer_usage lu ON lu.pk_layer = l.pk_layer
     WHERE ls.int_waiting_count > 0
), judged AS (
    SELECT c.pk_layer, c.fails, c.succ, c.clk,
           COALESCE(b.int_level, 0) AS lvl, b.ts_until, b.int_fails AS last_fails, b.int_avg_run_ms AS last_avg,
           c.fails - COALESCE(b.int_fail_base, 0) AS df,
           c.clk - COALESCE(b.int_clock_fail_base, 0) AS dc,
           CASE WHEN b.pk_layer IS NULL THEN 'new'
                WHEN b.ts_until > now() THEN 'held'
                WHEN c.succ > b.int_success_base THEN 'healthy'
                WHEN c.fails - b.int_fail_base >= CASE WHEN b.int_level > 0 THEN GREATEST($1::bigint, $5::bigint) ELSE $1::bigint END
                 AND c.clk - b.int_clock_fail_base <= $2::float8 * (c.fails - b.int_fail_base) THEN 'fast'
                WHEN c.fails - b.int_fail_base >= CASE WHEN b.int_level > 0 THEN GREATEST($1::bigint, $5::bigint) ELSE $1::bigint END THEN 'slow'
                ELSE 'same' END AS verdict
      FROM cur c LEFT JOIN cuesched_layer_backoff b ON b.pk_layer = c.pk_layer
)
INSERT INTO cuesched_layer_backoff AS t (pk_layer, int_level, ts_until, int_fail_base, int_success_base, int_clock_fail_base,
                                         int_fails, int_avg_run_ms, ts_updated)
SELECT pk_layer,
       CASE verdict WHEN 'fast' THEN lvl + 1 WHEN 'held' THEN lvl ELSE 0 END,
       CASE verdict WHEN 'fast' THEN now() + make_interval(secs => LEAST($3::float8 * power(2, lvl), $4::float8))
                    WHEN 'held' THEN ts_until END,
       fails, succ, clk,
       CASE verdict WHEN 'fast' THEN df ELSE COALESCE(last_fails, 0) END,
       CASE verdict WHEN 'fast' THEN (1000 * dc / GREATEST(df, 1)) ELSE COALESCE(last_avg, 0) END,
       now()
  FROM judged WHERE verdict <> 'same'
ON CONFLICT (pk_layer) DO UPDATE
   SET int_level = EXCLUDED.int_level, ts_until = EXCLUDED.ts_until,
       int_fail_base = EXCLUDED.int_fail_base, int_success_base = EXCLUDED.int_success_base,
       int_clock_fail_base = EXCLUDED.int_clock_fail_base, int_fails = EXCLUDED.int_fails,
       int_avg_run_ms = EXCLUDED.int_avg_run_ms, ts_updated = EXCLUDED.ts_updated
RETURNING t.pk_layer, t.int_level, t.ts_until,
          -- held by this judgement: its hold starts now (a layer still
          -- held keeps the end an earlier judgement gave it)
          COALESCE(t.ts_until = now() + make_interval(secs => LEAST($3::float8 * power(2, t.int_level - 1), $4::float8)), false)`

// ForgetSQL deletes the rows of layers with nothing left to wait for.
const ForgetSQL = `
DELETE FROM cuesched_layer_backoff b
 WHERE NOT EXISTS (SELECT 1 FROM layer_stat ls WHERE ls.pk_layer = b.pk_layer AND ls.int_waiting_count > 0)`

// Judge runs one judgement and returns the layers it newly held.
func Judge(ctx context.Context, pool *pgxpool.Pool, c Config) ([]Held, error) {
	rows, err := pool.Query(ctx, JudgeSQL, c.Failures, c.RunTime.Seconds(), c.BackoffMin.Seconds(), c.BackoffMax.Seconds(), c.Probe)
	if err != nil {
		return nil, fmt.Errorf("fail-fast judgement: %w", err)
	}
	defer rows.Close()
	var out []Held
	for rows.Next() {
		var h Held
		var until *time.Time
		var fresh bool
		if err := rows.Scan(&h.Layer, &h.Level, &until, &fresh); err != nil {
			return nil, fmt.Errorf("fail-fast judgement: %w", err)
		}
		if fresh && until != nil {
			h.Until = *until
			out = append(out, h)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("fail-fast judgement: %w", err)
	}
	if _, err := pool.Exec(ctx, ForgetSQL); err != nil {
		return out, fmt.Errorf("fail-fast cleanup: %w", err)
	}
	return out, nil
}

// Held is a layer newly held by a judgement.
type Held struct {
	Layer string
	Level int
	Until time.Time
}

// Loop runs Judge every Config.Interval while Leader says this instance
// leads (every instance when Leader is nil).
type Loop struct {
	Pool   *pgxpool.Pool
	Config Config
	Leader func() bool
	Log    hclog.Logger
	// Held, when set, hears of every layer newly held (metrics, tests).
	Held func(Held)
}

// Run loops until ctx ends. Errors are logged, never fatal.
func (l Loop) Run(ctx context.Context) error {
	if l.Config.BackoffMin <= 0 {
		return nil
	}
	log := l.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	iv := l.Config.Interval
	if iv <= 0 {
		iv = 2 * time.Second
	}
	daemon.EveryWhileLeader(ctx, iv, 30*time.Second, l.Leader, func(qctx context.Context) {
		held, err := Judge(qctx, l.Pool, l.Config)
		if err != nil && ctx.Err() == nil {
			log.Warn("fail-fast judgement failed", "error", err)
		}
		for _, h := range held {
			log.Info("layer failing fast: held out of the lottery and the passes", "layer", h.Layer, "level", h.Level, "until", h.Until)
			if l.Held != nil {
				l.Held(h)
			}
		}
	})
	return nil
}
