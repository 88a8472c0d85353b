// Package appname owns the application_name every cuesched process sets on
// its PostgreSQL connections ("cuesched-<role>/<instance>"), so that
// `cuesched status`, the migrations' slot checks and the sidecar agree on
// one spelling.
package appname

import (
	"strings"
)

// Roles name the kinds of cuesched processes in application_name.
const (
	// RoleScheduler is the standalone scheduler (every connection it opens,
	// including the accounting loop's lock connection and the host-cache
	// replication connection).
	RoleScheduler = "scheduler"
	// RoleSidecar is the release publisher (its pool and its replication
	// connection).
	RoleSidecar = "sidecar"
	// RoleFakeRQD is "cuesched-lab fake-rqd --complete" writing completions
	// into a rehearsal database; Status lists it like any instance.
	RoleFakeRQD = "fake-rqd"
	// RoleCLI is the operator tooling itself ("cuesched show", "cuesched
	// status"); Status leaves it out of the instance list.
	RoleCLI = "cli"
)

// Prefix starts every application_name cuesched sets.
const Prefix = "cuesched-"

// Sidecar is the application_name of a sidecar without an instance name;
// every sidecar connection starts with it.
const Sidecar = Prefix + RoleSidecar

// maxAppName is what PostgreSQL keeps of application_name (NAMEDATALEN - 1
// bytes); it silently truncates longer values.
const maxAppName = 63

// Format is the application_name a cuesched process sets on every
// PostgreSQL connection it opens, so that "cuesched status" can find it in
// pg_stat_activity: "cuesched-<role>/<instance>", e.g.
// "cuesched-scheduler/render-a" or "cuesched-sidecar/cuebot-1". An empty
// instance gives "cuesched-<role>".
//
// PostgreSQL keeps only printable ASCII in application_name (older servers
// replace anything else with '?', PostgreSQL 16 and later with hex escapes)
// and at most 63 bytes. Format replaces every other byte with '_' and
// truncates to 63 bytes itself, so the value a process sets is exactly the
// value the server shows, whatever its version.
// Set it through the connection string (application_name=...) or
// pgx.ConnConfig.RuntimeParams["application_name"], on pooled, dedicated and
// replication connections alike: the replication connection is the one that
// holds a slot, the dedicated one the loop lock.
func Format(role, instance string) string {
	s := Prefix + role
	if instance != "" {
		s += "/" + instance
	}
	b := []byte(s)
	for i, c := range b {
		if c < 32 || c > 126 {
			b[i] = '_'
		}
	}
	if len(b) > maxAppName {
		b = b[:maxAppName]
	}
	return string(b)
}

// Parse is the inverse of Format: "cuesched-<role>[/<instance>]"
// gives role and instance; ok is false for any other application_name. The
// instance may itself contain '/'.
func Parse(name string) (role, instance string, ok bool) {
	rest, found := strings.CutPrefix(name, Prefix)
	if !found || rest == "" {
		return "", "", false
	}
	role, instance, _ = strings.Cut(rest, "/")
	if role == "" {
		return "", "", false
	}
	return role, instance, true
}
