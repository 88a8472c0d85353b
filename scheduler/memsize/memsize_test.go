package memsize

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const gb = farmseed.GB

func policy() sizing.History {
	return sizing.History{Memory: sizing.ModeHistory, Threadable: sizing.ModeHistory, Quantile: 0.95, Headroom: 0.1, MinKB: 256 << 10,
		WindowFrames: 32, MinSamples: 4, MaxAge: 12 * time.Hour, OOMRetryFactor: 1.5, OOMBumpKills: 2, OOMBumpWindow: time.Hour, ProbeFrames: 3}
}

// policyK is policy() bumping a layer after k kills.
func policyK(k int) sizing.History {
	h := policy()
	h.OOMBumpKills = k
	return h
}

type fixture struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	job   farmseed.Job
	layer string
	tags  []string
}

func setup(t *testing.T, layers ...farmseed.LayerSpec) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &farmseed.Seeder{DB: pool}
	fac, err := s.Facility(ctx, "f1")
	if err != nil {
		t.Fatal(err)
	}
	show, err := s.Show(ctx, "show", true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range layers {
		layers[i].Tags = []string{"general"}
	}
	job, err := s.Job(ctx, farmseed.JobSpec{Name: "j", Show: show, Facility: fac, Priority: 50, MaxCores: farmseed.Uncapped, Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{ctx: ctx, pool: pool, job: job, layer: job.Layers[0].ID, tags: []string{"general"}}
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
}

// succeed marks frames of layer 0 SUCCEEDED with these RSS peaks, the
// first the newest, as Cuebot's completion does.
func (f *fixture) succeed(t *testing.T, rss ...int64) {
	t.Helper()
	for i, kb := range rss {
		f.exec(t, `UPDATE frame SET str_state = 'SUCCEEDED', int_exit_status = 0, int_mem_max_used = $2,
			ts_stopped = now() - make_interval(mins => $3) WHERE pk_frame = $1`, f.job.Layers[0].Frames[len(f.job.Layers[0].Frames)-1-i], kb, i+1)
	}
}

// kill records a memory kill of frame i of layer 0 as Cuebot leaves it: the
// frame back to WAITING with the run's exit status, max RSS and booking.
func (f *fixture) kill(t *testing.T, i int, exit, rssKB, reservedKB int64, ago time.Duration) {
	t.Helper()
	f.exec(t, `UPDATE frame SET int_exit_status = $2, int_mem_max_used = $3, int_mem_reserved = $4,
		ts_stopped = now() - make_interval(secs => $5) WHERE pk_frame = $1`, f.job.Layers[0].Frames[i], exit, rssKB, reservedKB, ago.Seconds())
}

func (f *fixture) layers(t *testing.T) []*jobs.Layer {
	t.Helper()
	ls, err := jobs.Layers(f.ctx, f.pool, jobs.LayerQuery{JobID: f.job.ID, Tags: f.tags, FramesPerLayer: 20})
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func (f *fixture) size(t *testing.T, s *Sizer) []*jobs.Layer {
	t.Helper()
	ls, err := s.Size(f.ctx, f.layers(t))
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// cuebotChecksums fingerprints every table that is not cuesched's.
func cuebotChecksums(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename NOT LIKE 'cuesched%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	if len(names) < 20 {
		t.Fatalf("only %d Cuebot tables: %v", len(names), names)
	}
	out := map[string]string{}
	for _, n := range names {
		var sum *string
		if err := f.pool.QueryRow(f.ctx, fmt.Sprintf(`SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM %q t`, n)).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		if sum != nil {
			out[n] = *sum
		}
	}
	return out
}

// The history read sizes a layer from the RSS of its succeeded frames, is
// read once per layer within the TTL whatever the number of passes, and,
// with the kill ledger written too, changes no Cuebot table.
func TestSizeFromHistoryOnCuebotSchema(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "big", Frames: 20, MemKB: 32 * gb, NotThreadable: true},
		farmseed.LayerSpec{Name: "new", Frames: 5, MemKB: 4 * gb, NotThreadable: true})
	f.succeed(t, 5*gb, 6*gb, 6*gb, 5*gb, 4*gb, 6*gb, 5*gb, 6*gb)
	f.kill(t, 0, 33, 7*gb, 6*gb, time.Minute) // ledger write too
	before := cuebotChecksums(t, f)

	reg := prometheus.NewRegistry()
	now := time.Unix(1_000_000, 0)
	s := New(f.pool, policy(), Options{Registerer: reg, TTL: 30 * time.Second, Now: func() time.Time { return now }})
	ls := f.size(t, s)
	var big, killed, fresh *jobs.Layer
	for _, l := range ls {
		switch {
		case l.Name == "big" && l.FrameMemKB > 0:
			killed = l
		case l.Name == "big":
			big = l
		case l.Name == "new":
			fresh = l
		}
	}
	if big == nil || killed == nil || fresh == nil {
		t.Fatalf("layers %+v", ls)
	}
	p := sizing.Policy{History: policy()}
	// p95 of 8 samples is the largest (6 GB), +10%.
	if want := int64(6*gb + 6*gb/10 + 1); p.MemKB(big.Shape) != want && p.MemKB(big.Shape) != want-1 {
		t.Fatalf("big layer books %d KB, want ~%d", p.MemKB(big.Shape), want)
	}
	if p.MemKB(fresh.Shape) != 4*gb {
		t.Fatalf("layer without history books its request: %d", p.MemKB(fresh.Shape))
	}
	if len(killed.Frames) != 1 || p.MemKB(killed.Shape) != 7*gb*3/2 || len(big.Frames) != 11 {
		t.Fatalf("killed frame %d frames at %d KB; layer keeps %d", len(killed.Frames), p.MemKB(killed.Shape), len(big.Frames))
	}
	for range 5 { // more passes within the TTL read nothing
		f.size(t, s)
	}
	if got := counter(t, s.m.historyReads); got != 2 {
		t.Fatalf("history read %v times for 2 layers over 6 passes", got)
	}
	now = now.Add(31 * time.Second)
	f.size(t, s)
	if got := counter(t, s.m.historyReads); got != 4 {
		t.Fatalf("after the TTL: %v reads", got)
	}
	after := cuebotChecksums(t, f)
	for n, sum := range before {
		if after[n] != sum {
			t.Errorf("Cuebot table %s changed by sizing", n)
		}
	}
	var n int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM cuesched_frame_oom`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("ledger rows %d, %v", n, err)
	}
	if !strings.Contains(historySQL, "int_mem_max_used") {
		t.Fatal("history reads Cuebot's RSS column")
	}
}

func (f *fixture) ledger(t *testing.T) (kills int, bumpKB int64, bumps int) {
	t.Helper()
	if err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM cuesched_frame_oom WHERE pk_layer = $1),
		COALESCE((SELECT int_bump_kb FROM cuesched_layer_oom WHERE pk_layer = $1), 0),
		COALESCE((SELECT int_bumps FROM cuesched_layer_oom WHERE pk_layer = $1), 0)`, f.layer).Scan(&kills, &bumpKB, &bumps); err != nil {
		t.Fatal(err)
	}
	return
}

// layerMem is what the layer's ordinary frames book after sizing.
func layerMem(t *testing.T, ls []*jobs.Layer) int64 {
	t.Helper()
	p := sizing.Policy{History: policy()}
	for _, l := range ls {
		if l.FrameMemKB == 0 {
			return p.MemKB(l.Shape)
		}
	}
	t.Fatal("no ordinary frames")
	return 0
}

func retries(ls []*jobs.Layer) map[string]int64 {
	out := map[string]int64{}
	for _, l := range ls {
		if l.FrameMemKB > 0 {
			out[l.Frames[0].ID] = l.FrameMemKB
		}
	}
	return out
}

// The OOM state machine: a kill raises only its frame (Cuebot's ratchet of
// int_mem_min is not followed), the K-th kill in the window raises the
// layer, kills are counted once across instances, and a failover in the
// middle of the bump (the instance dies holding the layer's lock with its
// kill written but not committed) loses neither the kills nor the bump.
func TestOOMStateMachineAndFailover(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "under", Frames: 10, MemKB: 4 * gb, NotThreadable: true})
	a := New(f.pool, policyK(3), Options{})

	// Kill 1: frame 0 ran at 4 GB, peaked at 6 GB. Cuebot's completion
	// ratchets the layer to the booking + 2 GB.
	f.kill(t, 0, 33, 6*gb, 4*gb, 3*time.Minute)
	f.exec(t, `UPDATE layer SET int_mem_min = $2 WHERE pk_layer = $1`, f.layer, 6*gb)
	ls := f.size(t, a)
	if r := retries(ls); len(r) != 1 || r[f.job.Layers[0].Frames[0]] != 9*gb {
		t.Fatalf("kill 1 retries %v", r)
	}
	for _, l := range ls {
		// The retry may clamp to a smaller host's whole memory, never
		// below what the killed run used.
		if l.FrameMemKB > 0 && l.FrameFloorKB != 6*gb {
			t.Fatalf("kill 1 retry floor %d KB, want its 6 GB max RSS", l.FrameFloorKB)
		}
	}
	if got := layerMem(t, ls); got != 4*gb {
		t.Fatalf("after one kill the layer books %d KB, want its 4 GB request (Cuebot's ratchet undone)", got)
	}
	if k, b, _ := f.ledger(t); k != 1 || b != 0 {
		t.Fatalf("ledger %d kills, bump %d", k, b)
	}

	// Kill 2, signalled by the kernel (SIGKILL, over its booking).
	f.kill(t, 1, 9, 7*gb, 4*gb, 2*time.Minute)
	ls = f.size(t, a)
	if k, b, _ := f.ledger(t); k != 2 || b != 0 || layerMem(t, ls) != 4*gb || len(retries(ls)) != 2 {
		t.Fatalf("after kill 2: ledger %d/%d, layer %d, retries %v", k, b, layerMem(t, ls), retries(ls))
	}

	// Kill 3 arrives while instance A is in the middle of recording it:
	// A holds the layer's lock with the kill inserted, then dies (its
	// transaction never commits). B, the standby taking over, waits on
	// the lock, then records the kill and the bump.
	f.kill(t, 2, 33, 8*gb, 4*gb, time.Minute)
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `SELECT pg_advisory_xact_lock(hashtext('cuesched_layer_oom'), hashtext($1))`, f.layer); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `INSERT INTO cuesched_frame_oom (pk_frame, ts_stopped, pk_layer, int_exit_status, int_max_rss_kb, int_reserved_kb, int_retry_kb)
		SELECT pk_frame, ts_stopped, pk_layer, 33, 8388608, 4194304, 12582912 FROM frame WHERE pk_frame = $1`, f.job.Layers[0].Frames[2]); err != nil {
		t.Fatal(err)
	}
	b := New(f.pool, policyK(3), Options{}) // a fresh process: nothing cached
	done := make(chan []*jobs.Layer)
	go func() {
		ls, err := b.Size(f.ctx, f.layers(t))
		if err != nil {
			t.Error(err)
		}
		done <- ls
	}()
	// B is blocked on A's lock: wait until Postgres shows it waiting.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B never waited for A's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Rollback(f.ctx); err != nil { // A dies
		t.Fatal(err)
	}
	ls = <-done
	k, bump, bumps := f.ledger(t)
	if k != 3 || bump != 12*gb || bumps != 1 {
		t.Fatalf("after the failover: %d kills, bump %d KB x%d; want 3 kills, 12 GB x1", k, bump, bumps)
	}
	if got := layerMem(t, ls); got != 12*gb {
		t.Fatalf("B's frames book %d KB after its bump", got)
	}
	// A comes back with its stale memory: it records nothing twice and
	// books the bump (read from the table: its cache is empty, TTL 0).
	ls = f.size(t, a)
	if k2, bump2, bumps2 := f.ledger(t); k2 != 3 || bump2 != bump || bumps2 != 1 {
		t.Fatalf("A again: %d kills, bump %d x%d", k2, bump2, bumps2)
	}
	if got := layerMem(t, ls); got != 12*gb {
		t.Fatalf("A's frames book %d KB", got)
	}
	// Killed frames retry at least at the layer's size.
	for id, kb := range retries(ls) {
		if kb < 12*gb {
			t.Fatalf("frame %s retries at %d KB below the layer's bump", id, kb)
		}
	}
	// Kills before the bump do not count toward the next: two more kills
	// after it do not raise the layer again; a kill outside the window
	// does not count either.
	f.kill(t, 3, 33, 13*gb, 12*gb, -time.Second)
	f.kill(t, 4, 33, 13*gb, 12*gb, -2*time.Second)
	f.kill(t, 5, 33, 13*gb, 12*gb, 2*time.Hour)
	f.size(t, a)
	if k3, _, bumps3 := f.ledger(t); k3 != 6 || bumps3 != 1 {
		t.Fatalf("two kills after the bump: %d kills, %d bumps", k3, bumps3)
	}
}

// Two instances recording kills of one layer at once count each other's:
// the second waits for the first's lock and sees its commit.
func TestConcurrentKillsCountEachOther(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "under", Frames: 10, MemKB: 4 * gb, NotThreadable: true})
	a, b := New(f.pool, policyK(3), Options{}), New(f.pool, policyK(3), Options{})
	f.kill(t, 0, 33, 6*gb, 4*gb, 3*time.Minute)
	f.size(t, a)
	ls := f.layers(t)
	stopped := func(i int) time.Time {
		for _, l := range ls {
			for _, fr := range l.Frames {
				if fr.ID == f.job.Layers[0].Frames[i] {
					return fr.Stopped
				}
			}
		}
		return time.Time{}
	}
	f.kill(t, 1, 33, 6*gb, 4*gb, 2*time.Minute)
	f.kill(t, 2, 33, 6*gb, 4*gb, time.Minute)
	ls = f.layers(t)
	k := func(i int) Kill {
		return Kill{FrameID: f.job.Layers[0].Frames[i], LayerID: f.layer, Stopped: stopped(i), ExitStatus: 33, MaxRSSKB: 6 * gb, ReservedKB: 4 * gb, RetryKB: 9 * gb}
	}
	errs := make(chan error, 2)
	go func() { _, err := a.Record(f.ctx, []Kill{k(1)}); errs <- err }()
	go func() { _, err := b.Record(f.ctx, []Kill{k(2)}); errs <- err }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if kills, bump, bumps := f.ledger(t); kills != 3 || bump != 9*gb || bumps != 1 {
		t.Fatalf("%d kills, bump %d x%d", kills, bump, bumps)
	}
}

// A threadable layer without history runs probe_frames frames at its
// request, then its frames carry the RSS their cores are derived from.
func TestThreadableProbes(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "sim", Frames: 12, MemKB: 2 * gb})
	s := New(f.pool, policy(), Options{})
	ls := f.size(t, s)
	if len(ls) != 1 || len(ls[0].Frames) != 3 || ls[0].RSSKB != 0 {
		t.Fatalf("probing: %d layers, %+v", len(ls), ls)
	}
	f.exec(t, `UPDATE layer_stat SET int_running_count = 3 WHERE pk_layer = $1`, f.layer)
	if ls := f.size(t, s); len(ls) != 0 {
		t.Fatalf("3 probes running: nothing more starts, got %d layers", len(ls))
	}
	f.exec(t, `UPDATE layer_stat SET int_running_count = 0 WHERE pk_layer = $1`, f.layer)
	// Frames that report no RSS end the probing once enough succeeded.
	f.exec(t, `UPDATE layer_stat SET int_succeeded_count = 4 WHERE pk_layer = $1`, f.layer)
	if ls := f.size(t, s); len(ls) != 1 || len(ls[0].Frames) != 12 || ls[0].RSSKB != 0 {
		t.Fatalf("4 succeeded without RSS: %+v", ls)
	}
	f.exec(t, `UPDATE layer_stat SET int_succeeded_count = 0 WHERE pk_layer = $1`, f.layer)
	f.succeed(t, 18*gb, 17*gb, 18*gb, 16*gb)
	ls = f.size(t, s)
	if len(ls) != 1 || len(ls[0].Frames) != 8 || ls[0].RSSKB != 18*gb {
		t.Fatalf("after the probes: %+v", ls)
	}
	p := sizing.Policy{CoreUnit: 100, StrandedMemKB: 2 * gb, History: policy()}
	h := sizing.Host{TotalCores: 3200, IdleCores: 3200, TotalMemKB: 128 * gb, IdleMemKB: 128 * gb}
	rs, why := p.Plan(h, ls[0].Shape, 1)
	if why != sizing.Fits || rs[0].Cores != 500 { // round(18 GB / 4 GB per core)
		t.Fatalf("derived: %+v %v", rs, why)
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A layer booking its request with a memory kill recorded holds its new
// frames to probe_frames at once until the bump decision; its killed frame
// still retries, and the bump (oom_bump_kills kills) releases the layer.
func TestKilledLayerHeldUntilBump(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "under", Frames: 10, MemKB: 4 * gb, NotThreadable: true})
	s := New(f.pool, policy(), Options{}) // oom_bump_kills 2, the default
	if ls := f.size(t, s); len(ls) != 1 || len(ls[0].Frames) != 10 {
		t.Fatalf("no kill: the whole layer is offered, got %+v", ls)
	}
	f.kill(t, 0, 33, 9*gb, 4*gb, 2*time.Minute)
	ls := f.size(t, s)
	frames := func(ls []*jobs.Layer) (held int) {
		for _, l := range ls {
			if l.FrameMemKB == 0 {
				held += len(l.Frames)
			}
		}
		return held
	}
	if len(retries(ls)) != 1 || frames(ls) != 3 || layerMem(t, ls) != 4*gb {
		t.Fatalf("one kill: want its retry and 3 frames at the request, got retries %v, %d frames", retries(ls), frames(ls))
	}
	f.exec(t, `UPDATE layer_stat SET int_running_count = 2 WHERE pk_layer = $1`, f.layer)
	if ls := f.size(t, s); len(retries(ls)) != 1 || frames(ls) != 1 {
		t.Fatalf("2 running: one more may start, got %d", frames(ls))
	}
	f.exec(t, `UPDATE layer_stat SET int_running_count = 5 WHERE pk_layer = $1`, f.layer)
	if ls := f.size(t, s); len(retries(ls)) != 1 || frames(ls) != 0 {
		t.Fatalf("5 running: none may start, got %d", frames(ls))
	}
	// The second kill bumps the layer (this pass still holds it); from the
	// next pass every frame is offered at the bump.
	f.kill(t, 1, 33, 10*gb, 4*gb, time.Minute)
	if ls := f.size(t, s); len(retries(ls)) != 2 || frames(ls) != 0 {
		t.Fatalf("second kill: retries %v, %d frames", retries(ls), frames(ls))
	}
	ls = f.size(t, s)
	if _, b, _ := f.ledger(t); b != 15*gb || frames(ls) != 8 || layerMem(t, ls) != 15*gb {
		t.Fatalf("after the bump: bump %d KB, %d frames at %d KB", b, frames(ls), layerMem(t, ls))
	}
}

// The probes end on the successes whose samples the history read holds,
// never on the pass's newer succeeded count (#22: under load a cached read
// with no samples beside a count of enough successes started every frame
// of the layer at its request, one core each): a cached read taken before
// the layer had enough successes is read again once more have succeeded.
func TestProbesEndOnTheReadsOwnSuccesses(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "sim", Frames: 20, MemKB: 2 * gb})
	now := time.Now()
	s := New(f.pool, policy(), Options{TTL: time.Hour, Now: func() time.Time { return now }})
	f.succeed(t, 18*gb, 17*gb, 18*gb) // 3 of the 4 samples needed
	if ls := f.size(t, s); len(ls) != 1 || len(ls[0].Frames) != 3 || ls[0].RSSKB != 0 {
		t.Fatalf("3 succeeded: probing, got %+v", ls)
	}
	// A pass whose query counts more successes than the (cached) read
	// holds samples for: still probing, at most probe_frames at once.
	ls := f.layers(t)
	ls[0].Succeeded = 10
	ls[0].Running = 1
	out, err := s.Size(f.ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].RSSKB != 0 || len(out[0].Frames) != 2 {
		t.Fatalf("count ahead of the samples: want the layer held to 2 more probes, got %+v", out)
	}
	// The fourth success: the cached read (3 successes) is read again at
	// once, not an hour later, and the layer is sized.
	f.exec(t, `UPDATE frame SET str_state = 'SUCCEEDED', int_exit_status = 0, int_mem_max_used = $2, ts_stopped = now()
		WHERE pk_frame = $1`, f.job.Layers[0].Frames[0], 16*gb)
	if ls := f.size(t, s); len(ls) != 1 || ls[0].RSSKB != 18*gb || len(ls[0].Frames) != 16 {
		t.Fatalf("4 succeeded: want the layer sized from its samples, got %+v", ls)
	}
}

// failingDB fails every history read.
type failingDB struct{ DB }

func (failingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("read timed out")
}

// A history read that fails books no threadable layer (its probes cannot be
// told from its sized frames) and no memory-killed frame (it would retry at
// the size that was killed); other layers book their requests.
func TestUnreadHistoryStartsNoWave(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "threaded", Frames: 10, MemKB: 2 * gb},
		farmseed.LayerSpec{Name: "plain", Frames: 4, MemKB: 2 * gb, NotThreadable: true})
	s := New(failingDB{f.pool}, policy(), Options{})
	f.kill(t, 0, 33, 9*gb, 2*gb, time.Minute) // layer 0's frame 0
	ls, err := s.Size(f.ctx, f.layers(t))
	if err == nil {
		t.Fatal("want the read error returned")
	}
	if len(ls) != 1 || ls[0].Name != "plain" || len(ls[0].Frames) != 4 {
		t.Fatalf("want only the plain layer's 4 frames, got %+v", ls)
	}
}

// The killed-layer hold does not lapse when the killed frame's retry
// starts: the kill recorded this pass counts in the cached read too (#22:
// with the read cached from before the kill, the pass after the retry
// started saw no kill and offered the whole layer at its request).
func TestKilledLayerHoldSurvivesTheCache(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "under", Frames: 10, MemKB: 4 * gb, NotThreadable: true})
	now := time.Now()
	s := New(f.pool, policy(), Options{TTL: time.Hour, Now: func() time.Time { return now }})
	if ls := f.size(t, s); len(ls) != 1 || len(ls[0].Frames) != 10 {
		t.Fatalf("no kill: the whole layer is offered, got %+v", ls)
	}
	f.kill(t, 0, 33, 9*gb, 4*gb, time.Minute)
	if ls := f.size(t, s); len(retries(ls)) != 1 {
		t.Fatalf("one kill: want its retry, got %+v", ls)
	}
	// The retry runs: no killed frame is WAITING any more.
	f.exec(t, `UPDATE frame SET str_state = 'RUNNING' WHERE pk_frame = $1`, f.job.Layers[0].Frames[0])
	ls := f.size(t, s)
	n := 0
	for _, l := range ls {
		n += len(l.Frames)
	}
	if len(retries(ls)) != 0 || n == 0 || n > 3 { // at most probe_frames, less what runs
		t.Fatalf("retry running: want the layer held to probe_frames, got %d frames, retries %v", n, retries(ls))
	}
}

// countingDB counts the statements a sizer sends.
type countingDB struct {
	DB
	n atomic.Int32
}

func (d *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.n.Add(1)
	return d.DB.Query(ctx, sql, args...)
}

// Warm reads the pass's histories in one statement and Size finds them
// cached: sizing each job after it sends nothing more, and sizes as a
// Size without Warm would. Without a cache (history_ttl 0) Warm reads
// nothing (Size reads every time anyway).
func TestWarmReadsThePassOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, farmseed.LayerSpec{Name: "big", Frames: 20, MemKB: 32 * gb, NotThreadable: true},
		farmseed.LayerSpec{Name: "new", Frames: 5, MemKB: 4 * gb, NotThreadable: true})
	f.succeed(t, 5*gb, 6*gb, 6*gb, 5*gb, 4*gb, 6*gb, 5*gb, 6*gb)
	db := &countingDB{DB: f.pool}
	s := New(db, policy(), Options{TTL: time.Minute})
	layers := f.layers(t)
	if err := s.Warm(f.ctx, layers); err != nil {
		t.Fatal(err)
	}
	if n := db.n.Load(); n != 1 {
		t.Fatalf("Warm sent %d statements, want 1", n)
	}
	for _, l := range layers { // each job sizes its own
		if _, err := s.Size(f.ctx, []*jobs.Layer{l}); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.n.Load(); n != 1 {
		t.Fatalf("%d statements after sizing the warmed layers, want still 1", n)
	}
	cold := New(f.pool, policy(), Options{TTL: time.Minute})
	want, err := cold.Size(f.ctx, f.layers(t))
	if err != nil {
		t.Fatal(err)
	}
	p := sizing.Policy{History: policy()}
	for i, l := range want {
		if got := p.MemKB(layers[i].Shape); got != p.MemKB(l.Shape) {
			t.Fatalf("layer %s: warmed size %d KB, unwarmed %d KB", l.Name, got, p.MemKB(l.Shape))
		}
	}
	uncached := &countingDB{DB: f.pool}
	if err := New(uncached, policy(), Options{}).Warm(f.ctx, f.layers(t)); err != nil || uncached.n.Load() != 0 {
		t.Fatalf("Warm without a cache: %d statements, %v; want none", uncached.n.Load(), err)
	}
}
