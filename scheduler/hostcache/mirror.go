package hostcache

import (
	"slices"
	"time"

	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/replication"
)

// The mirror: the rows of the host-cache publication the cache needs,
// maintained from the snapshot and the WAL. Only the columns below are
// kept; everything else in those tables is ignored.

// snapshotQueries load the mirror inside the replication snapshot. They name
// their columns so the rows look like the streamed ones.
var snapshotQueries = []struct{ table, sql string }{
	{"facility", `SELECT pk_facility, str_name FROM facility`},
	{"show", `SELECT pk_show, str_name FROM show`},
	{"alloc", `SELECT pk_alloc, str_name, pk_facility, str_tag FROM alloc`},
	{"subscription", `SELECT pk_subscription, pk_alloc, pk_show, int_burst, int_cores FROM subscription`},
	{"host_stat", `SELECT pk_host_stat, pk_host, int_mem_total, int_mem_free, int_gpu_mem_free, str_state, str_os, ts_ping FROM host_stat`},
	{"host_tag", `SELECT pk_host_tag, pk_host, str_tag, str_tag_type FROM host_tag`},
	{"host", `SELECT pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle, int_mem_idle,
		int_gpus_idle, int_gpu_mem_idle, int_thread_mode, int_gpus, int_gpu_mem FROM host`},
}

// idle is the four idle columns of a host row (centicores, KB, devices, KB).
type idle struct{ cores, memKB, gpus, gpuMemKB int64 }

type hostRec struct {
	id  string
	seq uint64 // creation order: the stable tie-breaker inside an index bucket

	name, allocID, lockState string
	coresTotal               int64
	gpusTotal, gpuMemTotalKB int64 // host.int_gpus, host.int_gpu_mem
	row                      idle  // host.int_*_idle
	threadMode               int

	stat *statRec // host_stat row, nil while absent
	tags []string // distinct host_tag names

	lsn     replication.LSN // commit LSN of the last WAL change to the host's rows
	version uint64          // bumped by every change (WAL or check-in)

	// Cache bookkeeping, guarded by Cache.mu.
	groups           []*group // groups the host is indexed in
	coreKey, memKey  uint32   // keys it is indexed under (the same in every group)
	idx              idle     // effective idle values it was last indexed with
	out              *lease   // set while checked out
	assumed          *assumption
	assumedListIndex int // position in Cache.assumedList (-1 if none)
	// recent are the layers booked on the host lately (locality.go).
	recent []layerUse
	pick   uint64 // the checkout that last collected it as a candidate
}

// servesOS reports whether the host may take a job needing os (Profile.OS),
// on the list split when its host_stat row arrived.
func (h *hostRec) servesOS(os string) bool {
	if os == "" {
		return true
	}
	if h.stat == nil {
		return false
	}
	return cuebot.ServesOS(h.stat.oses, os)
}

type statRec struct {
	id, hostID   string
	memTotalKB   int64
	memFreeKB    int64
	gpuMemFreeKB int64
	state, os    string
	// oses is os split into the OS values the host serves (Cuebot reads
	// str_os as a comma-separated list), shared by every host with the same
	// str_os; read-only.
	oses []string
	ping time.Time
}

type tagRec struct{ id, hostID, tag, tagType string }

type allocRec struct{ id, name, facilityID, tag string }

type subRec struct {
	id, allocID, showID string
	burst, cores        int64 // centicores
}

// cachedTables are the tables of the mirror (those of snapshotQueries).
func cachedTables() []string {
	out := make([]string, len(snapshotQueries))
	for i, q := range snapshotQueries {
		out[i] = q.table
	}
	return out
}

// state is one consistent mirror. A snapshot builds a new one and swaps it
// in; the WAL then updates it in place.
type state struct {
	// tables are the mirrored tables with the schema each name resolved to
	// on the search_path of the session that took the snapshot: the tables
	// the snapshot read. Only their changes are applied.
	tables       replication.Tables
	seq          uint64
	hosts        map[string]*hostRec
	stats        map[string]*statRec // by pk_host_stat
	statByHost   map[string]*statRec
	tags         map[string]*tagRec // by pk_host_tag
	tagsByHost   map[string][]*tagRec
	allocs       map[string]*allocRec
	subs         map[string]*subRec            // by pk_subscription
	subsByAlloc  map[string]map[string]*subRec // alloc -> show -> sub
	allocsByShow map[string]map[string]*subRec // show -> alloc -> sub
	hostsByAlloc map[string]map[*hostRec]struct{}
	shows        map[string]string // pk_show -> name
	facilities   map[string]string // pk_facility -> name
	// strs interns low-cardinality strings (states, OS, tags, alloc ids) so
	// 100k hosts do not hold 100k copies of "OPEN".
	strs map[string]string
	// osLists interns host_stat.str_os split into its values.
	osLists map[string][]string
}

func (st *state) intern(s string) string {
	if v, ok := st.strs[s]; ok {
		return v
	}
	if len(st.strs) < 1<<16 {
		st.strs[s] = s
	}
	return s
}

// osList returns str_os split into the OS values it lists
// (cuebot.HostOSes), shared by every host reporting the same str_os.
func (st *state) osList(s string) []string {
	if v, ok := st.osLists[s]; ok {
		return v
	}
	v := cuebot.HostOSes(s)
	for i := range v {
		v[i] = st.intern(v[i])
	}
	if len(st.osLists) < 1<<16 {
		st.osLists[s] = v
	}
	return v
}

func newState() *state {
	return &state{
		hosts: map[string]*hostRec{}, stats: map[string]*statRec{}, statByHost: map[string]*statRec{},
		tags: map[string]*tagRec{}, tagsByHost: map[string][]*tagRec{}, allocs: map[string]*allocRec{},
		subs: map[string]*subRec{}, subsByAlloc: map[string]map[string]*subRec{},
		allocsByShow: map[string]map[string]*subRec{}, hostsByAlloc: map[string]map[*hostRec]struct{}{},
		shows: map[string]string{}, facilities: map[string]string{}, strs: map[string]string{},
		osLists: map[string][]string{},
	}
}

// effects collects what a change touched, for re-indexing afterwards.
type effects struct {
	hosts  map[*hostRec]struct{} // hosts whose index entries may change
	allocs map[string]struct{}   // allocs whose every host may change
	// rowChanged are hosts whose host row (idle values) changed, for the
	// assume/confirm rule.
	rowChanged map[*hostRec]struct{}
	gone       []*hostRec // hosts deleted
}

func newEffects() *effects {
	return &effects{hosts: map[*hostRec]struct{}{}, allocs: map[string]struct{}{}, rowChanged: map[*hostRec]struct{}{}}
}

func (e *effects) host(h *hostRec) {
	if h != nil {
		e.hosts[h] = struct{}{}
	}
}

// oldKey is the key of the row a change replaces: the old key tuple if the
// key changed, else the new row's key.
func oldKey(c *replication.Change, col string) (string, error) {
	src := c.New
	if !c.Old.IsZero() {
		src = c.Old
	}
	rr := replication.Reader{Row: src, Table: c.Relation.Table}
	k := rr.Key(col)
	return k, rr.Err
}

// apply applies one change to the mirror and records what it touched.
func (st *state) apply(c *replication.Change, e *effects) error {
	switch c.Relation.Table {
	case "host":
		return st.applyHost(c, e)
	case "host_stat":
		return st.applyStat(c, e)
	case "host_tag":
		return st.applyTag(c, e)
	case "alloc":
		return st.applyAlloc(c, e)
	case "subscription":
		return st.applySub(c, e)
	case "show":
		return st.applyNamed(c, st.shows, "pk_show")
	case "facility":
		return st.applyNamed(c, st.facilities, "pk_facility")
	}
	return nil // not mirrored (a publication with more tables)
}

func (st *state) applyHost(c *replication.Change, e *effects) error {
	if c.Op == replication.Delete {
		id, err := oldKey(c, "pk_host")
		if err != nil {
			return err
		}
		st.deleteHost(id, e)
		return nil
	}
	prev, err := oldKey(c, "pk_host")
	if err != nil {
		return err
	}
	rr := replication.Reader{Row: c.New, Table: "host"}
	id := rr.Key("pk_host")
	if rr.Err != nil {
		return rr.Err
	}
	var h *hostRec
	if prev != id {
		st.deleteHost(prev, e) // the key changed: the old row is gone
	}
	h = st.hosts[id]
	if h == nil {
		st.seq++
		h = &hostRec{id: id, seq: st.seq, assumedListIndex: -1}
	}
	oldAlloc, oldRow := h.allocID, h.row
	rr.Str("pk_alloc", &h.allocID)
	rr.Str("str_name", &h.name)
	rr.Str("str_lock_state", &h.lockState)
	rr.Int64("int_cores", &h.coresTotal)
	rr.Int64("int_gpus", &h.gpusTotal)
	rr.Int64("int_gpu_mem", &h.gpuMemTotalKB)
	rr.Int64("int_cores_idle", &h.row.cores)
	rr.Int64("int_mem_idle", &h.row.memKB)
	rr.Int64("int_gpus_idle", &h.row.gpus)
	rr.Int64("int_gpu_mem_idle", &h.row.gpuMemKB)
	tm := int64(h.threadMode)
	rr.Int64("int_thread_mode", &tm)
	h.threadMode = int(tm)
	if rr.Err != nil {
		return rr.Err
	}
	h.allocID, h.lockState = st.intern(h.allocID), st.intern(h.lockState)
	if st.hosts[id] == nil {
		st.hosts[id] = h
		h.stat = st.statByHost[id]
		h.tags = tagNames(st.tagsByHost[id])
	}
	if oldAlloc != h.allocID {
		if m := st.hostsByAlloc[oldAlloc]; m != nil {
			delete(m, h)
			if len(m) == 0 {
				delete(st.hostsByAlloc, oldAlloc)
			}
		}
	}
	m := st.hostsByAlloc[h.allocID]
	if m == nil {
		m = map[*hostRec]struct{}{}
		st.hostsByAlloc[h.allocID] = m
	}
	m[h] = struct{}{}
	if c.Op == replication.Insert || h.row != oldRow {
		e.rowChanged[h] = struct{}{}
	}
	e.host(h)
	return nil
}

func (st *state) deleteHost(id string, e *effects) {
	h := st.hosts[id]
	if h == nil {
		return
	}
	delete(st.hosts, id)
	if m := st.hostsByAlloc[h.allocID]; m != nil {
		delete(m, h)
		if len(m) == 0 {
			delete(st.hostsByAlloc, h.allocID)
		}
	}
	e.gone = append(e.gone, h)
	delete(e.hosts, h)
	delete(e.rowChanged, h)
}

func (st *state) applyStat(c *replication.Change, e *effects) error {
	if c.Op == replication.Delete {
		id, err := oldKey(c, "pk_host_stat")
		if err != nil {
			return err
		}
		st.deleteStat(id, e)
		return nil
	}
	prev, err := oldKey(c, "pk_host_stat")
	if err != nil {
		return err
	}
	rr := replication.Reader{Row: c.New, Table: "host_stat"}
	id := rr.Key("pk_host_stat")
	if rr.Err != nil {
		return rr.Err
	}
	if prev != id {
		st.deleteStat(prev, e)
	}
	s := st.stats[id]
	if s == nil {
		s = &statRec{id: id}
	}
	oldHost := s.hostID
	rr.Str("pk_host", &s.hostID)
	rr.Int64("int_mem_total", &s.memTotalKB)
	rr.Int64("int_mem_free", &s.memFreeKB)
	rr.Int64("int_gpu_mem_free", &s.gpuMemFreeKB)
	rr.Str("str_state", &s.state)
	rr.Str("str_os", &s.os)
	rr.Time("ts_ping", &s.ping)
	if rr.Err != nil {
		return rr.Err
	}
	s.state, s.os = st.intern(s.state), st.intern(s.os)
	s.oses = st.osList(s.os)
	if h := st.hosts[s.hostID]; h != nil {
		s.hostID = h.id
	}
	st.stats[id] = s
	if oldHost != s.hostID && oldHost != "" {
		if st.statByHost[oldHost] == s {
			delete(st.statByHost, oldHost)
		}
		if h := st.hosts[oldHost]; h != nil && h.stat == s {
			h.stat = nil
			e.host(h)
		}
	}
	st.statByHost[s.hostID] = s
	if h := st.hosts[s.hostID]; h != nil {
		h.stat = s
		e.host(h)
	}
	return nil
}

func (st *state) deleteStat(id string, e *effects) {
	s := st.stats[id]
	if s == nil {
		return
	}
	delete(st.stats, id)
	if st.statByHost[s.hostID] == s {
		delete(st.statByHost, s.hostID)
	}
	if h := st.hosts[s.hostID]; h != nil && h.stat == s {
		h.stat = nil
		e.host(h)
	}
}

func (st *state) applyTag(c *replication.Change, e *effects) error {
	if c.Op == replication.Delete {
		id, err := oldKey(c, "pk_host_tag")
		if err != nil {
			return err
		}
		st.deleteTag(id, e)
		return nil
	}
	prev, err := oldKey(c, "pk_host_tag")
	if err != nil {
		return err
	}
	rr := replication.Reader{Row: c.New, Table: "host_tag"}
	id := rr.Key("pk_host_tag")
	if rr.Err != nil {
		return rr.Err
	}
	old := st.tags[prev]
	t := &tagRec{id: id}
	if old != nil {
		*t = *old
		t.id = id
	}
	rr.Str("pk_host", &t.hostID)
	rr.Str("str_tag", &t.tag)
	rr.Str("str_tag_type", &t.tagType)
	if rr.Err != nil {
		return rr.Err
	}
	t.tag, t.tagType = st.intern(t.tag), st.intern(t.tagType)
	if h := st.hosts[t.hostID]; h != nil {
		t.hostID = h.id
	}
	st.deleteTag(prev, e)
	if id != prev {
		st.deleteTag(id, e)
	}
	st.tags[id] = t
	st.tagsByHost[t.hostID] = append(st.tagsByHost[t.hostID], t)
	st.refreshTags(t.hostID, e)
	return nil
}

func (st *state) deleteTag(id string, e *effects) {
	t := st.tags[id]
	if t == nil {
		return
	}
	delete(st.tags, id)
	list := st.tagsByHost[t.hostID]
	if i := slices.Index(list, t); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(st.tagsByHost, t.hostID)
	} else {
		st.tagsByHost[t.hostID] = list
	}
	st.refreshTags(t.hostID, e)
}

func (st *state) refreshTags(hostID string, e *effects) {
	if h := st.hosts[hostID]; h != nil {
		h.tags = tagNames(st.tagsByHost[hostID])
		e.host(h)
	}
}

func tagNames(ts []*tagRec) []string {
	if len(ts) == 0 {
		return nil
	}
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		if !slices.Contains(out, t.tag) {
			out = append(out, t.tag)
		}
	}
	return out
}

func (st *state) applyAlloc(c *replication.Change, e *effects) error {
	prev, err := oldKey(c, "pk_alloc")
	if err != nil {
		return err
	}
	if c.Op == replication.Delete {
		delete(st.allocs, prev)
		e.allocs[prev] = struct{}{}
		return nil
	}
	rr := replication.Reader{Row: c.New, Table: "alloc"}
	id := rr.Key("pk_alloc")
	a := &allocRec{id: id}
	if old := st.allocs[prev]; old != nil {
		*a = *old
		a.id = id
	}
	rr.Str("str_name", &a.name)
	rr.Str("pk_facility", &a.facilityID)
	rr.Str("str_tag", &a.tag)
	if rr.Err != nil {
		return rr.Err
	}
	delete(st.allocs, prev)
	st.allocs[id] = a
	e.allocs[prev] = struct{}{}
	e.allocs[id] = struct{}{}
	return nil
}

func (st *state) applySub(c *replication.Change, e *effects) error {
	prev, err := oldKey(c, "pk_subscription")
	if err != nil {
		return err
	}
	if c.Op == replication.Delete {
		st.deleteSub(prev, e)
		return nil
	}
	rr := replication.Reader{Row: c.New, Table: "subscription"}
	id := rr.Key("pk_subscription")
	s := &subRec{id: id}
	if old := st.subs[prev]; old != nil {
		*s = *old
		s.id = id
	}
	rr.Str("pk_alloc", &s.allocID)
	rr.Str("pk_show", &s.showID)
	rr.Int64("int_burst", &s.burst)
	rr.Int64("int_cores", &s.cores)
	if rr.Err != nil {
		return rr.Err
	}
	if old := st.subs[prev]; old != nil && prev == id && old.allocID == s.allocID && old.showID == s.showID {
		// Only the burst or the booked cores moved (every recompute
		// writes them): nothing indexed depends on them (checkouts read
		// them from the record), so no host of the allocation is
		// re-indexed.
		old.burst, old.cores = s.burst, s.cores
		return nil
	}
	st.deleteSub(prev, e)
	st.subs[id] = s
	addSub(st.subsByAlloc, s.allocID, s.showID, s)
	addSub(st.allocsByShow, s.showID, s.allocID, s)
	e.allocs[s.allocID] = struct{}{}
	return nil
}

func (st *state) deleteSub(id string, e *effects) {
	s := st.subs[id]
	if s == nil {
		return
	}
	delete(st.subs, id)
	delSub(st.subsByAlloc, s.allocID, s.showID, s)
	delSub(st.allocsByShow, s.showID, s.allocID, s)
	e.allocs[s.allocID] = struct{}{}
}

func addSub(m map[string]map[string]*subRec, a, b string, s *subRec) {
	inner := m[a]
	if inner == nil {
		inner = map[string]*subRec{}
		m[a] = inner
	}
	inner[b] = s
}

func delSub(m map[string]map[string]*subRec, a, b string, s *subRec) {
	if inner := m[a]; inner != nil && inner[b] == s {
		delete(inner, b)
		if len(inner) == 0 {
			delete(m, a)
		}
	}
}

func (st *state) applyNamed(c *replication.Change, m map[string]string, pk string) error {
	prev, err := oldKey(c, pk)
	if err != nil {
		return err
	}
	if c.Op == replication.Delete {
		delete(m, prev)
		return nil
	}
	rr := replication.Reader{Row: c.New, Table: c.Relation.Table}
	id := rr.Key(pk)
	name := m[prev]
	rr.Str("str_name", &name)
	if rr.Err != nil {
		return rr.Err
	}
	delete(m, prev)
	m[id] = name
	return nil
}
