package rollout

import (
	"context"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"sort"
	"strings"
	"time"
)

// Conn is one cuesched backend seen in pg_stat_activity.
type Conn struct {
	PID         int       `json:"pid"`
	AppName     string    `json:"application_name"`
	Addr        string    `json:"client_addr,omitempty"`
	Since       time.Time `json:"backend_start"`
	BackendType string    `json:"backend_type"`
}

// Instance is a cuesched process, recognised by the application_name
// (AppName) of its connections to this database.
type Instance struct {
	Role string `json:"role"`
	// Name is the instance part of the application_name ("" when the
	// process set only "cuesched-<role>").
	Name string `json:"name"`
	// Conns are its backends, oldest first.
	Conns []Conn `json:"connections"`
	// Leader: one of its backends holds the accounting loops' advisory lock.
	Leader bool `json:"leader,omitempty"`
	// Slots it streams (one of its backends is the slot's active walsender).
	Slots []string `json:"slots,omitempty"`
}

// Label is "role/name", or "role (unnamed)".
func (i Instance) Label() string {
	if i.Name == "" {
		return i.Role + " (unnamed)"
	}
	return i.Role + "/" + i.Name
}

// Addrs are the distinct client addresses of its connections.
func (i Instance) Addrs() []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range i.Conns {
		a := c.Addr
		if a == "" {
			a = "local"
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// Leader is the backend holding the accounting loops' advisory lock.
type Leader struct {
	PID     int       `json:"pid"`
	AppName string    `json:"application_name"`
	Addr    string    `json:"client_addr,omitempty"`
	Since   time.Time `json:"backend_start"`
	// Instance is the instance label when the application_name follows
	// AppName, else "".
	Instance string `json:"instance,omitempty"`
}

func (l *Leader) String() string {
	who := l.Instance
	if who == "" {
		who = fmt.Sprintf("application_name %q", l.AppName)
	}
	return fmt.Sprintf("%s (pid %d%s)", who, l.PID, addrSuffix(l.Addr))
}

func addrSuffix(a string) string {
	if a == "" {
		return ""
	}
	return " from " + a
}

// Slot is one of this database's cuesched replication slots.
type Slot struct {
	Name      string `json:"name"`
	Plugin    string `json:"plugin"`
	Temporary bool   `json:"temporary"`
	Active    bool   `json:"active"`
	// ActivePID is the walsender streaming it; Holder its application_name.
	ActivePID int    `json:"active_pid,omitempty"`
	Holder    string `json:"holder,omitempty"`
	// LagBytes: current WAL position minus confirmed_flush_lsn (what the
	// consumer has not acknowledged yet).
	LagBytes int64 `json:"lag_bytes"`
	// RetainedBytes: current WAL position minus restart_lsn (WAL the server
	// keeps on disk for the slot).
	RetainedBytes int64 `json:"retained_bytes"`
	// WALStatus is pg_replication_slots.wal_status (reserved, extended,
	// unreserved, lost; "" before PostgreSQL 13).
	WALStatus string `json:"wal_status,omitempty"`
	// Sidecar: the name starts with migrations.SidecarSlotPrefix, or a
	// cuesched sidecar (application_name cuesched-sidecar/...) streams it.
	Sidecar bool `json:"sidecar"`
}

// observation is one read of who is connected and who leads.
type observation struct {
	instances []Instance
	leader    *Leader
	slots     []Slot
}

// observe reads cuesched's backends, the loop leader and the slots of this
// database. It is read-only and needs no special privilege: pg_locks and
// the pid and application_name columns of pg_stat_activity are readable by
// every role (other columns of other roles' backends may read as NULL).
func (t *Tool) observe(ctx context.Context, sidecarPrefix, slotPrefix string) (*observation, error) {
	ob := &observation{}

	// The leader: the backend holding the loop lock in this database.
	// A bigint advisory key is split into classid (high 32 bits) and objid
	// (low 32 bits) with objsubid 1.
	rows, err := t.pool.Query(ctx, `
		SELECT l.pid, COALESCE(a.application_name, ''), COALESCE(host(a.client_addr), ''),
		       COALESCE(a.backend_start, now())
		  FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.granted
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND l.classid = (($1::bigint >> 32) & 4294967295)::bigint::oid
		   AND l.objid = ($1::bigint & 4294967295)::bigint::oid
		   AND l.objsubid = 1`, t.opts.LockKey)
	if err != nil {
		return nil, fmt.Errorf("read the loop lock: %w", err)
	}
	for rows.Next() {
		var l Leader
		if err := rows.Scan(&l.PID, &l.AppName, &l.Addr, &l.Since); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the loop lock: %w", err)
		}
		if role, inst, ok := appname.Parse(l.AppName); ok {
			l.Instance = Instance{Role: role, Name: inst}.Label()
		}
		ob.leader = &l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the loop lock: %w", err)
	}

	// Slots of this database named with our prefix, or streamed by a sidecar.
	rows, err = t.pool.Query(ctx, `
		SELECT s.slot_name, COALESCE(s.plugin, ''), s.temporary, s.active, COALESCE(s.active_pid, 0),
		       COALESCE(a.application_name, ''),
		       COALESCE(pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn), 0)::bigint,
		       COALESCE(pg_wal_lsn_diff(w.lsn, s.restart_lsn), 0)::bigint,
		       COALESCE(to_jsonb(s) ->> 'wal_status', '')
		  FROM pg_replication_slots s
		  LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		  CROSS JOIN (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()
		                          ELSE pg_current_wal_lsn() END AS lsn) w
		 WHERE s.database = current_database()
		   AND (left(s.slot_name, length($1)) = $1 OR left(COALESCE(a.application_name, ''), length($2)) = $2)
		 ORDER BY s.slot_name`, slotPrefix, appname.Format(appname.RoleSidecar, ""))
	if err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	for rows.Next() {
		var s Slot
		if err := rows.Scan(&s.Name, &s.Plugin, &s.Temporary, &s.Active, &s.ActivePID, &s.Holder,
			&s.LagBytes, &s.RetainedBytes, &s.WALStatus); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read replication slots: %w", err)
		}
		// A sidecar's slot: named with the sidecar prefix, or streamed by
		// a cuesched sidecar whatever its name (sidecar.slot_name is free).
		role, _, _ := appname.Parse(s.Holder)
		s.Sidecar = strings.HasPrefix(s.Name, sidecarPrefix) || (s.Active && role == appname.RoleSidecar)
		ob.slots = append(ob.slots, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}

	// cuesched backends of this database, grouped into instances.
	rows, err = t.pool.Query(ctx, `
		SELECT pid, application_name, COALESCE(host(client_addr), ''), COALESCE(backend_start, now()),
		       COALESCE(backend_type, '')
		  FROM pg_stat_activity
		 WHERE datname = current_database() AND left(application_name, length($1)) = $1
		   AND pid <> pg_backend_pid()
		 ORDER BY backend_start, pid`, appname.Prefix)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_activity: %w", err)
	}
	byKey := map[string]*Instance{}
	var order []string
	for rows.Next() {
		var c Conn
		if err := rows.Scan(&c.PID, &c.AppName, &c.Addr, &c.Since, &c.BackendType); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read pg_stat_activity: %w", err)
		}
		role, inst, ok := appname.Parse(c.AppName)
		if !ok || role == appname.RoleCLI {
			continue
		}
		key := role + "/" + inst
		in := byKey[key]
		if in == nil {
			in = &Instance{Role: role, Name: inst}
			byKey[key] = in
			order = append(order, key)
		}
		in.Conns = append(in.Conns, c)
		if ob.leader != nil && ob.leader.PID == c.PID {
			in.Leader = true
		}
		for _, s := range ob.slots {
			if s.Active && s.ActivePID == c.PID {
				in.Slots = append(in.Slots, s.Name)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pg_stat_activity: %w", err)
	}
	sort.Slice(order, func(i, j int) bool {
		a, b := byKey[order[i]], byKey[order[j]]
		if a.Role != b.Role {
			return a.Role < b.Role
		}
		return a.Name < b.Name
	})
	for _, k := range order {
		ob.instances = append(ob.instances, *byKey[k])
	}
	return ob, nil
}

// schedulers counts the scheduler instances of an observation.
func (ob *observation) schedulers() int {
	n := 0
	for _, i := range ob.instances {
		if i.Role == appname.RoleScheduler {
			n++
		}
	}
	return n
}
