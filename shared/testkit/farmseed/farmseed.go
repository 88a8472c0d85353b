// Package farmseed seeds render farms into a Cuebot-compatible database for
// the scheduler's tests, end-to-end tests and benchmarks. It is test
// tooling, not production code: it writes rows the way Cuebot's own DAOs
// would (through the insert triggers that create job_stat, layer_stat,
// folder_resource and friends, never around them), activates jobs as
// Cuebot's activateJob does (frames WAITING, layer_stat/job_stat counts set,
// job PENDING), and gives every host the tags Cuebot gives it (the
// allocation's ALLOC tag, its HOSTNAME tag, plus any MANUAL/HARDWARE tags).
//
// Units follow the Cuebot schema: the specs take whole cores and KB and the
// seeder stores centicores and KB.
//
// This is the one place in the module that writes farm rows for tests;
// the randomized demo/benchmark farm (shared/testkit/farm) only
// decides a shape and seeds it through a Seeder. Jobs is what makes that
// fast at scale: it launches many jobs and writes all their frames in one
// COPY (or one INSERT of unnested arrays when the DB cannot COPY), after
// the jobs and layers and before the activation, as Cuebot's launch does.
// Frame rows are built in Go, named "%04d-<layer>" like Cuebot's, so frame
// numbers past 9999 keep distinct names.
//
// Also here, for tests that do not run the whole system: SeedAccounting
// (copy caps to Redis and open shows for booking, what the accounting
// bootstrap does on an empty farm) and DBHosts (a host source that queries
// Postgres on every checkout, standing in for the replication-fed host
// cache in tests of the matcher and dispatcher).
package farmseed

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the seeder needs (a pool, a connection or a transaction).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// GB is one gigabyte in the schema's memory unit (KB).
const GB = 1 << 20

// Seeder inserts farm objects. Zero-value fields of specs take Cuebot's
// defaults. Every method returns the new row's key.
type Seeder struct {
	DB DB
	// Dept is the department new folders and jobs use; empty means the seed
	// "Unknown" department.
	Dept string
}

// SeedDept is the seed data's default department ("Unknown").
const SeedDept = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA7"

func (s *Seeder) dept() string {
	if s.Dept != "" {
		return s.Dept
	}
	return SeedDept
}

func newID() string { return uuid.NewString() }

// Facility inserts a facility.
func (s *Seeder) Facility(ctx context.Context, name string) (string, error) {
	id := newID()
	_, err := s.DB.Exec(ctx, `INSERT INTO facility (pk_facility, str_name) VALUES ($1, $2)`, id, name)
	return id, wrap("facility "+name, err)
}

// Department inserts a department (folders, points and jobs of a show are
// per department; set Seeder.Dept or JobSpec.Dept to use it).
func (s *Seeder) Department(ctx context.Context, name string) (string, error) {
	id := newID()
	_, err := s.DB.Exec(ctx, `INSERT INTO dept (pk_dept, str_name) VALUES ($1, $2)`, id, name)
	return id, wrap("dept "+name, err)
}

// Point inserts the (show, department) point Cuebot's dispatch query joins
// and its accounting updates. Show already inserts the point of the
// seeder's department; jobs of any other department need one too.
func (s *Seeder) Point(ctx context.Context, show Show, dept string) (string, error) {
	id := newID()
	_, err := s.DB.Exec(ctx, `INSERT INTO point (pk_point, pk_dept, pk_show) VALUES ($1, $2, $3)`, id, dept, show.ID)
	return id, wrap("point of "+show.Name, err)
}

// Show is a seeded show and its root folder.
type Show struct {
	ID, Name, RootFolder string
}

// Show inserts a show with its show_stats row, root folder (whose
// folder_resource the trigger creates) and point for the seeder's
// department.
func (s *Seeder) Show(ctx context.Context, name string, managed bool) (Show, error) {
	sh := Show{ID: newID(), Name: name, RootFolder: newID()}
	if _, err := s.DB.Exec(ctx, `INSERT INTO show (pk_show, str_name, b_scheduler_managed) VALUES ($1, $2, $3)`,
		sh.ID, name, managed); err != nil {
		return sh, wrap("show "+name, err)
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO show_stats (pk_show) VALUES ($1)`, sh.ID); err != nil {
		return sh, wrap("show_stats "+name, err)
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO folder (pk_folder, pk_parent_folder, pk_show, str_name, pk_dept)
		VALUES ($1, NULL, $2, $3, $4)`, sh.RootFolder, sh.ID, name, s.dept()); err != nil {
		return sh, wrap("root folder of "+name, err)
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO point (pk_point, pk_dept, pk_show) VALUES ($1, $2, $3)`,
		newID(), s.dept(), sh.ID); err != nil {
		return sh, wrap("point of "+name, err)
	}
	return sh, nil
}

// Folder inserts a sub-folder with caps in whole cores / GPUs: -1 (any
// negative value) is stored as -1, Cuebot's "unlimited" folder sentinel;
// any other value is a cap, and 0 books nothing.
func (s *Seeder) Folder(ctx context.Context, show Show, name string, maxCores, maxGPUs int) (string, error) {
	id := newID()
	if _, err := s.DB.Exec(ctx, `INSERT INTO folder (pk_folder, pk_parent_folder, pk_show, str_name, pk_dept)
		VALUES ($1, $2, $3, $4, $5)`, id, show.RootFolder, show.ID, name, s.dept()); err != nil {
		return id, wrap("folder "+name, err)
	}
	return id, s.SetFolderCaps(ctx, id, maxCores, maxGPUs)
}

// SetFolderCaps sets folder_resource max cores (whole cores) and max GPUs;
// a negative value is stored as -1 (unlimited), 0 is a cap of 0.
func (s *Seeder) SetFolderCaps(ctx context.Context, folder string, maxCores, maxGPUs int) error {
	_, err := s.DB.Exec(ctx, `UPDATE folder_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_folder = $1`,
		folder, folderCenti(maxCores), max(maxGPUs, -1))
	return wrap("folder caps", err)
}

// folderCenti converts a folder cap in whole cores to centicores, keeping
// the -1 sentinel.
func folderCenti(cores int) int {
	if cores < 0 {
		return -1
	}
	return cores * 100
}

// Uncapped, as JobSpec.MaxCores or MaxGPUs, asks for a job that no job cap
// binds. Cuebot's job_resource caps have no "unlimited" value (a job books
// only while int_cores + need <= int_max_cores, so 0 or -1 books nothing),
// so it is stored as a cap far above any farm: UncappedCores centicores and
// UncappedGPUs GPUs, as an operator would write it.
const (
	Uncapped      = -1
	UncappedCores = 100_000_000 // centicores (a million cores)
	UncappedGPUs  = 1_000_000
)

// SetJobCaps writes job_resource int_max_cores (whole cores) and
// int_max_gpus verbatim, 0 and negative values included (they book
// nothing): use it for a cap JobSpec cannot express (JobSpec reads 0 as
// "default" and a negative value as Uncapped).
func (s *Seeder) SetJobCaps(ctx context.Context, job string, maxCores, maxGPUs int) error {
	_, err := s.DB.Exec(ctx, `UPDATE job_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_job = $1`,
		job, maxCores*100, maxGPUs)
	return wrap("job caps", err)
}

// Alloc inserts an allocation named "<facility name>.<name>" style by the
// caller, carrying tag.
func (s *Seeder) Alloc(ctx context.Context, facility, name, tag string) (string, error) {
	id := newID()
	_, err := s.DB.Exec(ctx, `INSERT INTO alloc (pk_alloc, str_name, str_tag, pk_facility) VALUES ($1, $2, $3, $4)`,
		id, name, tag, facility)
	return id, wrap("alloc "+name, err)
}

// Subscribe subscribes a show to an allocation (size and burst in cores).
func (s *Seeder) Subscribe(ctx context.Context, show Show, alloc string, size, burst int) (string, error) {
	id := newID()
	_, err := s.DB.Exec(ctx, `INSERT INTO subscription (pk_subscription, pk_alloc, pk_show, int_size, int_burst)
		VALUES ($1, $2, $3, $4, $5)`, id, alloc, show.ID, size*100, burst*100)
	return id, wrap("subscription", err)
}

// Limit inserts a limit_record allowing max concurrently running frames.
func (s *Seeder) Limit(ctx context.Context, name string, max int) (string, error) {
	id := newID()
	_, err := s.DB.Exec(ctx, `INSERT INTO limit_record (pk_limit_record, str_name, int_max_value) VALUES ($1, $2, $3)`,
		id, name, max)
	return id, wrap("limit "+name, err)
}

// LimitDenials names the exit statuses limit's licence denials produce
// (cuesched_limit, rollout 0007).
func (s *Seeder) LimitDenials(ctx context.Context, limit string, statuses ...int) error {
	_, err := s.DB.Exec(ctx, `INSERT INTO cuesched_limit (pk_limit_record, int_denial_exit_statuses) VALUES ($1, $2)
		ON CONFLICT (pk_limit_record) DO UPDATE SET int_denial_exit_statuses = EXCLUDED.int_denial_exit_statuses, ts_updated = now()`,
		limit, statuses)
	return wrap("limit denials of "+limit, err)
}

// LimitPerHost marks limit node-locked (cuesched_limit.b_per_host, rollout
// 0010): it counts the hosts holding a seat, not the frames.
func (s *Seeder) LimitPerHost(ctx context.Context, limit string, on bool) error {
	_, err := s.DB.Exec(ctx, `INSERT INTO cuesched_limit (pk_limit_record, b_per_host) VALUES ($1, $2)
		ON CONFLICT (pk_limit_record) DO UPDATE SET b_per_host = EXCLUDED.b_per_host, ts_updated = now()`,
		limit, on)
	return wrap("limit per-host setting of "+limit, err)
}

// HostTag is an extra host tag.
type HostTag struct {
	Name string
	Type string // MANUAL or HARDWARE
}

// HostSpec describes a render host.
type HostSpec struct {
	Name  string
	Alloc string // pk_alloc
	// AllocTag is the allocation's tag; the host gets it as an ALLOC tag.
	AllocTag   string
	Cores      int   // whole cores
	MemKB      int64 // total memory
	GPUs       int
	GPUMemKB   int64
	OS         string // host_stat.str_os; default "linux"
	ThreadMode int    // 0 AUTO, 1 ALL, 2 VARIABLE
	Tags       []HostTag
	// LockState defaults to OPEN; State (host_stat) to UP.
	LockState string
	State     string
}

// Host inserts a host, its host_stat and its tags. The three inserts are
// one statement (one round trip), which matters when a benchmark farm has
// thousands of hosts.
func (s *Seeder) Host(ctx context.Context, h HostSpec) (string, error) {
	id := newID()
	if h.OS == "" {
		h.OS = "linux"
	}
	if h.LockState == "" {
		h.LockState = "OPEN"
	}
	if h.State == "" {
		h.State = "UP"
	}
	if h.MemKB == 0 {
		h.MemKB = 64 * GB
	}
	var tagIDs, names, types []string
	for _, t := range append([]HostTag{{h.AllocTag, "ALLOC"}, {h.Name, "HOSTNAME"}}, h.Tags...) {
		if t.Name != "" {
			tagIDs, names, types = append(tagIDs, newID()), append(names, t.Name), append(types, t.Type)
		}
	}
	// host_stat's foreign key is checked at the end of the statement, when
	// the host row exists.
	_, err := s.DB.Exec(ctx, `WITH h AS (
		INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_procs,
			int_cores_idle, int_mem, int_mem_idle, int_gpus, int_gpus_idle, int_gpu_mem, int_gpu_mem_idle,
			int_thread_mode, str_tags, str_fqdn)
		VALUES ($1, $2, $3, $4, $5, $6, $5, $7, $7, $8, $8, $9, $9, $10, $11, $12)
		RETURNING pk_host
	), hs AS (
		INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free,
			int_gpu_mem_total, int_gpu_mem_free, str_state, str_os, ts_ping)
		SELECT pk_host, pk_host, $7, $7, $9, $9, $13, $14, now() FROM h
	)
	INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type, b_constant)
	SELECT t.id, h.pk_host, t.tag, t.typ, t.typ = 'ALLOC'
	FROM h, unnest($15::text[], $16::text[], $17::text[]) AS t(id, tag, typ)`,
		id, h.Alloc, h.Name, h.LockState, h.Cores*100, h.Cores, h.MemKB, h.GPUs, h.GPUMemKB,
		h.ThreadMode, strings.Join(names, " "), h.Name+".farm", h.State, h.OS, tagIDs, names, types)
	return id, wrap("host "+h.Name, err)
}

// LayerSpec describes a layer and its frames.
type LayerSpec struct {
	Name string
	// Tags joined into str_tags as Cuebot does ("a | b").
	Tags []string
	// Range is the frame range (default "1-<Frames>"); Frames, if Range is
	// empty, is the frame count (default 1). Chunk defaults to 1.
	Range  string
	Frames int
	Chunk  int
	// Cores is int_cores_min in whole cores (0 = whole host, negative = all
	// but N); CoresSet marks an explicit 0. Default 1.
	Cores    int
	CoresSet bool
	CoresMax int   // int_cores_max in whole cores, 0 = no cap
	MemKB    int64 // default 1 GB
	GPUs     int
	GPUMemKB int64
	// NotThreadable sets b_threadable = false.
	NotThreadable bool
	Services      string
	Command       string
	Type          string // default RENDER
	Limits        []string
	StartAfter    time.Time
	Env           map[string]string
}

// JobSpec describes a job.
type JobSpec struct {
	// ID is job.pk_job; empty = a fresh UUID. A test whose verdict hangs on
	// the ids (the lottery hashes them) fixes them, so it is the same on
	// every run.
	ID       string
	Name     string
	Show     Show
	Folder   string // default the show's root folder
	Facility string
	Dept     string // job.pk_dept; default the seeder's Dept
	Priority int
	// MaxCores is job_resource.int_max_cores in whole cores (0: the default,
	// 10000 cores). A job cap has no "unlimited" value in Cuebot, so a
	// negative value (Uncapped) is stored as UncappedCores, a cap no farm
	// reaches; write a cap of 0 or below with SetJobCaps. MaxGPUs likewise
	// (0: the default, 100; negative: UncappedGPUs).
	MaxCores int
	MaxGPUs  int
	OS       string // job.str_os; empty = NULL (any OS)
	// MaxRetries is job.int_max_retries; 0 keeps the schema default (3).
	MaxRetries int
	UID        int // 0 = NULL
	User       string
	Shot       string
	LogDir     string
	Paused     bool
	// Started backdates job.ts_started / ts_eligible (age relief tests).
	Started time.Time
	Layers  []LayerSpec
	Env     map[string]string
}

// Job is a seeded job.
type Job struct {
	ID     string
	Name   string
	Layers []Layer
}

// Layer is a seeded layer and its frames (in dispatch order).
type Layer struct {
	ID, Name string
	Frames   []string
}

// FrameCount is the number of frames of the job.
func (j Job) FrameCount() int {
	n := 0
	for _, l := range j.Layers {
		n += len(l.Frames)
	}
	return n
}

// Job inserts and activates a job: layers, frames (WAITING), env, limits,
// stat counts, state PENDING.
func (s *Seeder) Job(ctx context.Context, js JobSpec) (Job, error) {
	jobs, err := s.Jobs(ctx, js)
	if len(jobs) == 0 {
		return Job{Name: js.Name}, err
	}
	return jobs[0], err
}

// Jobs inserts and activates several jobs as Job does, in Cuebot's launch
// order: every job and layer first, then the frames of all of them in one
// statement, then the activation (stat counts, int_max_retries, PENDING).
// The frames go in with COPY when the seeder's DB can do one (a pool, a
// connection or a transaction all can), so seeding tens of thousands of
// frames costs one round trip for the frames, not one per layer. On error
// the jobs inserted so far are returned with it.
func (s *Seeder) Jobs(ctx context.Context, specs ...JobSpec) ([]Job, error) {
	jobs := make([]Job, 0, len(specs))
	var frames []frameRow
	for _, js := range specs {
		j, fr, err := s.insertJob(ctx, js)
		if err != nil {
			return append(jobs, j), err
		}
		jobs = append(jobs, j)
		frames = append(frames, fr...)
	}
	if err := s.insertFrames(ctx, frames); err != nil {
		return jobs, err
	}
	for i, j := range jobs {
		if err := s.activate(ctx, j, specs[i]); err != nil {
			return jobs, err
		}
	}
	return jobs, nil
}

// insertJob inserts the job (STARTUP), its job_resource caps, env and
// layers, and returns the frames to insert.
func (s *Seeder) insertJob(ctx context.Context, js JobSpec) (Job, []frameRow, error) {
	j := Job{ID: js.ID, Name: js.Name}
	if j.ID == "" {
		j.ID = newID()
	}
	folder := js.Folder
	if folder == "" {
		folder = js.Show.RootFolder
	}
	dept := js.Dept
	if dept == "" {
		dept = s.dept()
	}
	user := js.User
	if user == "" {
		user = "artist"
	}
	shot := js.Shot
	if shot == "" {
		shot = "sh010"
	}
	logDir := js.LogDir
	if logDir == "" {
		logDir = "/tmp/logs/" + js.Name
	}
	var os, uid any
	if js.OS != "" {
		os = js.OS
	}
	if js.UID != 0 {
		uid = js.UID
	}
	started := js.Started
	if started.IsZero() {
		started = time.Now()
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO job (pk_job, pk_folder, pk_show, str_name, str_visible_name, str_shot,
		str_user, str_state, str_log_dir, int_uid, b_paused, pk_facility, pk_dept, str_show, str_os,
		ts_started, ts_eligible, ts_updated)
		VALUES ($1, $2, $3, $4, $4, $5, $6, 'STARTUP', $7, $8, $9, $10, $11, $12, $13, $14, $14, $14)`,
		j.ID, folder, js.Show.ID, js.Name, shot, user, logDir, uid, js.Paused, js.Facility, dept,
		js.Show.Name, os, started); err != nil {
		return j, nil, wrap("job "+js.Name, err)
	}
	maxCores := 10000 * 100
	switch {
	case js.MaxCores < 0:
		maxCores = UncappedCores
	case js.MaxCores > 0:
		maxCores = js.MaxCores * 100
	}
	maxGPUs := 100
	switch {
	case js.MaxGPUs < 0:
		maxGPUs = UncappedGPUs
	case js.MaxGPUs > 0:
		maxGPUs = js.MaxGPUs
	}
	if _, err := s.DB.Exec(ctx, `UPDATE job_resource SET int_priority = $2, int_max_cores = $3, int_max_gpus = $4
		WHERE pk_job = $1`, j.ID, js.Priority, maxCores, maxGPUs); err != nil {
		return j, nil, wrap("job_resource "+js.Name, err)
	}
	for k, v := range js.Env {
		if _, err := s.DB.Exec(ctx, `INSERT INTO job_env (pk_job_env, pk_job, str_key, str_value) VALUES ($1, $2, $3, $4)`,
			newID(), j.ID, k, v); err != nil {
			return j, nil, wrap("job_env", err)
		}
	}
	var frames []frameRow
	for i, ls := range js.Layers {
		l, fr, err := s.layer(ctx, j.ID, i+1, ls)
		if err != nil {
			return j, nil, err
		}
		j.Layers = append(j.Layers, l)
		frames = append(frames, fr...)
	}
	return j, frames, nil
}

// activate does what Cuebot's activateJob does for frames inserted
// WAITING: it sets the layer_stat and job_stat counts and the job's frame
// and layer counts, and moves the job to PENDING.
func (s *Seeder) activate(ctx context.Context, j Job, js JobSpec) error {
	for _, l := range j.Layers {
		if _, err := s.DB.Exec(ctx, `UPDATE layer_stat SET int_waiting_count = $2, int_total_count = $2 WHERE pk_layer = $1`,
			l.ID, len(l.Frames)); err != nil {
			return wrap("layer_stat of "+l.Name, err)
		}
	}
	total := j.FrameCount()
	if _, err := s.DB.Exec(ctx, `UPDATE job_stat SET int_waiting_count = $2 WHERE pk_job = $1`, j.ID, total); err != nil {
		return wrap("job_stat", err)
	}
	// A zero MaxRetries keeps the column default (no second statement).
	var retries any
	if js.MaxRetries != 0 {
		retries = js.MaxRetries
	}
	if _, err := s.DB.Exec(ctx, `UPDATE job SET str_state = 'PENDING', int_frame_count = $2, int_layer_count = $3,
		int_max_retries = COALESCE($4::smallint, int_max_retries) WHERE pk_job = $1`,
		j.ID, total, len(j.Layers), retries); err != nil {
		return wrap("activate job", err)
	}
	return nil
}

// frameRow is one frame to insert, WAITING.
type frameRow struct {
	id, layer, job, name string
	number, order        int64 // int_number, int_dispatch_order
	layerOrder           int32
}

// frameColumns are the frame columns insertFrames writes, in row order.
var frameColumns = []string{"pk_frame", "pk_layer", "pk_job", "str_name", "str_state", "int_number",
	"int_dispatch_order", "int_layer_order", "ts_updated"}

// copier is the part of pgxpool.Pool, pgx.Conn and pgx.Tx that COPYs.
type copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
}

// insertFrames inserts frames WAITING in one statement: a COPY if the DB
// can, else an INSERT of unnested arrays.
func (s *Seeder) insertFrames(ctx context.Context, frames []frameRow) error {
	if len(frames) == 0 {
		return nil
	}
	if c, ok := s.DB.(copier); ok {
		now := time.Now()
		_, err := c.CopyFrom(ctx, pgx.Identifier{"frame"}, frameColumns, pgx.CopyFromSlice(len(frames), func(i int) ([]any, error) {
			f := &frames[i]
			return []any{f.id, f.layer, f.job, f.name, "WAITING", f.number, f.order, f.layerOrder, now}, nil
		}))
		return wrap(fmt.Sprintf("%d frames", len(frames)), err)
	}
	cols := struct {
		id, layer, job, name []string
		number, order        []int64
		layerOrder           []int32
	}{}
	for _, f := range frames {
		cols.id, cols.layer, cols.job, cols.name = append(cols.id, f.id), append(cols.layer, f.layer), append(cols.job, f.job), append(cols.name, f.name)
		cols.number, cols.order, cols.layerOrder = append(cols.number, f.number), append(cols.order, f.order), append(cols.layerOrder, f.layerOrder)
	}
	_, err := s.DB.Exec(ctx, `INSERT INTO frame (`+strings.Join(frameColumns, ", ")+`)
		SELECT id, layer, job, name, 'WAITING', n, ord, lord, now()
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::int[])
		     AS f(id, layer, job, name, n, ord, lord)`,
		cols.id, cols.layer, cols.job, cols.name, cols.number, cols.order, cols.layerOrder)
	return wrap(fmt.Sprintf("%d frames", len(frames)), err)
}

// layer inserts a layer, its env and limits, and returns its frames: one
// per chunk start, named and ordered as Cuebot names and orders them.
func (s *Seeder) layer(ctx context.Context, job string, order int, ls LayerSpec) (Layer, []frameRow, error) {
	l := Layer{ID: newID(), Name: ls.Name}
	if l.Name == "" {
		l.Name = fmt.Sprintf("layer%d", order)
	}
	rng := ls.Range
	if rng == "" {
		n := ls.Frames
		if n <= 0 {
			n = 1
		}
		rng = fmt.Sprintf("1-%d", n)
	}
	chunk := ls.Chunk
	if chunk <= 0 {
		chunk = 1
	}
	numbers, err := expandRange(rng)
	if err != nil {
		return l, nil, err
	}
	cores := 100
	if ls.Cores != 0 || ls.CoresSet {
		cores = ls.Cores * 100
	}
	mem := ls.MemKB
	if mem == 0 {
		mem = GB
	}
	typ := ls.Type
	if typ == "" {
		typ = "RENDER"
	}
	cmd := ls.Command
	if cmd == "" {
		cmd = "render -f #IFRAME# #LAYER#"
	}
	services := ls.Services
	if services == "" {
		services = "default"
	}
	var startAfter any
	if !ls.StartAfter.IsZero() {
		startAfter = ls.StartAfter
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO layer (pk_layer, pk_job, str_name, str_cmd, str_range, int_chunk_size,
		int_dispatch_order, int_cores_min, int_cores_max, int_mem_min, str_tags, str_type, b_threadable,
		str_services, int_gpus_min, int_gpu_mem_min, ts_start_after)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`,
		l.ID, job, l.Name, cmd, rng, chunk, order, cores, ls.CoresMax*100, mem, strings.Join(ls.Tags, " | "),
		typ, !ls.NotThreadable, services, ls.GPUs, ls.GPUMemKB, startAfter); err != nil {
		return l, nil, wrap("layer "+l.Name, err)
	}
	for k, v := range ls.Env {
		if _, err := s.DB.Exec(ctx, `INSERT INTO layer_env (pk_layer_env, pk_layer, pk_job, str_key, str_value)
			VALUES ($1, $2, $3, $4, $5)`, newID(), l.ID, job, k, v); err != nil {
			return l, nil, wrap("layer_env", err)
		}
	}
	for _, lim := range ls.Limits {
		if _, err := s.DB.Exec(ctx, `INSERT INTO layer_limit (pk_layer_limit, pk_layer, pk_limit_record) VALUES ($1, $2, $3)`,
			newID(), l.ID, lim); err != nil {
			return l, nil, wrap("layer_limit", err)
		}
	}
	// One frame per chunk start, as Cuebot creates them: named
	// "<number, at least 4 digits>-<layer>", dispatch order 0..n-1 within
	// the layer, layer order = the layer's dispatch order.
	var frames []frameRow
	for i := 0; i < len(numbers); i += chunk {
		n := numbers[i]
		f := frameRow{id: newID(), layer: l.ID, job: job, name: fmt.Sprintf("%04d-%s", n, l.Name),
			number: n, order: int64(len(frames)), layerOrder: int32(order)}
		frames = append(frames, f)
		l.Frames = append(l.Frames, f.id)
	}
	return l, frames, nil
}

// expandRange expands the simple ranges the seeder supports: "a-b",
// "a-bxN" and comma lists of those and single numbers.
func expandRange(spec string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		step := int64(1)
		if i := strings.IndexByte(part, 'x'); i > 0 {
			v, err := strconv.ParseInt(part[i+1:], 10, 64)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("farmseed: bad step in range %q", spec)
			}
			step, part = v, part[:i]
		}
		a, b := part, part
		if i := strings.IndexByte(part[1:], '-'); i >= 0 {
			a, b = part[:i+1], part[i+2:]
		}
		lo, err1 := strconv.ParseInt(a, 10, 64)
		hi, err2 := strconv.ParseInt(b, 10, 64)
		if err1 != nil || err2 != nil || hi < lo {
			return nil, fmt.Errorf("farmseed: bad range %q", spec)
		}
		for n := lo; n <= hi; n += step {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("farmseed: insert %s: %w", what, err)
}

// ProcSpec is a proc to insert directly (as if some scheduler had booked
// it): the frame is set RUNNING on the host and the host's idle resources
// are taken.
type ProcSpec struct {
	Host  string // pk_host
	Frame string // pk_frame
	Cores int    // whole cores
	MemKB int64
	GPUs  int
}

// Proc books a frame by hand and returns the proc key.
func (s *Seeder) Proc(ctx context.Context, p ProcSpec) (string, error) {
	id := newID()
	if _, err := s.DB.Exec(ctx, `UPDATE frame SET str_state = 'RUNNING', str_host = (SELECT str_name FROM host WHERE pk_host = $2),
		int_cores = $3, ts_started = now(), ts_updated = now(), int_version = COALESCE(int_version, 0) + 1 WHERE pk_frame = $1`,
		p.Frame, p.Host, p.Cores*100); err != nil {
		return id, wrap("running frame", err)
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO proc (pk_proc, pk_host, pk_show, pk_layer, pk_job, pk_frame,
		int_cores_reserved, int_mem_reserved, int_mem_pre_reserved, int_gpus_reserved)
		SELECT $1, $2, j.pk_show, f.pk_layer, f.pk_job, f.pk_frame, $4, $5, $5, $6
		FROM frame f JOIN job j ON j.pk_job = f.pk_job WHERE f.pk_frame = $3`,
		id, p.Host, p.Frame, p.Cores*100, p.MemKB, p.GPUs); err != nil {
		return id, wrap("proc", err)
	}
	if _, err := s.DB.Exec(ctx, `UPDATE host SET int_cores_idle = int_cores_idle - $2, int_mem_idle = int_mem_idle - $3,
		int_gpus_idle = int_gpus_idle - $4 WHERE pk_host = $1`, p.Host, p.Cores*100, p.MemKB, p.GPUs); err != nil {
		return id, wrap("host idle", err)
	}
	return id, nil
}

// Hosts inserts many hosts as Host does (host, host_stat, the ALLOC and
// HOSTNAME tags plus any extra tags), in one statement per 5,000 hosts:
// a farm of 10,000 hosts seeds in seconds, not in 10,000 round trips.
func (s *Seeder) Hosts(ctx context.Context, specs ...HostSpec) ([]string, error) {
	ids := make([]string, 0, len(specs))
	for len(specs) > 0 {
		n := min(len(specs), 5000)
		batch, err := s.hostBatch(ctx, specs[:n])
		ids = append(ids, batch...)
		if err != nil {
			return ids, err
		}
		specs = specs[n:]
	}
	return ids, nil
}

func (s *Seeder) hostBatch(ctx context.Context, specs []HostSpec) ([]string, error) {
	var c struct {
		id, alloc, name, lock, tags, fqdn, state, os []string
		cores, procs, gpus, mode                     []int32
		mem, gpuMem                                  []int64
		tagID, tagHost, tagName, tagType             []string
	}
	for _, h := range specs {
		id := newID()
		if h.OS == "" {
			h.OS = "linux"
		}
		if h.LockState == "" {
			h.LockState = "OPEN"
		}
		if h.State == "" {
			h.State = "UP"
		}
		if h.MemKB == 0 {
			h.MemKB = 64 * GB
		}
		var names []string
		for _, t := range append([]HostTag{{h.AllocTag, "ALLOC"}, {h.Name, "HOSTNAME"}}, h.Tags...) {
			if t.Name != "" {
				names = append(names, t.Name)
				c.tagID, c.tagHost, c.tagName, c.tagType = append(c.tagID, newID()), append(c.tagHost, id), append(c.tagName, t.Name), append(c.tagType, t.Type)
			}
		}
		c.id, c.alloc, c.name, c.lock = append(c.id, id), append(c.alloc, h.Alloc), append(c.name, h.Name), append(c.lock, h.LockState)
		c.tags, c.fqdn, c.state, c.os = append(c.tags, strings.Join(names, " ")), append(c.fqdn, h.Name+".farm"), append(c.state, h.State), append(c.os, h.OS)
		c.cores, c.procs, c.gpus, c.mode = append(c.cores, int32(h.Cores*100)), append(c.procs, int32(h.Cores)), append(c.gpus, int32(h.GPUs)), append(c.mode, int32(h.ThreadMode))
		c.mem, c.gpuMem = append(c.mem, h.MemKB), append(c.gpuMem, h.GPUMemKB)
	}
	_, err := s.DB.Exec(ctx, `WITH h AS (
		INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_procs,
			int_cores_idle, int_mem, int_mem_idle, int_gpus, int_gpus_idle, int_gpu_mem, int_gpu_mem_idle,
			int_thread_mode, str_tags, str_fqdn)
		SELECT id, alloc, name, lock, cores, procs, cores, mem, mem, gpus, gpus, gmem, gmem, mode, tags, fqdn
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::int[], $7::bigint[], $8::int[],
		              $9::bigint[], $10::int[], $11::text[], $12::text[])
		       AS u(id, alloc, name, lock, cores, procs, mem, gpus, gmem, mode, tags, fqdn)
		RETURNING pk_host, int_mem, int_gpu_mem
	), hs AS (
		INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free,
			int_gpu_mem_total, int_gpu_mem_free, str_state, str_os, ts_ping)
		SELECT h.pk_host, h.pk_host, h.int_mem, h.int_mem, h.int_gpu_mem, h.int_gpu_mem, u.state, u.os, now()
		  FROM h JOIN unnest($1::text[], $13::text[], $14::text[]) AS u(id, state, os) ON u.id = h.pk_host
	)
	INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type, b_constant)
	SELECT t.id, t.host, t.tag, t.typ, t.typ = 'ALLOC'
	  FROM unnest($15::text[], $16::text[], $17::text[], $18::text[]) AS t(id, host, tag, typ)
	 WHERE EXISTS (SELECT 1 FROM h WHERE h.pk_host = t.host)`,
		c.id, c.alloc, c.name, c.lock, c.cores, c.procs, c.mem, c.gpus, c.gpuMem, c.mode, c.tags, c.fqdn,
		c.state, c.os, c.tagID, c.tagHost, c.tagName, c.tagType)
	return c.id, wrap(fmt.Sprintf("%d hosts", len(specs)), err)
}
