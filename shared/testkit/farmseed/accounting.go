package farmseed

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/publisher"
)

// Querier reads rows.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// SeedAccounting copies the caps of shows (subscriptions, folders, jobs,
// points) from Postgres to Redis and opens the shows for booking, as the
// scheduler's bootstrap does for a farm with no procs yet. Tests that do
// not run the accounting loops use it.
func SeedAccounting(ctx context.Context, db Querier, pub *publisher.Publisher, shows ...string) error {
	var l publisher.Limits
	scan := func(sql string, row func(pgx.Rows) error) error {
		rows, err := db.Query(ctx, sql, shows)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	err := scan(`SELECT pk_show, pk_alloc, int_size, int_burst FROM subscription WHERE pk_show = ANY($1)`, func(r pgx.Rows) error {
		var s publisher.SubLimits
		if err := r.Scan(&s.ShowID, &s.AllocID, &s.Size, &s.Burst); err != nil {
			return err
		}
		l.Subs = append(l.Subs, s)
		return nil
	})
	if err == nil {
		err = scan(`SELECT fr.pk_folder, f.pk_show, fr.int_min_cores, fr.int_max_cores, fr.int_min_gpus, fr.int_max_gpus
			FROM folder_resource fr JOIN folder f ON f.pk_folder = fr.pk_folder WHERE f.pk_show = ANY($1)`, func(r pgx.Rows) error {
			var f publisher.FolderLimits
			if err := r.Scan(&f.FolderID, &f.ShowID, &f.MinCores, &f.MaxCores, &f.MinGPUs, &f.MaxGPUs); err != nil {
				return err
			}
			l.Folders = append(l.Folders, f)
			return nil
		})
	}
	if err == nil {
		err = scan(`SELECT jr.pk_job, jr.int_max_cores, jr.int_max_gpus, jr.int_priority FROM job_resource jr
			JOIN job j ON j.pk_job = jr.pk_job WHERE j.pk_show = ANY($1) AND j.str_state <> 'FINISHED'`, func(r pgx.Rows) error {
			var j publisher.JobLimits
			if err := r.Scan(&j.JobID, &j.MaxCores, &j.MaxGPUs, &j.Priority); err != nil {
				return err
			}
			l.Jobs = append(l.Jobs, j)
			return nil
		})
	}
	if err == nil {
		err = scan(`SELECT pk_dept, pk_show, int_min_cores, int_min_gpus FROM point WHERE pk_show = ANY($1)`, func(r pgx.Rows) error {
			var p publisher.PointLimits
			if err := r.Scan(&p.DeptID, &p.ShowID, &p.MinCores, &p.MinGPUs); err != nil {
				return err
			}
			l.Points = append(l.Points, p)
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("farmseed: read caps: %w", err)
	}
	if _, err := pub.WriteLimits(ctx, l, 0); err != nil {
		return err
	}
	// Markers carry the bootstrap epoch: the current one, or (Redis not
	// bootstrapped) a bootstrap begun here that nobody finishes.
	epoch, err := pub.Epoch(ctx)
	if err != nil {
		return err
	}
	if epoch == "" {
		if epoch, err = pub.Bootstrapping(ctx); err != nil {
			return err
		}
	}
	if epoch == "" {
		epoch = "farmtest"
		if err := pub.BeginBootstrap(ctx, epoch); err != nil {
			return err
		}
	}
	for _, s := range shows {
		if err := pub.MarkSeeded(ctx, s, epoch); err != nil {
			return err
		}
	}
	return nil
}
