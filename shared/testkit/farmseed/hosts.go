package farmseed

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/cuebot"
)

// DBHosts is a test stand-in for the host cache: every checkout queries
// Postgres for eligible hosts (the reference host query's eligibility:
// OPEN, UP, carrying the tag, in an allocation of the facility the show
// subscribes to; idle memory = least of host idle and host_stat free) and
// hands out one not already checked out. It applies the same gates as the
// cache (OS, host_stat.str_os read as a list; thread mode ALL only for
// threadable layers; GPUs; Accept).
// Best-fit on cores, worst-fit on memory.
type DBHosts struct {
	DB  Querier
	mu  sync.Mutex
	out map[string]bool
	// Checkouts counts successful checkouts.
	Checkouts int
}

// NewDBHosts returns a DBHosts over db.
func NewDBHosts(db Querier) *DBHosts { return &DBHosts{DB: db, out: map[string]bool{}} }

const dbHostsSQL = `
SELECT DISTINCT h.pk_host, h.str_name, h.pk_alloc, hs.str_os, h.int_cores, h.int_cores_idle, hs.int_mem_total,
       LEAST(h.int_mem_idle, hs.int_mem_free) AS mem_idle, h.int_gpus_idle,
       LEAST(h.int_gpu_mem_idle, hs.int_gpu_mem_free), h.int_thread_mode
FROM host h
JOIN host_stat hs   ON hs.pk_host = h.pk_host
JOIN alloc a        ON a.pk_alloc = h.pk_alloc
JOIN subscription s ON s.pk_alloc = a.pk_alloc AND s.pk_show = $1
JOIN host_tag ht    ON ht.pk_host = h.pk_host
WHERE a.pk_facility = $2 AND h.str_lock_state = 'OPEN' AND hs.str_state = 'UP'
  AND ht.str_tag = ANY($3::text[])
  AND h.int_cores_idle >= $4 AND LEAST(h.int_mem_idle, hs.int_mem_free) >= $5 AND h.int_gpus_idle >= $6
ORDER BY h.int_cores_idle, mem_idle DESC, h.pk_host
LIMIT 200`

// Checkout implements matcher.Hosts.
func (d *DBHosts) Checkout(ctx context.Context, req matcher.HostRequest) (sizing.Host, error) {
	var tags []string
	for _, t := range req.Tags {
		tags = append(tags, t.Name)
	}
	rows, err := d.DB.Query(ctx, dbHostsSQL, req.ShowID, req.FacilityID, tags, req.Floor.Cores, req.Floor.MemKB, req.Floor.GPUs)
	if err != nil {
		return sizing.Host{}, fmt.Errorf("farmseed hosts: %w", err)
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sizing.Host, error) {
		var h sizing.Host
		var mode int64
		err := r.Scan(&h.ID, &h.Name, &h.AllocID, &h.OS, &h.TotalCores, &h.IdleCores, &h.TotalMemKB, &h.IdleMemKB,
			&h.IdleGPUs, &h.IdleGPUMemKB, &mode)
		h.ThreadMode = int(mode)
		return h, err
	})
	if err != nil {
		return sizing.Host{}, fmt.Errorf("farmseed hosts: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range cands {
		if d.out[h.ID] {
			continue
		}
		if !cuebot.HostServesOS(h.OS, req.OS) {
			continue
		}
		if h.ThreadMode == sizing.All && !req.Threadable {
			continue
		}
		if h.IdleGPUMemKB < req.Floor.GPUMemKB {
			continue
		}
		if req.Accept != nil && !req.Accept(h) {
			continue
		}
		d.out[h.ID] = true
		d.Checkouts++
		return h, nil
	}
	return sizing.Host{}, matcher.ErrNoCandidate
}

// Checkin implements matcher.Hosts.
func (d *DBHosts) Checkin(h sizing.Host) {
	d.mu.Lock()
	delete(d.out, h.ID)
	d.mu.Unlock()
}

// Out is the number of hosts checked out now.
func (d *DBHosts) Out() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.out)
}

var _ matcher.Hosts = (*DBHosts)(nil)
