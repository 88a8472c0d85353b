package cuebotemu

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/cuebot"
)

// Fixture writes the minimum rows Cuebot needs for a bookable frame (the
// checklist of cuebot-schema.md §15), with exact, caller-chosen sizes. For a
// realistic random farm use package farm instead. TEST DOUBLE.
type Fixture struct {
	Pool *pgxpool.Pool
}

// ShowRows are the rows Fixture.Show created.
type ShowRows struct {
	ShowID, FolderID, PointID, DeptID string
	// Subs maps allocation id to subscription id.
	Subs map[string]string
}

// Show creates a show with its show_stats row, a root folder and a point in
// dept Pipeline, and a subscription (size = burst = 1000 cores) on every
// allocation given (seed allocation ids, see shared/cuebot).
func (fx Fixture) Show(ctx context.Context, name string, managed bool, allocs ...string) (ShowRows, error) {
	s := ShowRows{ShowID: cuebot.NewID(), FolderID: cuebot.NewID(), PointID: cuebot.NewID(), DeptID: cuebot.SeedDeptPipeline, Subs: map[string]string{}}
	stmts := []stmt{
		{`INSERT INTO show (pk_show, str_name, b_scheduler_managed) VALUES ($1, $2, $3)`, []any{s.ShowID, name, managed}},
		{`INSERT INTO show_stats (pk_show) VALUES ($1)`, []any{s.ShowID}},
		{`INSERT INTO folder (pk_folder, pk_parent_folder, pk_show, str_name, pk_dept) VALUES ($1, NULL, $2, $3, $4)`, []any{s.FolderID, s.ShowID, name, s.DeptID}},
		{`INSERT INTO point (pk_point, pk_dept, pk_show) VALUES ($1, $2, $3)`, []any{s.PointID, s.DeptID, s.ShowID}},
	}
	for _, a := range allocs {
		id := cuebot.NewID()
		s.Subs[a] = id
		stmts = append(stmts, stmt{`INSERT INTO subscription (pk_subscription, pk_alloc, pk_show, int_size, int_burst) VALUES ($1, $2, $3, 100000, 100000)`, []any{id, a, s.ShowID}})
	}
	for _, st := range stmts {
		if _, err := fx.Pool.Exec(ctx, st.sql, st.args...); err != nil {
			return s, fmt.Errorf("fixture show %s: %w", name, err)
		}
	}
	return s, nil
}

// Host creates an OPEN, UP host in allocation alloc with the given totals
// (cores in centicores, memory in KB) all idle, its host_stat row and its
// ALLOC tag.
func (fx Fixture) Host(ctx context.Context, name, alloc string, cores, memKB, gpus int64) (string, error) {
	id := cuebot.NewID()
	stmts := []stmt{
		{`INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle, int_procs,
		                    int_mem, int_mem_idle, int_gpus, int_gpus_idle, int_gpu_mem, int_gpu_mem_idle)
		  VALUES ($1, $2, $3, 'OPEN', $4, $4, $8, $5, $5, $6, $6, $7, $7)`, []any{id, alloc, name, cores, memKB, gpus, gpus * 16 << 20, cores / 100}},
		{`INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free, str_state, str_os)
		  VALUES ($1, $1, $2, $2, 'UP', 'linux')`, []any{id, memKB}},
		{`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type, b_constant)
		  SELECT $2, $1, str_tag, 'ALLOC', true FROM alloc WHERE pk_alloc = $3`, []any{id, cuebot.NewID(), alloc}},
	}
	for _, st := range stmts {
		if _, err := fx.Pool.Exec(ctx, st.sql, st.args...); err != nil {
			return "", fmt.Errorf("fixture host %s: %w", name, err)
		}
	}
	return id, nil
}

// Job creates a PENDING job of the show in its root folder and dept, with
// the given int_max_retries. The insert trigger creates its child rows.
func (fx Fixture) Job(ctx context.Context, s ShowRows, name string, maxRetries int) (string, error) {
	id := cuebot.NewID()
	_, err := fx.Pool.Exec(ctx, `
		INSERT INTO job (pk_job, pk_folder, pk_show, str_name, str_visible_name, str_shot, str_user,
		                 str_state, pk_facility, pk_dept, int_max_retries)
		VALUES ($1, $2, $3, $4, $4, 'shot', 'tester', 'PENDING', $5, $6, $7)`,
		id, s.FolderID, s.ShowID, name, cuebot.SeedFacilityLocal, s.DeptID, maxRetries)
	if err != nil {
		return "", fmt.Errorf("fixture job %s: %w", name, err)
	}
	return id, nil
}

// Layer creates a RENDER layer of the job.
func (fx Fixture) Layer(ctx context.Context, jobID, name string) (string, error) {
	id := cuebot.NewID()
	_, err := fx.Pool.Exec(ctx, `
		INSERT INTO layer (pk_layer, pk_job, str_name, str_cmd, str_range, str_type, str_tags)
		VALUES ($1, $2, $3, 'echo #IFRAME#', '1-1000', 'RENDER', 'general')`, id, jobID, name)
	if err != nil {
		return "", fmt.Errorf("fixture layer %s: %w", name, err)
	}
	_, err = fx.Pool.Exec(ctx, `UPDATE job SET int_layer_count = int_layer_count + 1 WHERE pk_job = $1`, jobID)
	return id, err
}

// Frames inserts n WAITING frames (numbers 1..n) into the layer and sets the
// layer_stat/job_stat counts as Cuebot's activation would.
func (fx Fixture) Frames(ctx context.Context, jobID, layerID string, n int) ([]string, error) {
	var layerName string
	if err := fx.Pool.QueryRow(ctx, `SELECT str_name FROM layer WHERE pk_layer = $1`, layerID).Scan(&layerName); err != nil {
		return nil, fmt.Errorf("fixture frames: layer %s: %w", layerID, err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = cuebot.NewID()
		_, err := fx.Pool.Exec(ctx, `
			INSERT INTO frame (pk_frame, pk_layer, pk_job, str_name, str_state, int_number, int_layer_order, int_dispatch_order)
			VALUES ($1, $2, $3, $4, 'WAITING', $5, 1, $6)`,
			ids[i], layerID, jobID, fmt.Sprintf("%04d-%s", i+1, layerName), i+1, i)
		if err != nil {
			return nil, fmt.Errorf("fixture frame %d: %w", i+1, err)
		}
	}
	for _, st := range []stmt{
		{`UPDATE layer_stat SET int_waiting_count = int_waiting_count + $2, int_total_count = int_total_count + $2 WHERE pk_layer = $1`, []any{layerID, n}},
		{`UPDATE job_stat SET int_waiting_count = int_waiting_count + $2 WHERE pk_job = $1`, []any{jobID, n}},
		{`UPDATE job SET int_frame_count = int_frame_count + $2 WHERE pk_job = $1`, []any{jobID, n}},
	} {
		if _, err := fx.Pool.Exec(ctx, st.sql, st.args...); err != nil {
			return nil, fmt.Errorf("fixture frame counts: %w", err)
		}
	}
	return ids, nil
}
