package sidecar

import (
	"context"
	"errors"
	"fmt"

	"github.com/cuesched/cuesched/shared/cuebot"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/shared/replication"
)

// jobInfo is what a release needs from a job row.
type jobInfo struct{ show, folder, dept string }

// caches resolve a deleted proc to its accounting keys and tell cap changes
// apart from counter updates. They are kept fresh from the stream; misses
// are filled by a query. Only the Apply goroutine touches them.
type caches struct {
	hostAlloc  map[string]string
	jobs       map[string]jobInfo
	folderShow map[string]string
	capCache   // the caps last written (caps.go); reset with the rest
}

func newCaches() *caches {
	return &caches{
		hostAlloc: map[string]string{}, jobs: map[string]jobInfo{}, folderShow: map[string]string{},
		capCache: newCapCache(),
	}
}

// Seed queries of the resolution caches. Every column is text so both
// query paths (the snapshot's simple protocol and pgx) read them alike.
const (
	seedHostsSQL   = `SELECT pk_host::text, pk_alloc::text FROM host`
	seedJobsSQL    = `SELECT pk_job::text, pk_show::text, pk_folder::text, pk_dept::text FROM job WHERE str_state <> 'FINISHED'`
	seedFoldersSQL = `SELECT pk_folder::text, pk_show::text FROM folder`
)

// seedCaches reads the host, job and folder rows the resolution needs.
func seedCaches(ctx context.Context, q textQuery) (*caches, error) {
	c := newCaches()
	if err := q(ctx, seedHostsSQL, func(r []string) error { c.hostAlloc[r[0]] = r[1]; return nil }); err != nil {
		return nil, fmt.Errorf("seed hosts: %w", err)
	}
	if err := q(ctx, seedJobsSQL, func(r []string) error { c.jobs[r[0]] = jobInfo{show: r[1], folder: r[2], dept: r[3]}; return nil }); err != nil {
		return nil, fmt.Errorf("seed jobs: %w", err)
	}
	if err := q(ctx, seedFoldersSQL, func(r []string) error { c.folderShow[r[0]] = r[1]; return nil }); err != nil {
		return nil, fmt.Errorf("seed folders: %w", err)
	}
	return c, nil
}

func (c *consumer) planHost(ch *replication.Change) {
	switch ch.Op {
	case replication.Insert, replication.Update:
		id, ok1 := col(ch.New, "pk_host")
		alloc, ok2 := col(ch.New, "pk_alloc")
		if ok1 && ok2 {
			c.c.hostAlloc[id] = alloc
		}
	case replication.Delete:
		if id, ok := col(ch.Old, "pk_host"); ok {
			delete(c.c.hostAlloc, id)
		}
	}
}

// planJob keeps the job cache and prunes the job-cap cache: a job that
// finished or was deleted has no caps to compare any more (its
// job_resource row goes with it), so its entry would only grow the map
// for the life of the sidecar.
func (c *consumer) planJob(ch *replication.Change) {
	switch ch.Op {
	case replication.Insert, replication.Update:
		id, ok1 := col(ch.New, "pk_job")
		show, ok2 := col(ch.New, "pk_show")
		folder, ok3 := col(ch.New, "pk_folder")
		dept, ok4 := col(ch.New, "pk_dept")
		if ok1 && ok2 && ok3 && ok4 {
			c.c.jobs[id] = jobInfo{show: show, folder: folder, dept: dept}
		}
		if state, ok := col(ch.New, "str_state"); ok1 && ok && state == string(cuebot.JobFinished) {
			delete(c.c.jobCaps, id)
		}
	case replication.Delete:
		if id, ok := col(ch.Old, "pk_job"); ok {
			delete(c.c.jobs, id)
			delete(c.c.jobCaps, id)
		}
	case replication.Truncate:
		clear(c.c.jobCaps)
	}
}

// job returns a job's show, folder and dept (cache, else a query).
func (c *consumer) job(ctx context.Context, id string) (jobInfo, bool, error) {
	if j, ok := c.c.jobs[id]; ok {
		return j, true, nil
	}
	var j jobInfo
	err := c.pool.QueryRow(ctx, `SELECT pk_show, pk_folder, pk_dept FROM job WHERE pk_job = $1`, id).Scan(&j.show, &j.folder, &j.dept)
	if errors.Is(err, pgx.ErrNoRows) {
		return j, false, nil
	}
	if err != nil {
		return j, false, fmt.Errorf("sidecar: look up job %s: %w", id, err)
	}
	c.c.jobs[id] = j
	return j, true, nil
}

func (c *consumer) hostAlloc(ctx context.Context, id string) (string, bool, error) {
	if a, ok := c.c.hostAlloc[id]; ok {
		return a, true, nil
	}
	var a string
	err := c.pool.QueryRow(ctx, `SELECT pk_alloc FROM host WHERE pk_host = $1`, id).Scan(&a)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("sidecar: look up host %s: %w", id, err)
	}
	c.c.hostAlloc[id] = a
	return a, true, nil
}

func (c *consumer) folderShow(ctx context.Context, id string) (string, bool, error) {
	if s, ok := c.c.folderShow[id]; ok {
		return s, true, nil
	}
	var s string
	err := c.pool.QueryRow(ctx, `SELECT pk_show FROM folder WHERE pk_folder = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("sidecar: look up folder %s: %w", id, err)
	}
	c.c.folderShow[id] = s
	return s, true, nil
}
