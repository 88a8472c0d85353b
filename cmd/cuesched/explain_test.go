package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

func runExplainT(env map[string]string, args ...string) (int, string, string) {
	c, out, errb := testCLI(env)
	code := runExplain(context.Background(), c, args)
	return code, out.String(), errb.String()
}

func TestExplainCLIUsage(t *testing.T) {
	t.Parallel()
	if code, out, _ := runExplainT(nil, "-h"); code != 0 || !strings.Contains(out, "usage: cuesched explain") || !strings.Contains(out, "folder cap") {
		t.Errorf("help: %d %q", code, out)
	}
	if code, _, errOut := runExplainT(nil, "job"); code != 2 || !strings.Contains(errOut, "no database") {
		t.Errorf("no database: %d %s", code, errOut)
	}
	if code, _, errOut := runExplainT(nil, "a", "b", "c"); code != 2 || !strings.Contains(errOut, `unexpected argument "c"`) {
		t.Errorf("extra argument: %d %s", code, errOut)
	}
	// Flags may follow JOB and LAYER (README: explain JOB LAYER --json).
	if code, _, errOut := runExplainT(nil, "job", "layer", "--json"); code != 2 || !strings.Contains(errOut, "no database") {
		t.Errorf("flag after the arguments: %d %s", code, errOut)
	}
	if code, _, errOut := runExplainT(nil, "a", "--json", "b", "c"); code != 2 || !strings.Contains(errOut, `unexpected argument "c"`) {
		t.Errorf("extra argument between flags: %d %s", code, errOut)
	}
}

// The command prints, per layer, the gate that holds it and the host it
// would book, from the real query against the Cuebot schema.
func TestExplainCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &farmseed.Seeder{DB: pool}
	must := func(v string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	fac := must(s.Facility(ctx, "f1"))
	sh, err := s.Show(ctx, "alpha", true)
	if err != nil {
		t.Fatal(err)
	}
	alloc := must(s.Alloc(ctx, fac, "f1.general", "general"))
	must(s.Subscribe(ctx, sh, alloc, 100, 100))
	must(s.Host(ctx, farmseed.HostSpec{Name: "node1", Alloc: alloc, AllocTag: "general", Cores: 16, MemKB: 64 * farmseed.GB}))
	if _, err := s.Job(ctx, farmseed.JobSpec{Name: "shot010", Show: sh, Facility: fac, Layers: []farmseed.LayerSpec{
		{Name: "render", Tags: []string{"general"}, Frames: 3, Cores: 2, MemKB: 4 * farmseed.GB},
		{Name: "huge", Tags: []string{"general"}, Frames: 1, Cores: 64, MemKB: 4 * farmseed.GB},
		{Name: "sim", Tags: []string{"simulation"}, Frames: 2},
		// Asks twice node1's memory, its frames peak at 8 GB.
		{Name: "fat", Tags: []string{"general"}, Frames: 6, Cores: 2, MemKB: 128 * farmseed.GB},
		// Asks 4 GB, raised past node1's memory by repeated kills.
		{Name: "grown", Tags: []string{"general"}, Frames: 1, Cores: 2, MemKB: 4 * farmseed.GB},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Job(ctx, farmseed.JobSpec{Name: "shot020", Show: sh, Facility: fac, Paused: true,
		Layers: []farmseed.LayerSpec{{Name: "comp", Tags: []string{"general"}, Frames: 1}}}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": db}
	// render's frames have history: 5 succeeded frames peaking at 1-2 GB
	// (the other two stay waiting).
	if _, err := pool.Exec(ctx, `UPDATE frame SET str_state = 'SUCCEEDED', int_exit_status = 0, ts_stopped = now(),
		int_mem_max_used = 2097152 WHERE pk_layer = (SELECT pk_layer FROM layer WHERE str_name = 'render') AND int_number = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO cuesched_layer_oom (pk_layer, int_bump_kb) SELECT pk_layer, 3145728 FROM layer WHERE str_name = 'huge'`); err != nil {
		t.Fatal(err)
	}
	// fat has 4 samples (sized to 8 GB + headroom, which node1 holds);
	// grown is bumped to 96 GB (which it does not).
	if _, err := pool.Exec(ctx, `UPDATE frame SET str_state = 'SUCCEEDED', int_exit_status = 0, ts_stopped = now(),
		int_mem_max_used = 8388608 WHERE pk_layer = (SELECT pk_layer FROM layer WHERE str_name = 'fat') AND int_number <= 4`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO cuesched_layer_oom (pk_layer, int_bump_kb) SELECT pk_layer, 100663296 FROM layer WHERE str_name = 'grown'`); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runExplainT(env, "shot010")
	if code != 0 {
		t.Fatalf("explain shot010: %d %s", code, errOut)
	}
	for _, want := range []string{
		"shot010/render: flowing: 1 host with room now (best: node1)",
		"shot010/huge: no fit: none of the 1 host serving the layer fits one frame (64 cores",
		"shot010/sim: no host:",
		// One sample of 4 needed: the request.
		"shot010/render: memory: books 4.0GiB: its request (1 of 4 samples needed); request 4.0GiB; 0 memory kill(s) recorded",
		"shot010/huge: memory: books 4.0GiB: its request (0 of 4 samples needed); request 4.0GiB; bump 3.0GiB (1)",
		// Judged by the size they book, not by their requests.
		"shot010/fat: flowing: 1 host with room now (best: node1)",
		"shot010/fat: memory: books 8.8GiB: p95 of 4 RSS samples",
		"shot010/grown: no fit: none of the 1 host serving the layer fits one frame (2 cores, 96",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "shot020") {
		t.Errorf("explain shot010 printed another job:\n%s", out)
	}

	// One layer, as JSON.
	code, out, errOut = runExplainT(env, "--json", "shot020", "comp")
	if code != 0 {
		t.Fatalf("explain --json: %d %s", code, errOut)
	}
	var rows []struct {
		Job, Layer, Reason string
		Waiting            int
		Memory             struct {
			BookedKB int64 `json:"booked_kb"`
			Source   string
		}
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rows) != 1 || rows[0].Job != "shot020" || rows[0].Layer != "comp" || rows[0].Reason != "held" || rows[0].Waiting != 1 ||
		rows[0].Memory.BookedKB != farmseed.GB || rows[0].Memory.Source != "request" {
		t.Errorf("json: %+v", rows)
	}

	// Every pending job of the managed shows, without arguments.
	if code, out, _ = runExplainT(env); code != 0 || !strings.Contains(out, "shot010/render") || !strings.Contains(out, "shot020/comp: held") {
		t.Errorf("all jobs: %d\n%s", code, out)
	}

	// An unknown job is an error that names it.
	if code, _, errOut = runExplainT(env, "nope"); code != 1 || !strings.Contains(errOut, "job nope") {
		t.Errorf("unknown job: %d %s", code, errOut)
	}
}
