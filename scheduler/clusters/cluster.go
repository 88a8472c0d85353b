// Package clusters finds the units of work the scheduler iterates over and
// feeds them, round-robin, to the dispatch pipeline.
//
// A cluster is (facility, show, tags): the scheduler asks "which jobs of this
// show want hosts carrying one of these tags in this facility". Clusters are
// derived from the database exactly as the reference scheduler does it
// (rust-scheduler §2): one allocation cluster per (facility, managed active
// show, allocation tag) that some host carries as an ALLOC tag, and, per
// (facility, show), the MANUAL, HOSTNAME and HARDWARE host tags of hosts in
// allocations the show subscribes to, sorted and chunked so thousands of
// host-name tags do not become thousands of clusters. Only shows with
// show.b_scheduler_managed = true and b_active = true ever appear, so the
// scheduler cannot touch a Cuebot-managed show through this package.
//
// The Feed hands clusters to pipeline workers. Three mechanisms keep idle
// clusters cheap:
//
//   - Sleep: a worker returns a cluster with a sleep duration (no jobs: the
//     empty sleep, 30 s; jobs but nothing booked: the saturated sleep, 5 s;
//     a query error: the empty sleep). A sleeping cluster is not handed out.
//     A sleep may carry a Watch (DoneWatch): once it has moved, the cluster
//     is handed out again at once. The pipeline gives saturated passes the
//     host cache's watch of the cluster's host groups and pokes the feed
//     (Poke) at every capacity change, so a cluster wakes when hosts of its
//     own groups gain capacity that fits a layer that missed there, and
//     not when capacity appears anywhere else.
//   - Awake gate: every active_scan_interval one query lists the (show,
//     facility, tag) triples that have waiting frames in pending, unpaused
//     jobs of managed shows. Only clusters with at least one such tag are
//     handed out at all; when a cluster drops out of the awake set its sleep
//     is forgotten, so new work submitted to it is picked up within one scan
//     interval instead of after the rest of a 30 s empty sleep. The scan is a
//     superset of the per-cluster job query (no caps, no headroom), so it
//     never hides a cluster that has bookable work.
//   - The WAL: the set follows the database through the host cache's
//     replication stream (Follower, a hostcache.Tap). A show flipped to
//     b_scheduler_managed or deactivated, a subscription added, removed or
//     resized, an allocation, a facility, a host tag or a host moved to
//     another allocation, and a folder or job cap changed reach the feed
//     (Notify) within milliseconds of their commit. After ChangeDebounce
//     (150 ms, so a burst of changes costs one reload), and once
//     PostgreSQL shows the changes' transactions (the stream delivers a
//     commit a moment before it is visible; see
//     replication.Visibility; a cap read in that moment would be the
//     old one, stamped newer than the change), the feed rebuilds
//     the set if it may have changed, swapping it in only when it changed
//     as a set and keeping the sleep state of surviving clusters; copies
//     the changed caps to the accounting store (CapsChanged); runs the
//     awake scan; and ends the sleeps of the clusters of every show
//     concerned (a pass of theirs in flight goes round again rather than
//     sleep on what it saw before the change).
//   - Safety reload: every cluster_reload_interval the set is rebuilt
//     whatever the WAL said. What it finds added or removed while no WAL
//     change is waiting to be acted on is drift, something the WAL path
//     missed: it is counted (scheduler_cluster_set_drift_total{change})
//     and logged. Drift is expected only from a change committed within
//     moments of the safety reload (the WAL reports it a little later) or
//     from rows the follower cannot judge (see Follower).
//
// Unlike the reference, a cluster is never handed to two workers at once:
// Next marks it in flight until Done returns it. With a short awake list and
// several workers the reference re-sends a cluster every lap while a pass of
// it is still running; here a second pass would only contend for the same
// layers, so it is skipped by construction.
package clusters

import (
	"sort"
	"strings"
)

// TagType is the kind of a host tag (host_tag.str_tag_type).
type TagType string

// Host tag types, in the order the host cache probes them for a layer that
// carries several.
const (
	Manual   TagType = "MANUAL"
	Hostname TagType = "HOSTNAME"
	Hardware TagType = "HARDWARE"
	Alloc    TagType = "ALLOC"
)

// rank orders tag types within a cluster and for probing.
func (t TagType) rank() int {
	switch t {
	case Manual:
		return 0
	case Hostname:
		return 1
	case Hardware:
		return 2
	case Alloc:
		return 3
	}
	return 4
}

// Label is the lower-case name used as a metric label.
func (t TagType) Label() string { return strings.ToLower(string(t)) }

// Tag is one host tag a cluster covers. AllocID is set for ALLOC tags only.
type Tag struct {
	Name    string
	Type    TagType
	AllocID string
}

func tagLess(a, b Tag) bool {
	if a.Type.rank() != b.Type.rank() {
		return a.Type.rank() < b.Type.rank()
	}
	if a.Name != b.Name {
		return a.Name < b.Name
	}
	return a.AllocID < b.AllocID
}

// Cluster is a (facility, show, tags) unit of work. Tags are sorted and all
// of one type. Treat a Cluster as immutable once built.
type Cluster struct {
	FacilityID string
	ShowID     string
	Tags       []Tag
	key        string
}

// New builds a cluster, sorting and de-duplicating its tags.
func New(facilityID, showID string, tags []Tag) *Cluster {
	ts := append([]Tag(nil), tags...)
	sort.Slice(ts, func(i, j int) bool { return tagLess(ts[i], ts[j]) })
	out := ts[:0]
	for i, t := range ts {
		if i > 0 && t == ts[i-1] {
			continue
		}
		out = append(out, t)
	}
	c := &Cluster{FacilityID: facilityID, ShowID: showID, Tags: out}
	var b strings.Builder
	b.WriteString(facilityID)
	b.WriteByte('/')
	b.WriteString(showID)
	for _, t := range out {
		b.WriteByte('/')
		b.WriteString(string(t.Type))
		b.WriteByte(':')
		b.WriteString(t.Name)
		if t.AllocID != "" {
			b.WriteByte('@')
			b.WriteString(t.AllocID)
		}
	}
	c.key = b.String()
	return c
}

// Key identifies the cluster: equal keys mean equal clusters.
func (c *Cluster) Key() string { return c.key }

// String is the key.
func (c *Cluster) String() string { return c.key }

// Type is the type of the cluster's tags ("alloc", "manual", ...), the
// metric label the reference uses.
func (c *Cluster) Type() TagType {
	if len(c.Tags) == 0 {
		return ""
	}
	return c.Tags[0].Type
}

// TagNames lists the tag names, in order.
func (c *Cluster) TagNames() []string {
	out := make([]string, len(c.Tags))
	for i, t := range c.Tags {
		out[i] = t.Name
	}
	return out
}

// AllocID is the allocation of a single-tag allocation cluster, else "".
func (c *Cluster) AllocID() string {
	if len(c.Tags) == 1 && c.Tags[0].Type == Alloc {
		return c.Tags[0].AllocID
	}
	return ""
}

// MatchingTags returns the cluster's tags whose names appear in layerTags,
// in probe order (MANUAL, HOSTNAME, HARDWARE, ALLOC). These are the host
// groups a layer of this cluster may be placed on.
func (c *Cluster) MatchingTags(layerTags []string) []Tag {
	var out []Tag
	for _, t := range c.Tags {
		for _, lt := range layerTags {
			if lt == t.Name {
				out = append(out, t)
				break
			}
		}
	}
	return out
}

// HasAnyTag reports whether the cluster covers one of names (a set).
func (c *Cluster) HasAnyTag(names map[string]struct{}) bool {
	for _, t := range c.Tags {
		if _, ok := names[t.Name]; ok {
			return true
		}
	}
	return false
}

// sortClusters orders clusters deterministically (by key).
func sortClusters(cs []*Cluster) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].key < cs[j].key })
}

// sameSet reports whether a and b (both sorted by key) hold the same clusters.
func sameSet(a, b []*Cluster) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].key != b[i].key {
			return false
		}
	}
	return true
}
