// Package farm is a TEST DOUBLE: it generates a realistic render farm into
// a database that has the Cuebot baseline schema, for the demo, fault
// tests and benchmarks. It is not used in production.
//
// The farm has one facility with three allocations (general, himem, gpu),
// three departments, four shows (three scheduler-managed, one left to
// Cuebot) whose subscriptions have bursts tight enough to bind, a capped
// and an uncapped folder per show, jobs with priorities and (some) core
// caps, a limit_record shared by the comp layers, hosts of four kinds
// (sizes, GPUs, HARDWARE tags) and WAITING frames with varied cores,
// memory, GPUs and (for the fake RQD) run times.
//
// This package decides only the shape of the farm; every row is written
// by shared/testkit/farmseed's Seeder, so there is one place that knows how
// Cuebot writes facilities, hosts, shows, jobs and frames (keys, units,
// triggers, activation). Seed runs in one transaction and hands all jobs
// to Seeder.Jobs at once, so the frames go in with a single COPY.
//
// The shape is a function of Spec alone: the same Seed gives the same
// names, sizes, caps, tags, counts and run times (the keys are random
// UUIDs). The random draws happen in a fixed order, so changing how rows
// are written does not change the farm.
package farm

import (
	"context"
	"fmt"
	"math/rand"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// Spec sizes the farm.
type Spec struct {
	Seed   int64
	Hosts  int // render nodes
	Frames int // WAITING frames across all shows
	// RunTimeMin/Max bound the per-layer run time the fake RQD uses.
	RunTimeMin, RunTimeMax time.Duration
	// Facility is the facility name to create (default "spi").
	Facility string
	// UnmanagedShare is the fraction of frames in the Cuebot-managed show.
	UnmanagedShare float64
	// WideFrames adds, beyond Frames, one job of the first managed show
	// with a layer of that many wide frames (24 cores, 48 GB on the
	// general hosts: more than half of the largest general host, so on a
	// busy farm they need a host drained for them: what firm reservations
	// are for). Its frames run
	// WideRunTime (default twice RunTimeMax). It draws nothing from the
	// generator, so the rest of the farm is the same with or without it.
	WideFrames  int
	WideRunTime time.Duration
	// GPUHostsServeCPU tags the GPU hosts "general" too (a MANUAL tag), so
	// CPU work of the shows subscribed to the gpu allocation may spill
	// onto them: what GPU protection (queue.gpu_protection) guards.
	GPUHostsServeCPU bool
}

// Default returns a demo-sized farm.
func Default() Spec {
	return Spec{Seed: 1, Hosts: 300, Frames: 3000, RunTimeMin: 200 * time.Millisecond, RunTimeMax: 2 * time.Second, Facility: "spi", UnmanagedShare: 0.1}
}

// Show describes one seeded show.
type Show struct {
	ID, Name string
	Managed  bool
	// Subs maps allocation name to (size, burst) in centicores.
	Subs map[string][2]int64
}

// Farm is what was seeded, for assertions and progress displays.
type Farm struct {
	FacilityID string
	Allocs     map[string]string // name -> pk_alloc
	Shows      []Show
	HostNames  []string
	Jobs       []string
	JobNames   []string // in the order of Jobs
	// WideJob is the name of the wide-frame job (Spec.WideFrames), or "".
	WideJob string
	// LimitedJob is the name of the first managed job with a layer under
	// the licence limit, or "".
	LimitedJob string
	Layers     int
	Frames     int
	LimitID    string
	LimitMax   int
	runTimes   map[string]time.Duration // layer name -> run time
}

// RunTime is the run time the fake RQD should give a frame of the named
// layer (layer names are unique across the farm).
func (f *Farm) RunTime(layerName string) time.Duration {
	if d, ok := f.runTimes[layerName]; ok {
		return d
	}
	return 500 * time.Millisecond
}

// String summarises the farm.
func (f *Farm) String() string {
	return fmt.Sprintf("%d hosts, %d shows, %d jobs, %d layers, %d frames", len(f.HostNames), len(f.Shows), len(f.Jobs), f.Layers, f.Frames)
}

// The allocations and departments every farm has. (Functions, not
// variables: the package keeps no mutable state.)
func allocNames() []string { return []string{"general", "himem", "gpu"} }
func deptNames() []string  { return []string{"lighting", "fx", "anim"} }

type hostKind struct {
	alloc     string
	cores     int // whole cores
	memGB     int64
	gpus      int
	gpuMemGB  int64
	hwTag     string
	weightPct int
}

func hostKinds() []hostKind {
	return []hostKind{
		{"general", 16, 64, 0, 0, "sse4", 45},
		{"general", 32, 128, 0, 0, "avx2", 30},
		{"himem", 64, 512, 0, 0, "avx512", 15},
		{"gpu", 16, 96, 2, 24, "cuda", 10},
	}
}

// showPlan is one show: its share of the frames and, per allocation, its
// subscription size and burst as fractions of the allocation's cores.
type showPlan struct {
	name    string
	managed bool
	share   float64
	subPct  map[string][2]float64
}

func showPlans(unmanagedShare float64) []showPlan {
	managed := 1 - unmanagedShare
	return []showPlan{
		{"aurora", true, managed * 0.45, map[string][2]float64{"general": {0.35, 0.55}, "himem": {0.5, 0.7}, "gpu": {0.5, 0.8}}},
		{"borealis", true, managed * 0.40, map[string][2]float64{"general": {0.30, 0.45}, "himem": {0.4, 0.6}, "gpu": {0.3, 0.5}}},
		{"cascade", true, managed * 0.15, map[string][2]float64{"general": {0.05, 0.10}}},
		{"delta", false, unmanagedShare, map[string][2]float64{"general": {0.2, 0.3}}},
	}
}

type layerKind struct {
	name       string
	tag        string // the allocation tag the layer needs
	cores      int    // whole cores
	memGB      int64
	gpus       int
	gpuMemGB   int64
	threadable bool
	service    string
	limited    bool // takes the shared license limit
}

func layerKinds() []layerKind {
	return []layerKind{
		{"beauty", "general", 4, 8, 0, 0, true, "arnold", false},
		{"comp", "general", 1, 2, 0, 0, false, "nuke", true},
		{"sim", "himem", 16, 96, 0, 0, true, "houdini", false},
		{"denoise", "gpu", 2, 16, 1, 8, false, "optix", false},
		{"prepass", "general", 2, 4, 0, 0, true, "arnold", false},
	}
}

// limitMax is the shared license limit's int_max_value.
const limitMax = 12

// Seed writes the farm in one transaction.
func Seed(ctx context.Context, pool *pgxpool.Pool, spec Spec) (*Farm, error) {
	if spec.Hosts <= 0 || spec.Frames <= 0 {
		return nil, fmt.Errorf("farm: hosts (%d) and frames (%d) must be positive", spec.Hosts, spec.Frames)
	}
	if spec.Facility == "" {
		spec.Facility = "spi"
	}
	if spec.RunTimeMax < spec.RunTimeMin {
		spec.RunTimeMax = spec.RunTimeMin
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("farm: begin: %w", err)
	}
	defer tx.Rollback(ctx)
	g := &generator{
		spec: spec,
		rng:  rand.New(rand.NewSource(spec.Seed)),
		s:    &farmseed.Seeder{DB: tx},
		f:    &Farm{Allocs: map[string]string{}, runTimes: map[string]time.Duration{}},
	}
	if err := g.seed(ctx); err != nil {
		return nil, fmt.Errorf("farm: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("farm: commit: %w", err)
	}
	return g.f, nil
}

// generator draws the farm's shape and has farmseed write it.
type generator struct {
	spec       Spec
	rng        *rand.Rand
	s          *farmseed.Seeder
	f          *Farm
	depts      map[string]string // name -> pk_dept
	allocCores map[string]int64  // name -> centicores of its hosts
	jobs       []farmseed.JobSpec
	frames     int // frames planned so far
	layerSeq   int
}

func (g *generator) seed(ctx context.Context) error {
	var err error
	if g.f.FacilityID, err = g.s.Facility(ctx, g.spec.Facility); err != nil {
		return err
	}
	g.depts = map[string]string{}
	for _, d := range deptNames() {
		if g.depts[d], err = g.s.Department(ctx, g.spec.Facility+"-"+d); err != nil {
			return err
		}
	}
	for _, a := range allocNames() {
		if g.f.Allocs[a], err = g.s.Alloc(ctx, g.f.FacilityID, g.spec.Facility+"."+a, a); err != nil {
			return err
		}
	}
	if err := g.hosts(ctx); err != nil {
		return err
	}
	g.f.LimitMax = limitMax
	if g.f.LimitID, err = g.s.Limit(ctx, g.spec.Facility+"-nuke-license", limitMax); err != nil {
		return err
	}
	plans := showPlans(g.spec.UnmanagedShare)
	for i, p := range plans {
		if err := g.show(ctx, p, i == len(plans)-1); err != nil {
			return err
		}
	}
	jobs, err := g.s.Jobs(ctx, g.jobs...)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		g.f.Jobs = append(g.f.Jobs, j.ID)
		g.f.JobNames = append(g.f.JobNames, j.Name)
		g.f.Layers += len(j.Layers)
		g.f.Frames += j.FrameCount()
	}
	return nil
}

func (g *generator) hosts(ctx context.Context) error {
	g.allocCores = map[string]int64{}
	kinds := hostKinds()
	for i := 0; i < g.spec.Hosts; i++ {
		k := pickHost(g.rng, kinds, i)
		name := fmt.Sprintf("%s-%s%04d", g.spec.Facility, k.alloc, i)
		tags := []farmseed.HostTag{{Name: k.hwTag, Type: "HARDWARE"}}
		if g.spec.GPUHostsServeCPU && k.gpus > 0 {
			tags = append(tags, farmseed.HostTag{Name: "general", Type: "MANUAL"})
		}
		if _, err := g.s.Host(ctx, farmseed.HostSpec{
			Name: name, Alloc: g.f.Allocs[k.alloc], AllocTag: k.alloc,
			Cores: k.cores, MemKB: k.memGB * farmseed.GB, GPUs: k.gpus, GPUMemKB: k.gpuMemGB * farmseed.GB,
			Tags: tags,
		}); err != nil {
			return err
		}
		g.f.HostNames = append(g.f.HostNames, name)
		g.allocCores[k.alloc] += int64(k.cores) * 100
	}
	return nil
}

// show seeds a show (subscriptions, folders, points) and plans its jobs;
// the last show takes the frames the others' rounding left.
func (g *generator) show(ctx context.Context, p showPlan, last bool) error {
	lighting := &farmseed.Seeder{DB: g.s.DB, Dept: g.depts["lighting"]}
	fs, err := lighting.Show(ctx, p.name, p.managed) // root folder and lighting point
	if err != nil {
		return err
	}
	for _, d := range deptNames()[1:] {
		if _, err := g.s.Point(ctx, fs, g.depts[d]); err != nil {
			return err
		}
	}
	sh := Show{ID: fs.ID, Name: p.name, Managed: p.managed, Subs: map[string][2]int64{}}
	for _, a := range allocNames() {
		pct, ok := p.subPct[a]
		if !ok || g.allocCores[a] == 0 {
			continue
		}
		size := g.coresOf(a, pct[0])
		burst := max(g.coresOf(a, pct[1]), 1)
		sh.Subs[a] = [2]int64{int64(size) * 100, int64(burst) * 100}
		if _, err := g.s.Subscribe(ctx, fs, g.f.Allocs[a], size, burst); err != nil {
			return err
		}
	}
	g.f.Shows = append(g.f.Shows, sh)

	// Two folders under the root: lighting capped at a quarter of the
	// general allocation (a cap that binds; at least one core, since a
	// folder cap of 0 books nothing), fx uncapped (-1, Cuebot's unlimited
	// folder sentinel).
	folders := make([]string, 2)
	for i, d := range deptNames()[:2] {
		maxCores := -1
		if i == 0 {
			maxCores = max(g.coresOf("general", 0.25), 1)
		}
		in := &farmseed.Seeder{DB: g.s.DB, Dept: g.depts[d]}
		if folders[i], err = in.Folder(ctx, fs, d, maxCores, -1); err != nil {
			return err
		}
	}

	showFrames := int(float64(g.spec.Frames)*p.share + 0.5)
	if last {
		showFrames = g.spec.Frames - g.frames
	}
	if showFrames > 0 {
		g.planJobs(fs, p, folders, showFrames)
	}
	if p.managed && g.spec.WideFrames > 0 && g.f.WideJob == "" && g.allocCores["general"] > 0 {
		g.planWide(fs, folders[1])
	}
	return nil
}

// planWide plans the wide-frame job (Spec.WideFrames); it draws nothing.
func (g *generator) planWide(fs farmseed.Show, folder string) {
	name := fs.Name + "-sh099-fx_fluidsim_v1"
	rt := g.spec.WideRunTime
	if rt <= 0 {
		rt = 2 * g.spec.RunTimeMax
	}
	lname := "W0001_fluidsim"
	g.f.runTimes[lname] = rt
	g.f.WideJob = name
	g.jobs = append(g.jobs, farmseed.JobSpec{
		Name: name, Show: fs, Folder: folder, Facility: g.f.FacilityID, Dept: g.depts["fx"],
		Priority: 300, MaxCores: 100000, OS: "linux", UID: 10009, User: "artist9", Shot: "sh099",
		LogDir: "/shots/" + fs.Name + "/logs/" + name, MaxRetries: 2,
		Layers: []farmseed.LayerSpec{{
			Name: lname, Tags: []string{"general"}, Frames: g.spec.WideFrames,
			Cores: 24, MemKB: 48 * farmseed.GB, Services: "houdini",
			Command: "/usr/bin/fluidsim --shot sh099 -f #IFRAME#",
		}},
	})
}

// planJobs spreads a show's frames over a few jobs of one to three layers,
// alternating lighting and fx.
func (g *generator) planJobs(fs farmseed.Show, p showPlan, folders []string, frames int) {
	nJobs := min(2+frames/400, 12)
	for j, jobFrames := range splitEven(frames, nJobs) {
		if jobFrames == 0 {
			continue
		}
		dept, abbr := deptNames()[j%2], []string{"lgt", "fx"}[j%2]
		shot := fmt.Sprintf("sh%03d", j+1)
		name := fmt.Sprintf("%s-%s-%s_render_v%d", p.name, shot, abbr, 1+g.rng.Intn(9))
		js := farmseed.JobSpec{
			Name: name, Show: fs, Folder: folders[j%2], Facility: g.f.FacilityID, Dept: g.depts[dept],
			Priority: 100 + g.rng.Intn(5)*50,
			MaxCores: 100000, // effectively uncapped, as cueadmin would set
			OS:       "linux", UID: 10000 + j%5, User: fmt.Sprintf("artist%d", j%5), Shot: shot,
			LogDir: "/shots/" + p.name + "/logs/" + name, MaxRetries: 2,
		}
		if j%3 == 1 {
			js.MaxCores = max(g.coresOf("general", 0.08), 1)
		}
		nLayers := 1 + g.rng.Intn(3)
		for _, layerFrames := range splitEven(jobFrames, nLayers) {
			if layerFrames == 0 {
				continue
			}
			g.layerSeq++
			k := pickLayer(g.rng, p.subPct)
			lname := fmt.Sprintf("L%04d_%s", g.layerSeq, k.name)
			g.f.runTimes[lname] = g.spec.RunTimeMin + time.Duration(g.rng.Int63n(int64(g.spec.RunTimeMax-g.spec.RunTimeMin)+1))
			ls := farmseed.LayerSpec{
				Name: lname, Tags: []string{k.tag}, Frames: layerFrames,
				Cores: k.cores, MemKB: k.memGB * farmseed.GB, GPUs: k.gpus, GPUMemKB: k.gpuMemGB * farmseed.GB,
				NotThreadable: !k.threadable, Services: k.service,
				Command: "/usr/bin/render --shot " + shot + " -f #IFRAME# -o #JOB#/#LAYER#.#FRAME#.exr",
			}
			if k.limited {
				ls.Limits = []string{g.f.LimitID}
				if g.f.LimitedJob == "" && p.managed {
					g.f.LimitedJob = name
				}
			}
			js.Layers = append(js.Layers, ls)
		}
		g.frames += jobFrames
		g.jobs = append(g.jobs, js)
	}
}

// coresOf is a fraction of an allocation's cores, in whole cores rounded
// down.
func (g *generator) coresOf(alloc string, frac float64) int {
	return int(float64(g.allocCores[alloc]) * frac / 100)
}

func pickLayer(rng *rand.Rand, subs map[string][2]float64) layerKind {
	kinds := layerKinds()
	for {
		k := kinds[rng.Intn(len(kinds))]
		if _, ok := subs[k.tag]; ok {
			return k
		}
	}
}

func pickHost(rng *rand.Rand, kinds []hostKind, i int) hostKind {
	// Guarantee at least one host of every kind on small farms.
	if i < len(kinds) {
		return kinds[i]
	}
	n := rng.Intn(100)
	for _, k := range kinds {
		if n < k.weightPct {
			return k
		}
		n -= k.weightPct
	}
	return kinds[0]
}

func splitEven(total, parts int) []int {
	out := make([]int, parts)
	for i := range out {
		out[i] = total / parts
		if i < total%parts {
			out[i]++
		}
	}
	return out
}
