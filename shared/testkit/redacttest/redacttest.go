// Package redacttest is test support for the binaries' "no password in any
// output" tests: connection settings that carry one password (Secret) in
// every malformed or unreachable shape, and the check of a command's
// output. Production code never imports it.
package redacttest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Secret is the password every case's URLs carry.
const Secret = "S3cretCanaryPW"

// Settings are one case's connection settings.
type Settings struct {
	Name     string
	Database string // database.url
	Redis    string // accounting.redis_url
	// Unreachable: both URLs are well-formed; a daemon keeps retrying, so
	// run it under a short deadline and do not expect it to exit itself.
	Unreachable bool
}

// Unreachable URLs parse but point at a closed loopback port, so the
// command gets past parsing and fails connecting (connection refused).
var (
	pgUnreachable    = "postgres://postgres:" + Secret + "@127.0.0.1:1/cuebot?connect_timeout=5"
	redisUnreachable = "redis://acct:" + Secret + "@127.0.0.1:1/0"
)

// Cases are the settings every command is run with: each malformed
// database URL or DSN with a well-formed Redis URL, each malformed Redis
// URL with a well-formed (unreachable) database URL, and both unreachable.
func Cases() []Settings {
	var out []Settings
	for name, pg := range map[string]string{
		"pg bad port":       "postgres://postgres:" + Secret + "@127.0.0.1:bad/cuebot",
		"pg bad escape":     "postgres://postgres:" + Secret + "%zz@127.0.0.1/cuebot",
		"pg bad host":       "postgresql://postgres:" + Secret + "@[::1/cuebot",
		"pg bad sslmode":    "postgres://postgres:" + Secret + "@127.0.0.1:1/cuebot?sslmode=bogus",
		"pg dsn bad port":   "host=127.0.0.1 port=bad user=postgres password=" + Secret,
		"pg query password": "postgres://127.0.0.1:bad/cuebot?user=postgres&password=" + Secret,
	} {
		out = append(out, Settings{Name: name, Database: pg, Redis: redisUnreachable})
	}
	for name, r := range map[string]string{
		"redis bad port":   "redis://acct:" + Secret + "@127.0.0.1:bad/0",
		"redis bad escape": "redis://acct:" + Secret + "%zz@127.0.0.1:1/0",
		"redis bad db":     "redis://acct:" + Secret + "@127.0.0.1:1/notanumber",
		"redis bad option": "redis://acct:" + Secret + "@127.0.0.1:1/0?dial_timeout=bogus",
		"redis bad scheme": "http://acct:" + Secret + "@127.0.0.1:1/0",
		"rediss bad port":  "rediss://acct:" + Secret + "@127.0.0.1:bad/0",
	} {
		out = append(out, Settings{Name: name, Database: pgUnreachable, Redis: r})
	}
	// Both well-formed: a tool fails connecting, a daemon retries until
	// its context ends (Settings.Unreachable).
	out = append(out, Settings{Name: "both unreachable", Database: pgUnreachable, Redis: redisUnreachable, Unreachable: true})
	return out
}

// Env is the case as the CUESCHED_ environment overrides.
func (s Settings) Env() map[string]string {
	return map[string]string{"CUESCHED_DATABASE_URL": s.Database, "CUESCHED_ACCOUNTING_REDIS_URL": s.Redis}
}

// Flags is the case as the tools' connection flags.
func (s Settings) Flags() []string {
	return []string{"--database-url", s.Database, "--redis-url", s.Redis}
}

// ConfigFile writes the case as a configuration file in dir (metrics
// endpoint off, so no daemon binds a port) and returns its path.
func (s Settings) ConfigFile(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, strings.ReplaceAll(s.Name, " ", "-")+".yaml")
	body := fmt.Sprintf("database:\n  url: %q\n  connect_timeout: 5s\naccounting:\n  redis_url: %q\nmetrics:\n  listen: \"\"\n", s.Database, s.Redis)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// CheckOutput fails the test when out holds the password in any form.
func CheckOutput(t testing.TB, what, out string) {
	t.Helper()
	for _, form := range []string{Secret, strings.ToLower(Secret)} {
		if strings.Contains(out, form) {
			t.Errorf("%s: the password is in the output:\n%s", what, out)
			return
		}
	}
}
