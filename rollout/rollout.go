package rollout

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"
)

// Options configures a Tool. The zero value is usable (no Redis).
type Options struct {
	// Publisher reaches the accounting Redis; nil means Redis is not
	// configured: listings leave its columns empty, "on" is refused and
	// Status skips everything that needs Redis.
	Publisher *publisher.Publisher
	// LockKey is the accounting loops' advisory lock (default
	// accounting.DefaultLockKey); it must match the schedulers' Config.LockKey.
	LockKey int64
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// RedisTimeout bounds each Redis probe (default 3s), so an unreachable
	// Redis makes a command slow by seconds, not minutes.
	RedisTimeout time.Duration
	// PollInterval is how often WaitSeeded looks (default 500ms).
	PollInterval time.Duration
}

// Tool is the operator tooling over one Cuebot database (and optionally the
// accounting Redis). It only reads, except Flip, which changes
// show.b_scheduler_managed and may remove a stale seeding marker.
type Tool struct {
	pool *pgxpool.Pool
	pub  *publisher.Publisher
	opts Options
	log  hclog.Logger
}

// New returns a Tool over pool (the Cuebot database).
func New(pool *pgxpool.Pool, opts Options) (*Tool, error) {
	if pool == nil {
		return nil, errors.New("rollout: nil database pool")
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.LockKey == 0 {
		opts.LockKey = accounting.DefaultLockKey
	}
	if opts.RedisTimeout <= 0 {
		opts.RedisTimeout = 3 * time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 500 * time.Millisecond
	}
	return &Tool{pool: pool, pub: opts.Publisher, opts: opts, log: opts.Logger.Named("rollout")}, nil
}

// Show is a show row.
type Show struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Active bool   `json:"active"`
	// Managed is show.b_scheduler_managed.
	Managed bool `json:"managed"`
}

// UnknownShowError: no show (and no show alias) has that name.
type UnknownShowError struct {
	Name string
	// Known are the names of every show, sorted.
	Known []string
	// Suggestion is the closest known name, "" when none is close.
	Suggestion string
}

func (e *UnknownShowError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no show named %q", e.Name)
	if e.Suggestion != "" {
		fmt.Fprintf(&b, " (did you mean %q?)", e.Suggestion)
	}
	switch {
	case len(e.Known) == 0:
		b.WriteString("; the database has no shows")
	default:
		const maxListed = 50
		names := e.Known
		more := 0
		if len(names) > maxListed {
			names, more = names[:maxListed], len(names)-maxListed
		}
		fmt.Fprintf(&b, "; known shows: %s", strings.Join(names, ", "))
		if more > 0 {
			fmt.Fprintf(&b, " and %d more (cuesched show list)", more)
		}
	}
	return b.String()
}

// FindShow resolves name to a show: an exact show.str_name first, then an
// exact show_alias name (as Cuebot's own lookups accept both). Anything else
// is an *UnknownShowError listing the known names and the closest one.
func (t *Tool) FindShow(ctx context.Context, name string) (Show, error) {
	var s Show
	err := t.pool.QueryRow(ctx, `
		SELECT s.pk_show, s.str_name, s.b_active, s.b_scheduler_managed
		  FROM show s WHERE s.str_name = $1
		UNION ALL
		SELECT s.pk_show, s.str_name, s.b_active, s.b_scheduler_managed
		  FROM show s JOIN show_alias a ON a.pk_show = s.pk_show
		 WHERE a.str_name = $1 AND NOT EXISTS (SELECT 1 FROM show x WHERE x.str_name = $1)
		 LIMIT 1`, name).Scan(&s.ID, &s.Name, &s.Active, &s.Managed)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("look up show %q: %w", name, schemaHint(err))
	}
	rows, err := t.pool.Query(ctx, `SELECT str_name FROM show ORDER BY str_name`)
	if err != nil {
		return s, fmt.Errorf("list shows: %w", err)
	}
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return s, fmt.Errorf("list shows: %w", err)
	}
	return s, &UnknownShowError{Name: name, Known: known, Suggestion: closest(name, known)}
}

// schemaHint turns "column b_scheduler_managed does not exist" into advice.
func schemaHint(err error) error {
	if err != nil && strings.Contains(err.Error(), "b_scheduler_managed") && strings.Contains(err.Error(), "does not exist") {
		return fmt.Errorf("%w (the rollout is not applied: run cuesched migrate up)", err)
	}
	return err
}

// closest returns the known name nearest to name: a case-insensitive
// match, else the smallest edit distance within about a third of the
// name's length, else a unique name containing it (or contained in it).
func closest(name string, known []string) string {
	if len(known) == 0 || name == "" {
		return ""
	}
	ln := strings.ToLower(name)
	for _, k := range known {
		if strings.ToLower(k) == ln {
			return k
		}
	}
	best, bestD := "", -1
	for _, k := range known {
		d := levenshtein(ln, strings.ToLower(k))
		if bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	if limit := max(2, len([]rune(name))/3); bestD <= limit {
		return best
	}
	var subs []string
	for _, k := range known {
		lk := strings.ToLower(k)
		if strings.Contains(lk, ln) || strings.Contains(ln, lk) {
			subs = append(subs, k)
		}
	}
	if len(subs) == 1 {
		return subs[0]
	}
	return ""
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// redisCtx bounds one Redis probe.
func (t *Tool) redisCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.opts.RedisTimeout)
}

// RedisState is what a Redis probe found.
type RedisState struct {
	// Configured: a Redis was given.
	Configured bool `json:"configured"`
	// Reachable: it answered PING.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Epoch is acct:epoch ("" = not bootstrapped: Redis empty or a
	// bootstrap in progress; every scheduler's booking gate is closed).
	Epoch string `json:"epoch,omitempty"`
	// SidecarLSN is acct:sidecar:lsn, the last source transaction the
	// sidecar applied ("" = none yet).
	SidecarLSN string `json:"sidecar_lsn,omitempty"`
}

// probeRedis pings Redis and reads the epoch and the sidecar checkpoint.
func (t *Tool) probeRedis(ctx context.Context) RedisState {
	st := RedisState{Configured: t.pub != nil}
	if t.pub == nil {
		return st
	}
	rctx, cancel := t.redisCtx(ctx)
	defer cancel()
	rdb := t.pub.Client()
	if err := rdb.Ping(rctx).Err(); err != nil {
		st.Error = err.Error()
		return st
	}
	st.Reachable = true
	epoch, err := t.pub.Epoch(rctx)
	if err != nil {
		st.Reachable, st.Error = false, err.Error()
		return st
	}
	st.Epoch = epoch
	if lsn, ok, err := t.pub.Checkpoint(rctx); err == nil && ok {
		st.SidecarLSN = lsnString(lsn)
	}
	return st
}

// seeded reads the seeding markers of the shows (nil map and an error when
// Redis cannot be asked).
func (t *Tool) seeded(ctx context.Context, ids []string) (map[string]bool, error) {
	if t.pub == nil {
		return nil, errors.New("no Redis configured")
	}
	rctx, cancel := t.redisCtx(ctx)
	defer cancel()
	return t.pub.Seeded(rctx, ids)
}

func lsnString(lsn uint64) string { return fmt.Sprintf("%X/%X", lsn>>32, uint32(lsn)) }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
