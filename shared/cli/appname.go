package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/cuesched/cuesched/shared/appname"

	"github.com/cuesched/cuesched/shared/redact"
)

// InstanceName is how this process names itself in logs, application_name
// and `cuesched status`: the configured name, else host/pid.
func InstanceName(configured string) string {
	if configured != "" {
		return configured
	}
	h, _ := os.Hostname()
	if h == "" {
		h = "unknown"
	}
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}

// WithAppName sets application_name on a libpq URL or key=value DSN unless
// it is already set, so every connection of the daemon (pool, replication,
// leader lock) shows up in pg_stat_activity as cuesched-<role>/<instance>.
func WithAppName(dsn, role, instance string) (string, error) {
	name := appname.Format(role, instance)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := redact.ParseURL(dsn)
		if err != nil {
			return "", fmt.Errorf("database.url: %w", err)
		}
		q := u.Query()
		if q.Get("application_name") == "" {
			q.Set("application_name", name)
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	if strings.Contains(dsn, "application_name=") {
		return dsn, nil
	}
	return strings.TrimSpace(dsn + " application_name='" + strings.ReplaceAll(name, "'", `\'`) + "'"), nil
}
