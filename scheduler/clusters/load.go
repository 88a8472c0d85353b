package clusters

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what this package needs from a pgx pool or connection.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// LoadOptions scopes and shapes the cluster set.
type LoadOptions struct {
	// FacilityID restricts clusters to one facility (pk_facility); empty
	// means every facility.
	FacilityID string
	// IgnoreTags are dropped from every cluster; clusters left without tags
	// are dropped.
	IgnoreTags []string
	// ManualChunkSize bounds the tags of a MANUAL or HARDWARE cluster,
	// HostnameChunkSize those of a HOSTNAME cluster (reference: 50 each).
	ManualChunkSize   int
	HostnameChunkSize int
}

// ErrUnknownFacility is returned by ResolveFacility for a name that no
// facility row has.
var ErrUnknownFacility = errors.New("unknown facility")

// ResolveFacility maps a facility name (facility.str_name) to its key.
func ResolveFacility(ctx context.Context, db DB, name string) (string, error) {
	var id string
	err := db.QueryRow(ctx, `SELECT pk_facility FROM facility WHERE str_name = $1`, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w %q: no row in table facility has str_name = %q", ErrUnknownFacility, name, name)
	}
	if err != nil {
		return "", fmt.Errorf("resolve facility %q: %w", name, err)
	}
	return id, nil
}

// Allocation clusters: an allocation tag some host carries as an ALLOC tag,
// for every managed active show subscribed to that allocation. The hosts
// are only asked whether the tag exists (not joined row by row: at 10,000
// hosts and 60 shows that join made 600,000 rows for 180 clusters).
const allocClustersSQL = `
SELECT DISTINCT a.str_tag, a.pk_alloc, sh.pk_show, a.pk_facility
FROM alloc a
JOIN subscription s ON s.pk_alloc = a.pk_alloc
JOIN show sh        ON sh.pk_show = s.pk_show
WHERE sh.b_active AND sh.b_scheduler_managed
  AND ($1::text IS NULL OR a.pk_facility = $1)
  AND EXISTS (SELECT 1 FROM host_tag ht WHERE ht.str_tag = a.str_tag AND ht.str_tag_type = 'ALLOC')`

// subscribedSQL: the (allocation, show, facility) of every managed active
// show's subscription.
const subscribedSQL = `
SELECT DISTINCT s.pk_alloc, sh.pk_show, a.pk_facility
FROM subscription s
JOIN show sh ON sh.pk_show = s.pk_show
JOIN alloc a ON a.pk_alloc = s.pk_alloc
WHERE sh.b_active AND sh.b_scheduler_managed
  AND ($1::text IS NULL OR a.pk_facility = $1)`

// Tag clusters: MANUAL, HOSTNAME and HARDWARE tags of hosts whose
// allocation a managed active show subscribes to, once per (tag,
// allocation); Load pairs them with the allocation's shows
// (subscribedSQL). A show-by-tag join here returned every hostname tag
// once per subscribed show (600,000 rows at 10,000 hosts and 60 shows,
// 16 s a load on a busy box).
const tagClustersSQL = `
SELECT DISTINCT ht.str_tag, ht.str_tag_type, h.pk_alloc
FROM host_tag ht
JOIN host h ON h.pk_host = ht.pk_host
WHERE ht.str_tag_type IN ('MANUAL', 'HOSTNAME', 'HARDWARE')
  AND h.pk_alloc IN (SELECT s.pk_alloc FROM subscription s JOIN show sh ON sh.pk_show = s.pk_show
                      JOIN alloc a ON a.pk_alloc = s.pk_alloc
                     WHERE sh.b_active AND sh.b_scheduler_managed
                       AND ($1::text IS NULL OR a.pk_facility = $1))`

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Load reads the cluster set from the database, sorted by key.
func Load(ctx context.Context, db DB, o LoadOptions) ([]*Cluster, error) {
	if o.ManualChunkSize <= 0 {
		o.ManualChunkSize = 50
	}
	if o.HostnameChunkSize <= 0 {
		o.HostnameChunkSize = 50
	}
	ignore := make(map[string]struct{}, len(o.IgnoreTags))
	for _, t := range o.IgnoreTags {
		ignore[t] = struct{}{}
	}
	var out []*Cluster

	rows, err := db.Query(ctx, allocClustersSQL, nullable(o.FacilityID))
	if err != nil {
		return nil, fmt.Errorf("load allocation clusters: %w", err)
	}
	for rows.Next() {
		var tag, alloc, show, facility string
		if err := rows.Scan(&tag, &alloc, &show, &facility); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load allocation clusters: %w", err)
		}
		if _, skip := ignore[tag]; skip {
			continue
		}
		out = append(out, New(facility, show, []Tag{{Name: tag, Type: Alloc, AllocID: alloc}}))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load allocation clusters: %w", err)
	}

	type group struct {
		facility, show string
		typ            TagType
	}
	type showAt struct{ show, facility string }
	subscribed := map[string][]showAt{} // allocation -> its managed shows
	rows, err = db.Query(ctx, subscribedSQL, nullable(o.FacilityID))
	if err != nil {
		return nil, fmt.Errorf("load subscriptions: %w", err)
	}
	for rows.Next() {
		var alloc string
		var sa showAt
		if err := rows.Scan(&alloc, &sa.show, &sa.facility); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load subscriptions: %w", err)
		}
		subscribed[alloc] = append(subscribed[alloc], sa)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load subscriptions: %w", err)
	}
	groups := map[group]map[string]struct{}{}
	rows, err = db.Query(ctx, tagClustersSQL, nullable(o.FacilityID))
	if err != nil {
		return nil, fmt.Errorf("load tag clusters: %w", err)
	}
	for rows.Next() {
		var tag, typ, alloc string
		if err := rows.Scan(&tag, &typ, &alloc); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load tag clusters: %w", err)
		}
		if _, skip := ignore[tag]; skip {
			continue
		}
		// A tag on hosts of two allocations the same show subscribes to
		// is one tag of that show's cluster.
		for _, sa := range subscribed[alloc] {
			g := group{sa.facility, sa.show, TagType(typ)}
			if groups[g] == nil {
				groups[g] = map[string]struct{}{}
			}
			groups[g][tag] = struct{}{}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load tag clusters: %w", err)
	}
	for g, set := range groups {
		names := make([]string, 0, len(set))
		for n := range set {
			names = append(names, n)
		}
		sort.Strings(names)
		size := o.ManualChunkSize
		if g.typ == Hostname {
			size = o.HostnameChunkSize
		}
		for start := 0; start < len(names); start += size {
			end := min(start+size, len(names))
			tags := make([]Tag, 0, end-start)
			for _, n := range names[start:end] {
				tags = append(tags, Tag{Name: n, Type: g.typ})
			}
			out = append(out, New(g.facility, g.show, tags))
		}
	}
	sortClusters(out)
	// Distinct rows can still produce one cluster twice (same tag string in
	// two facilities' allocations is a different key; identical keys are
	// true duplicates).
	dedup := out[:0]
	for i, c := range out {
		if i > 0 && c.key == out[i-1].key {
			continue
		}
		dedup = append(dedup, c)
	}
	return dedup, nil
}

// activeKey is a (show, facility, tag) triple with waiting work.
type activeKey struct {
	show, facility, tag string
}

// The awake scan: a strict superset of what the per-cluster job query can
// return (no folder/job caps, no live headroom), so it never hides work.
const activeScanSQL = `
SELECT DISTINCT j.pk_show, j.pk_facility, t.tag
FROM job j
JOIN show sh        ON sh.pk_show = j.pk_show
JOIN layer l        ON l.pk_job = j.pk_job
JOIN layer_stat ls  ON ls.pk_layer = l.pk_layer
CROSS JOIN LATERAL unnest(string_to_array(replace(l.str_tags::text, ' ', ''), '|')) AS t(tag)
WHERE j.str_state = 'PENDING' AND NOT j.b_paused
  AND sh.b_active AND sh.b_scheduler_managed
  AND ls.int_waiting_count > 0
  AND t.tag <> ''
  AND EXISTS (SELECT 1 FROM subscription s WHERE s.pk_show = j.pk_show AND s.int_burst > 0)
  AND ($1::text IS NULL OR j.pk_facility = $1)`

// scanActive runs the awake scan.
func scanActive(ctx context.Context, db DB, facilityID string) (map[activeKey]struct{}, error) {
	rows, err := db.Query(ctx, activeScanSQL, nullable(facilityID))
	if err != nil {
		return nil, fmt.Errorf("awake scan: %w", err)
	}
	defer rows.Close()
	out := map[activeKey]struct{}{}
	for rows.Next() {
		var k activeKey
		if err := rows.Scan(&k.show, &k.facility, &k.tag); err != nil {
			return nil, fmt.Errorf("awake scan: %w", err)
		}
		out[k] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("awake scan: %w", err)
	}
	return out, nil
}

// isAwake reports whether c has a tag in the scan result.
func isAwake(c *Cluster, scan map[activeKey]struct{}) bool {
	for _, t := range c.Tags {
		if _, ok := scan[activeKey{c.ShowID, c.FacilityID, t.Name}]; ok {
			return true
		}
	}
	return false
}
