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

// seedManagedSQL reads the managed shows. Every column of a seed query is
// text so both query paths (the snapshot's simple protocol and pgx) read
// them alike.
const seedManagedSQL = `SELECT pk_show::text FROM show WHERE b_scheduler_managed`

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

// persistState saves the in-memory managed set (force: overwrite whatever
// is stored, for a new slot or a reset).
func (c *consumer) persistState(ctx context.Context, force bool) error {
	st := c.state
	return c.redisCall(ctx, "save managed shows", func(ctx context.Context) error {
		return c.saveStateValue(ctx, st, force)
	})
}

func (c *consumer) saveStateValue(ctx context.Context, st managedState, force bool) error {
	_, err := c.pub.SaveSidecarState(ctx, st.encode(), force)
	return err
}
