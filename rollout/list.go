package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/publisher"
)

// Seeding states of a show in Redis, as listed.
const (
	SeededYes = "yes" // marker present
	SeededNo  = "no"  // marker absent
	// SeededStale: the show is not managed but still carries a marker (the
	// scheduler's leader has not processed the flip back yet, or no
	// scheduler runs).
	SeededStale   = "stale"
	SeededUnknown = "?" // Redis unreachable
	SeededNA      = "-" // no Redis configured
)

// ShowInfo is one show of a listing.
type ShowInfo struct {
	Show
	// Seeded is one of the Seeded* states.
	Seeded string `json:"seeded"`
	// Procs counts the show's proc rows (frames running or booked).
	Procs int `json:"procs"`
	// Centicores is SUM(proc.int_cores_reserved); Cores the same in cores.
	Centicores int64   `json:"centicores"`
	Cores      float64 `json:"cores"`
	GPUs       int64   `json:"gpus"`
	// Subscriptions of the show, by allocation name.
	Subscriptions []SubscriptionInfo `json:"subscriptions"`
}

// SubscriptionInfo is one subscription of a show: its caps in Postgres, what
// its non-local procs book on the allocation (SUM(proc) through the host's
// allocation, as Cuebot and the scheduler charge it), and the Redis counter.
type SubscriptionInfo struct {
	AllocID string `json:"alloc_id"`
	Alloc   string `json:"alloc"`
	// Size and Burst are the subscription's caps (centicores).
	Size  int64 `json:"size_centicores"`
	Burst int64 `json:"burst_centicores"`
	// Booked is SUM(proc.int_cores_reserved) of the show's non-local procs
	// on hosts of the allocation (centicores).
	Booked int64 `json:"booked_centicores"`
	// Accounting is subscription.int_cores, what CueGUI shows (centicores).
	Accounting int64 `json:"accounting_centicores"`
	// Redis is the acct:sub hash, nil when Redis was not read or has no
	// such key.
	Redis *RedisSub `json:"redis,omitempty"`
}

// RedisSub is an acct:sub hash, in whole cores as Redis holds them.
type RedisSub struct {
	Booked int64 `json:"int_cores"`
	Burst  int64 `json:"burst"`
	Size   int64 `json:"size"`
}

// ShowList is the answer of ListShows.
type ShowList struct {
	Shows []ShowInfo `json:"shows"`
	Redis RedisState `json:"redis"`
	// Warnings: the guardrail (managed shows but no active sidecar slot in
	// this database), when it applies.
	Warnings []string `json:"warnings,omitempty"`
}

// ListShows lists every show: active, managed, seeded (when Redis is
// configured), its procs and booked cores, and its subscriptions with
// booked vs burst in Postgres and, when Redis answers, in Redis. Redis
// problems never fail the listing: they show as "?" and in Redis.Error.
func (t *Tool) ListShows(ctx context.Context) (*ShowList, error) {
	list, err := t.listShows(ctx)
	if err != nil {
		return nil, err
	}
	managed := 0
	for _, s := range list.Shows {
		if s.Managed {
			managed++
		}
	}
	if managed > 0 {
		conn, err := t.pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("list shows: %w", err)
		}
		rep, err := migrations.Status(ctx, conn.Conn())
		conn.Release()
		if err != nil {
			return nil, fmt.Errorf("list shows: %w", err)
		}
		if w := guardrail(rep); w != "" {
			list.Warnings = append(list.Warnings, w)
		}
	}
	return list, nil
}

func (t *Tool) listShows(ctx context.Context) (*ShowList, error) {
	rows, err := t.pool.Query(ctx, `
		SELECT s.pk_show, s.str_name, s.b_active, s.b_scheduler_managed,
		       count(p.pk_proc)::int,
		       COALESCE(sum(p.int_cores_reserved), 0)::bigint,
		       COALESCE(sum(p.int_gpus_reserved), 0)::bigint
		  FROM show s LEFT JOIN proc p ON p.pk_show = s.pk_show
		 GROUP BY s.pk_show, s.str_name, s.b_active, s.b_scheduler_managed
		 ORDER BY s.str_name`)
	if err != nil {
		return nil, fmt.Errorf("list shows: %w", schemaHint(err))
	}
	var list ShowList
	index := map[string]int{}
	for rows.Next() {
		var si ShowInfo
		if err := rows.Scan(&si.ID, &si.Name, &si.Active, &si.Managed, &si.Procs, &si.Centicores, &si.GPUs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list shows: %w", err)
		}
		si.Cores = float64(si.Centicores) / 100
		si.Seeded = SeededNA
		index[si.ID] = len(list.Shows)
		list.Shows = append(list.Shows, si)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list shows: %w", err)
	}

	rows, err = t.pool.Query(ctx, `
		WITH booked AS (
		    SELECT p.pk_show, h.pk_alloc, sum(p.int_cores_reserved)::bigint AS cores
		      FROM proc p JOIN host h ON h.pk_host = p.pk_host
		     WHERE NOT p.b_local
		     GROUP BY p.pk_show, h.pk_alloc)
		SELECT sub.pk_show, sub.pk_alloc, a.str_name, sub.int_size::bigint, sub.int_burst::bigint,
		       sub.int_cores::bigint, COALESCE(b.cores, 0)
		  FROM subscription sub
		  JOIN alloc a ON a.pk_alloc = sub.pk_alloc
		  LEFT JOIN booked b ON b.pk_show = sub.pk_show AND b.pk_alloc = sub.pk_alloc
		 ORDER BY sub.pk_show, a.str_name`)
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	for rows.Next() {
		var show string
		var s SubscriptionInfo
		if err := rows.Scan(&show, &s.AllocID, &s.Alloc, &s.Size, &s.Burst, &s.Accounting, &s.Booked); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list subscriptions: %w", err)
		}
		if i, ok := index[show]; ok {
			list.Shows[i].Subscriptions = append(list.Shows[i].Subscriptions, s)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}

	list.Redis = t.probeRedis(ctx)
	if !list.Redis.Configured {
		return &list, nil
	}
	if !list.Redis.Reachable {
		for i := range list.Shows {
			list.Shows[i].Seeded = SeededUnknown
		}
		return &list, nil
	}
	if err := t.readRedisSubs(ctx, list.Shows); err != nil {
		list.Redis.Error = err.Error()
		for i := range list.Shows {
			list.Shows[i].Seeded = SeededUnknown
		}
	}
	return &list, nil
}

// readRedisSubs fills the seeding state and the acct:sub counters in one
// pipelined round trip.
func (t *Tool) readRedisSubs(ctx context.Context, shows []ShowInfo) error {
	rctx, cancel := t.redisCtx(ctx)
	defer cancel()
	pipe := t.pub.Client().Pipeline()
	markers := make([]*redis.BoolCmd, len(shows))
	subs := make([][]*redis.SliceCmd, len(shows))
	for i, s := range shows {
		markers[i] = pipe.HExists(rctx, publisher.ShowKey(s.ID), "seeded")
		for _, sub := range s.Subscriptions {
			subs[i] = append(subs[i], pipe.HMGet(rctx, publisher.SubKey(s.ID, sub.AllocID), "int_cores", "burst", "size"))
		}
	}
	if len(shows) == 0 {
		return nil
	}
	if _, err := pipe.Exec(rctx); err != nil {
		return fmt.Errorf("read Redis: %w", err)
	}
	for i := range shows {
		switch on := markers[i].Val(); {
		case on && shows[i].Managed:
			shows[i].Seeded = SeededYes
		case on:
			shows[i].Seeded = SeededStale
		default:
			shows[i].Seeded = SeededNo
		}
		for j, cmd := range subs[i] {
			v := cmd.Val()
			if len(v) != 3 || (v[0] == nil && v[1] == nil && v[2] == nil) {
				continue
			}
			shows[i].Subscriptions[j].Redis = &RedisSub{Booked: redisInt(v[0]), Burst: redisInt(v[1]), Size: redisInt(v[2])}
		}
	}
	return nil
}

func redisInt(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// WriteJSON writes the listing as indented JSON.
func (l *ShowList) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(l)
}

// Write writes the listing as an aligned table: one row per show, then one
// indented row per subscription (CORES there is what the show's procs book
// on that allocation).
func (l *ShowList) Write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHOW / ALLOCATION\tACTIVE\tMANAGED\tSEEDED\tPROCS\tCORES\tSIZE\tBURST\tREDIS BOOKED/BURST")
	for _, s := range l.Shows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t\t\t\n", s.Name, yesNo(s.Active), yesNo(s.Managed), s.Seeded, s.Procs, cores(s.Centicores))
		for _, sub := range s.Subscriptions {
			red := "-"
			if sub.Redis != nil {
				red = fmt.Sprintf("%d/%d", sub.Redis.Booked, sub.Redis.Burst)
			}
			fmt.Fprintf(tw, "  %s\t\t\t\t\t%s\t%s\t%s\t%s\n", sub.Alloc, cores(sub.Booked), cores(sub.Size), cores(sub.Burst), red)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, x := range l.Warnings {
		if _, err := fmt.Fprintf(w, "\nWARNING: %s\n", x); err != nil {
			return err
		}
	}
	switch {
	case !l.Redis.Configured:
		_, err := fmt.Fprintln(w, "\nRedis: not given (--redis-url): SEEDED and REDIS columns are empty.")
		return err
	case !l.Redis.Reachable || l.Redis.Error != "":
		_, err := fmt.Fprintf(w, "\nRedis: UNREACHABLE (%s): seeding state unknown.\n", l.Redis.Error)
		return err
	case l.Redis.Epoch == "":
		_, err := fmt.Fprintln(w, "\nRedis: not bootstrapped (acct:epoch missing): no scheduler has seeded this Redis yet, booking is paused.")
		return err
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// cores renders centicores as cores: 250 -> "2.5", 100 -> "1", -100 ->
// "-1". (Subscription sizes and bursts, and booked totals, have no
// "unlimited" value: a negative burst books nothing.)
func cores(centicores int64) string {
	return strconv.FormatFloat(float64(centicores)/100, 'f', -1, 64)
}
