package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/replication"
)

// StateKey holds the managed-show set the sidecar derived from the stream,
// with the LSN it is valid at: "<%016X LSN>\n<show id>\n<show id>...".
// It is written by publisher.SaveSidecarState.
const StateKey = publisher.SidecarShowsKey

// managedState is the set of scheduler-managed shows as of lsn.
type managedState struct {
	lsn   replication.LSN
	shows map[string]bool // only true entries
}

func (s managedState) encode() string {
	ids := make([]string, 0, len(s.shows))
	for id := range s.shows {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return publisher.FormatLSN(uint64(s.lsn)) + "\n" + strings.Join(ids, "\n")
}

func decodeState(v string) (managedState, error) {
	lines := strings.Split(v, "\n")
	lsn, err := publisher.ParseLSN(lines[0])
	if err != nil {
		return managedState{}, fmt.Errorf("%s: bad LSN line: %w", StateKey, err)
	}
	st := managedState{lsn: replication.LSN(lsn), shows: map[string]bool{}}
	for _, id := range lines[1:] {
		if id != "" {
			st.shows[id] = true
		}
	}
	return st, nil
}

// loadState reads the persisted state; ok is false when there is none.
func loadState(ctx context.Context, rdb redis.UniversalClient) (managedState, bool, error) {
	v, err := rdb.Get(ctx, StateKey).Result()
	if errors.Is(err, redis.Nil) {
		return managedState{}, false, nil
	}
	if err != nil {
		return managedState{}, false, fmt.Errorf("read %s: %w", StateKey, err)
	}
	st, err := decodeState(v)
	if err != nil {
		return managedState{}, false, err
	}
	return st, true, nil
}

// jobInfo is what a release needs from a job row.
type jobInfo struct{ show, folder, dept string }

// caches resolve a deleted proc to its accounting keys and tell cap changes
// apart from counter updates. They are kept fresh from the stream; misses
// are filled by a query. Only the Apply goroutine touches them.
type caches struct {
	hostAlloc  map[string]string
	jobs       map[string]jobInfo
	folderShow map[string]string
	subCaps    map[[2]string][2]int64 // (show, alloc) -> size, burst
	folderCaps map[string][4]int64    // folder -> min, max cores, min, max gpus
	jobCaps    map[string][3]int64    // job -> max cores, max gpus, priority
}

func newCaches() *caches {
	return &caches{
		hostAlloc: map[string]string{}, jobs: map[string]jobInfo{}, folderShow: map[string]string{},
		subCaps: map[[2]string][2]int64{}, folderCaps: map[string][4]int64{}, jobCaps: map[string][3]int64{},
	}
}

// Seed queries. Every column is text so both query paths (the snapshot's
// simple protocol and pgx) read them alike.
const (
	seedManagedSQL = `SELECT pk_show::text FROM show WHERE b_scheduler_managed`
	seedHostsSQL   = `SELECT pk_host::text, pk_alloc::text FROM host`
	seedJobsSQL    = `SELECT pk_job::text, pk_show::text, pk_folder::text, pk_dept::text FROM job WHERE str_state <> 'FINISHED'`
	seedFoldersSQL = `SELECT pk_folder::text, pk_show::text FROM folder`
)

// textQuery runs sql and calls fn with each row's columns as text ("" for
// NULL).
type textQuery = replication.TextQuery

func seedManaged(ctx context.Context, q textQuery) (map[string]bool, error) {
	shows := map[string]bool{}
	err := q(ctx, seedManagedSQL, func(c []string) error { shows[c[0]] = true; return nil })
	if err != nil {
		return nil, fmt.Errorf("seed managed shows: %w", err)
	}
	return shows, nil
}

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
