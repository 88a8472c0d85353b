package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/daemon"
)

// ReviveDeniedSQL puts back to WAITING the DEAD frames of scheduler-managed
// shows whose last run ended with a licence-denial exit status of one of
// their layer's limits (cuesched_limit.int_denial_exit_statuses). The
// booking statement does not count a retry for a denial, so a denied frame
// normally stays under its retries and Cuebot's completion path sends it
// back to WAITING; this covers the one case Cuebot decides otherwise: a
// denial on a frame that had already spent its retries on real failures
// (or has int_max_retries 0), which Cuebot marks DEAD although it never
// ran. The frame's next run is still judged by its retries: a real failure
// then goes DEAD as before. Frames are locked in key order and skipped
// when locked (a completion or a claim holds them), so this never waits on
// or deadlocks with Cuebot's paths. Returns the frames revived.
const ReviveDeniedSQL = `
WITH cand AS (
    SELECT f.pk_frame
      FROM cuesched_limit cl
      JOIN layer_limit ll ON ll.pk_limit_record = cl.pk_limit_record
      JOIN layer l ON l.pk_layer = ll.pk_layer
      JOIN job j ON j.pk_job = l.pk_job AND j.str_state = 'PENDING'
      JOIN show s ON s.pk_show = j.pk_show AND s.b_scheduler_managed
      JOIN frame f ON f.pk_layer = ll.pk_layer AND f.str_state = 'DEAD'
     WHERE f.int_exit_status = ANY(cl.int_denial_exit_statuses)
     ORDER BY f.pk_frame
     FOR UPDATE OF f SKIP LOCKED
)
UPDATE frame f
   SET str_state = 'WAITING', int_version = COALESCE(f.int_version, 0) + 1, ts_updated = now()
  FROM cand
 WHERE f.pk_frame = cand.pk_frame AND f.str_state = 'DEAD'`

// ReviveDenied runs ReviveDeniedSQL once.
func ReviveDenied(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	tag, err := pool.Exec(ctx, ReviveDeniedSQL)
	if err != nil {
		return 0, fmt.Errorf("revive frames dead of a licence denial: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DenialReviver runs ReviveDenied every Interval while Leader says this
// instance leads (every instance when Leader is nil).
type DenialReviver struct {
	Pool     *pgxpool.Pool
	Interval time.Duration
	Leader   func() bool
	Log      hclog.Logger
}

// Run loops until ctx ends. Errors are logged, never fatal.
func (r DenialReviver) Run(ctx context.Context) error {
	iv := r.Interval
	if iv <= 0 {
		iv = 5 * time.Second
	}
	log := r.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	daemon.EveryWhileLeader(ctx, iv, 30*time.Second, r.Leader, func(qctx context.Context) {
		n, err := ReviveDenied(qctx, r.Pool)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("reviving frames dead of a licence denial failed", "error", err)
		case n > 0:
			log.Info("frames dead of a licence denial put back to WAITING", "frames", n)
		}
	})
	return nil
}
