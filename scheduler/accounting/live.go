package accounting

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/jobs"
)

// Live reads a show's live use from the Redis counters the booking script
// charges (jobs.LiveSource): the pending-jobs query then reads the
// counters of the show's pending jobs instead of summing every proc of the
// show on every pass. The counters are what the booking script enforces
// (whole cores charged per proc, bookings in flight included), so the
// query's headroom matches the gate's. A show whose accounting is not
// seeded is not vouched for: the query sums its procs.
type Live struct {
	RDB redis.UniversalClient
}

// LiveUse implements jobs.LiveSource.
func (l Live) LiveUse(ctx context.Context, showID string, jobIDs, folders, allocs []string) (jobs.LiveUse, bool, error) {
	pipe := l.RDB.Pipeline()
	seeded := pipe.HExists(ctx, publisher.ShowKey(showID), "seeded")
	read := func(keys []string, key func(string) string) []*redis.SliceCmd {
		cmds := make([]*redis.SliceCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.HMGet(ctx, key(k), "int_cores", "int_gpus")
		}
		return cmds
	}
	jc := read(jobIDs, publisher.JobKey)
	fc := read(folders, publisher.FolderKey)
	ac := read(allocs, func(a string) string { return publisher.SubKey(showID, a) })
	if _, err := pipe.Exec(ctx); err != nil {
		return jobs.LiveUse{}, false, fmt.Errorf("read the live use of show %s: %w", showID, err)
	}
	if !seeded.Val() {
		return jobs.LiveUse{}, false, nil
	}
	use := func(keys []string, cmds []*redis.SliceCmd) (map[string]jobs.Use, error) {
		out := make(map[string]jobs.Use, len(keys))
		for i, k := range keys {
			var u [2]int64
			for f, v := range cmds[i].Val() {
				s, _ := v.(string)
				if s == "" {
					continue
				}
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("counter of %s: %w", k, err)
				}
				u[f] = n
			}
			// Redis charges whole cores; the query compares centicores.
			out[k] = jobs.Use{Cores: u[0] * 100, GPUs: u[1]}
		}
		return out, nil
	}
	var out jobs.LiveUse
	var err error
	if out.Jobs, err = use(jobIDs, jc); err != nil {
		return jobs.LiveUse{}, false, err
	}
	if out.Folders, err = use(folders, fc); err != nil {
		return jobs.LiveUse{}, false, err
	}
	if out.Allocs, err = use(allocs, ac); err != nil {
		return jobs.LiveUse{}, false, err
	}
	return out, true, nil
}
