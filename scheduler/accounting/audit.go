package accounting

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
)

// Drift is one difference between Redis and Postgres.
type Drift struct {
	// Kind is counter (a booked counter vs SUM(proc)), cap (a limit field vs
	// the accounting table), marker (seeding state), or record (a per-proc
	// record without its proc, or a proc without a record).
	Kind     string
	Key      string
	Field    string
	Redis    string
	Postgres string
}

// AuditReport is the result of Audit.
type AuditReport struct {
	Shows  int // managed shows audited
	Procs  int // their non-local procs
	Keys   int // accounting hashes compared
	Drifts []Drift
}

// Audit compares, for every managed show, each Redis booked counter with
// SUM(proc) over the proc rows (in whole cores as charged: the sum of
// ceil(centicores / 100) per proc, see publisher.ChargeCores), each cap
// field with its accounting table (converted as WriteLimits converts it:
// publisher.CapCores, FolderCapCores / FolderCapGPUs, JobCapCores /
// JobCapGPUs; a missing field is drift, since the booking script refuses
// it), the seeding markers, and the per-proc records with the proc rows. It
// only reads. On a live system, bookings in flight between the two reads show up
// as transient record or counter differences; run it again to confirm.
func Audit(ctx context.Context, pool *pgxpool.Pool, pub *publisher.Publisher) (*AuditReport, error) {
	st := newStore(pool, nil, nil)
	rdb := pub.Client()
	rep := &AuditReport{}
	add := func(d Drift) { rep.Drifts = append(rep.Drifts, d) }

	epoch, err := pub.Epoch(ctx)
	if err != nil {
		return nil, err
	}
	if epoch == "" {
		add(Drift{Kind: "marker", Key: publisher.EpochKey, Redis: "(missing)", Postgres: "bootstrap expected"})
	}
	shows, err := st.managedShows(ctx)
	if err != nil {
		return nil, err
	}
	rep.Shows = len(shows)
	sn, err := st.load(ctx, shows, true)
	if err != nil {
		return nil, err
	}
	seeded, err := pub.Seeded(ctx, shows)
	if err != nil {
		return nil, err
	}
	for _, sh := range shows {
		if !seeded[sh] {
			add(Drift{Kind: "marker", Key: publisher.ShowKey(sh), Field: "seeded", Redis: "(missing)", Postgres: "managed"})
		}
	}

	// Expected booked counters, over the zero baseline.
	type want struct{ cores, gpus int64 }
	exp := map[string]*want{}
	slot := func(k string) *want {
		w := exp[k]
		if w == nil {
			w = &want{}
			exp[k] = w
		}
		return w
	}
	for _, keys := range sn.baseline {
		for _, k := range keys {
			slot(k)
		}
	}
	for _, sh := range shows {
		for _, p := range sn.procs[sh] {
			rep.Procs++
			for _, k := range p.Keys() {
				w := slot(k)
				w.cores += publisher.ChargeCores(p.Centicores)
				w.gpus += p.GPUs
			}
		}
	}
	keys := make([]string, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rep.Keys = len(keys)
	got, err := hmget(ctx, rdb, keys, "int_cores", "int_gpus")
	if err != nil {
		return nil, err
	}
	for i, k := range keys {
		for j, f := range []string{"int_cores", "int_gpus"} {
			want := exp[k].cores
			if j == 1 {
				want = exp[k].gpus
			}
			v, present := got[i][j], got[i][j] != nil
			n, _ := toInt(v)
			if (!present && want != 0) || (present && n != want) {
				add(Drift{Kind: "counter", Key: k, Field: f, Redis: show(v), Postgres: strconv.FormatInt(want, 10)})
			}
		}
	}

	// Caps.
	type capCheck struct {
		key    string
		fields []string
		want   []int64
	}
	var caps []capCheck
	for _, sh := range shows {
		l := sn.limits[sh]
		for _, s := range l.Subs {
			caps = append(caps, capCheck{publisher.SubKey(s.ShowID, s.AllocID), []string{"size", "burst"},
				[]int64{publisher.CapCores(s.Size), publisher.CapCores(s.Burst)}})
		}
		for _, f := range l.Folders {
			caps = append(caps, capCheck{publisher.FolderKey(f.FolderID), []string{"int_min_cores", "int_max_cores", "int_min_gpus", "int_max_gpus"},
				[]int64{publisher.CapCores(f.MinCores), publisher.FolderCapCores(f.MaxCores), f.MinGPUs, publisher.FolderCapGPUs(f.MaxGPUs)}})
		}
		for _, j := range l.Jobs {
			caps = append(caps, capCheck{publisher.JobKey(j.JobID), []string{"int_max_cores", "int_max_gpus", "int_priority"},
				[]int64{publisher.JobCapCores(j.MaxCores), publisher.JobCapGPUs(j.MaxGPUs), j.Priority}})
		}
		for _, p := range l.Points {
			caps = append(caps, capCheck{publisher.PointKey(p.DeptID, p.ShowID), []string{"int_min_cores", "int_min_gpus"},
				[]int64{publisher.CapCores(p.MinCores), p.MinGPUs}})
		}
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(caps))
	for i, c := range caps {
		cmds[i] = pipe.HMGet(ctx, c.key, c.fields...)
	}
	if len(caps) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			return nil, fmt.Errorf("audit caps: %w", err)
		}
	}
	for i, c := range caps {
		vals := cmds[i].Val()
		for j, f := range c.fields {
			var v any
			if j < len(vals) {
				v = vals[j]
			}
			if n, ok := toInt(v); !ok || n != c.want[j] {
				add(Drift{Kind: "cap", Key: c.key, Field: f, Redis: show(v), Postgres: strconv.FormatInt(c.want[j], 10)})
			}
		}
	}

	// Records versus proc rows.
	for _, sh := range shows {
		recs, err := pub.ShowProcs(ctx, sh)
		if err != nil {
			return nil, err
		}
		have := make(map[string]bool, len(recs))
		for _, id := range recs {
			have[id] = true
		}
		in := map[string]bool{}
		for _, p := range sn.procs[sh] {
			in[p.ProcID] = true
			if !have[p.ProcID] {
				add(Drift{Kind: "record", Key: publisher.ProcKey(p.ProcID), Redis: "(missing)", Postgres: "proc exists"})
			}
		}
		for _, id := range recs {
			if !in[id] {
				add(Drift{Kind: "record", Key: publisher.ProcKey(id), Redis: "record", Postgres: "(no proc)"})
			}
		}
	}
	sort.SliceStable(rep.Drifts, func(i, j int) bool {
		a, b := rep.Drifts[i], rep.Drifts[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Key != b.Key {
			return a.Key < b.Key
		}
		return a.Field < b.Field
	})
	return rep, nil
}

// Write prints the report: a summary line and a table of differences.
func (r *AuditReport) Write(w io.Writer) {
	fmt.Fprintf(w, "audited %d managed shows, %d procs, %d accounting keys: %d differences\n", r.Shows, r.Procs, r.Keys, len(r.Drifts))
	if len(r.Drifts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tKEY\tFIELD\tREDIS\tPOSTGRES")
	for _, d := range r.Drifts {
		f := d.Field
		if f == "" {
			f = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Kind, d.Key, f, d.Redis, d.Postgres)
	}
	_ = tw.Flush()
}

func hmget(ctx context.Context, rdb redis.UniversalClient, keys []string, fields ...string) ([][]any, error) {
	out := make([][]any, len(keys))
	const chunk = 1000
	for start := 0; start < len(keys); start += chunk {
		end := min(start+chunk, len(keys))
		pipe := rdb.Pipeline()
		cmds := make([]*redis.SliceCmd, end-start)
		for i, k := range keys[start:end] {
			cmds[i] = pipe.HMGet(ctx, k, fields...)
		}
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			return nil, fmt.Errorf("audit read counters: %w", err)
		}
		for i, c := range cmds {
			out[start+i] = c.Val()
		}
	}
	return out, nil
}

func toInt(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func show(v any) string {
	if v == nil {
		return "(missing)"
	}
	return fmt.Sprint(v)
}
