package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/cli"
	"github.com/cuesched/cuesched/shared/config"

	"github.com/cuesched/cuesched/scheduler/explain"
	"github.com/cuesched/cuesched/scheduler/memsize"
)

const explainUsage = `usage: cuesched explain [--json] [--timeout DURATION] [--config FILE] [--database-url URL]
                        [JOB [LAYER]]

Says why the waiting frames of a scheduler-managed show's job are not
running: per layer, the first gate that holds them, in the order the
scheduler meets them, and the best host the layer would fit on.

  held        the job is paused
  depend      frames wait on a dependency (counted apart, always)
  no host     no up, open host of the facility is on a subscribed allocation
              with one of the layer's tags
  no fit      hosts serve the layer, none fits one frame even when idle
  burst       every subscription of the show in the facility is at its burst
  folder cap  the job's folder is at its max cores
  job cap     the job is at its max cores
  limit       one of the layer's limits is at its max running frames
  strand      GPU protection keeps CPU work off cores an idle GPU needs
  capacity    hosts fit a frame, none has the room free now
  flowing     nothing holds it: the next pass books it

Each layer's memory line says what one of its frames books and why, as
the scheduler sizes it (section sizing of --config FILE, else the
defaults): the RSS samples, the quantile, the headroom, the clamps, the
OOM bumps and the memory kills recorded, and what Cuebot's ratchet did to
the request.

JOB and LAYER are names or ids (flags may come before or after them);
without JOB every pending job of every managed show is explained. Reads
Postgres only.
`

// runExplain is "cuesched explain".
func runExplain(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched explain", explainUsage)
	name := fs.Name()
	cf := cli.AddConnFlags(fs, false)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	gpuProtection := fs.Bool("gpu-protection", true, "classify as the scheduler does with queue.gpu_protection on (the strand reason)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	pos, code, done := fs.ParseInterleaved(args)
	if done {
		return code
	}
	if len(pos) > 2 {
		return fs.Fail("unexpected argument %q", pos[2])
	}
	pos = append(pos, "", "")
	job, layer := pos[0], pos[1]
	v, code := cf.Resolve(c, name, false)
	if code != 0 {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	cn, code := cli.OpenConns(ctx, c, name, v, 1)
	if code != 0 {
		return code
	}
	defer cn.Close()
	if code := checkCuebot(ctx, c, name, cn, true); code != 0 {
		return code
	}
	pool := cn.Pool
	reps, err := explain.Layers(ctx, pool, job, layer, *gpuProtection)
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	if len(reps) == 0 && job != "" {
		what := "job " + job
		if layer != "" {
			what = "layer " + layer + " of " + what
		}
		fmt.Fprintf(c.Stderr, "%s: %s: no waiting or depending frames of a pending job of a scheduler-managed show\n", name, what)
		return 1
	}
	sizes, err := explainSizing(ctx, pool, v.Sizing, reps)
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	// With memory sizing on, a layer is judged by the size it books (its
	// fit, no fit and room now), not by its request.
	if booked := sizedMemory(v.Sizing, reps, sizes); len(booked) > 0 {
		if reps, err = explain.SizedLayers(ctx, pool, job, layer, *gpuProtection, booked); err != nil {
			fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
			return 1
		}
	}
	if *asJSON {
		type row struct {
			Show    string               `json:"show"`
			Job     string               `json:"job"`
			Layer   string               `json:"layer"`
			Reason  string               `json:"reason"`
			Detail  string               `json:"detail"`
			Waiting int                  `json:"waiting"`
			Depend  int                  `json:"depend"`
			Running int                  `json:"running"`
			Best    string               `json:"best_host,omitempty"`
			Memory  *memsize.Explanation `json:"memory,omitempty"`
		}
		out := make([]row, 0, len(reps))
		for _, r := range reps {
			var mem *memsize.Explanation
			if e, ok := sizes[r.LayerID]; ok {
				mem = &e
			}
			out = append(out, row{r.Show, r.Job, r.Layer, string(r.Reason), r.Detail, r.Waiting, r.Depend, r.Running, bestHost(r), mem})
		}
		enc := json.NewEncoder(c.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
			return 1
		}
		return 0
	}
	if len(reps) == 0 {
		fmt.Fprintln(c.Stdout, "no waiting frames in scheduler-managed shows")
		return 0
	}
	tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHOW\tJOB\tLAYER\tWAITING\tDEPEND\tRUNNING\tREASON\tBEST HOST")
	for _, r := range reps {
		best := bestHost(r)
		if best == "" {
			best = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Show, r.Job, r.Layer, r.Waiting, r.Depend, r.Running, r.Reason, best)
	}
	if err := tw.Flush(); err != nil {
		return 1
	}
	fmt.Fprintln(c.Stdout)
	for _, r := range reps {
		fmt.Fprintf(c.Stdout, "%s/%s: %s: %s\n", r.Job, r.Layer, r.Reason, r.Detail)
		if e, ok := sizes[r.LayerID]; ok {
			fmt.Fprintf(c.Stdout, "%s/%s: memory: %s\n", r.Job, r.Layer, e.Text)
		}
	}
	return 0
}

// explainSizing reads the layers' RSS history, bumps and kills (nothing
// without rollout 0009) and explains each layer's memory.
func explainSizing(ctx context.Context, pool *pgxpool.Pool, c config.Sizing, reps []explain.LayerReport) (map[string]memsize.Explanation, error) {
	out := map[string]memsize.Explanation{}
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('cuesched_layer_oom') IS NOT NULL`).Scan(&ok); err != nil || !ok {
		return out, err
	}
	ids := make([]string, 0, len(reps))
	for _, r := range reps {
		ids = append(ids, r.LayerID)
	}
	p := memsize.FromConfig(c)
	hist, err := memsize.New(pool, p, memsize.Options{}).Read(ctx, ids)
	if err != nil {
		return nil, err
	}
	for id, h := range hist {
		out[id] = memsize.Explain(p, h)
	}
	return out, nil
}

// sizedMemory is the memory a frame of each layer books where memory
// sizing makes it differ from layer.int_mem_min (none with sizing off).
func sizedMemory(c config.Sizing, reps []explain.LayerReport, sizes map[string]memsize.Explanation) map[string]int64 {
	if !memsize.FromConfig(c).MemoryOn() {
		return nil
	}
	out := map[string]int64{}
	for _, r := range reps {
		if e, ok := sizes[r.LayerID]; ok && e.BookedKB > 0 && e.BookedKB != r.MemMinKB {
			out[r.LayerID] = e.BookedKB
		}
	}
	return out
}

// bestHost is the host the layer would book now, else the one it fits when
// idle.
func bestHost(r explain.LayerReport) string {
	if r.BestIdle != "" {
		return r.BestIdle
	}
	return r.BestTotal
}
