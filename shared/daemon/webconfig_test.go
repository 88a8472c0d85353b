package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/metrics"
)

// metrics.web_config_file is loaded at start-up: a bad one stops the daemon
// with an error naming the key, the web config file and the file it points
// at; max_connections below 1 is refused by the configuration.
func TestWebConfigFileSetting(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "server.crt")
	web := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(web, []byte("tls_server_config:\n  cert_file: "+missing+"\n  key_file: "+missing+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Metrics.WebConfigFile = web
	_, err := New("test", cfg, &lockedBuf{}, metrics.Build{})
	if err == nil {
		t.Fatal("a web config naming a missing certificate was accepted")
	}
	for _, w := range []string{"metrics.web_config_file", web, "tls_server_config.cert_file", missing} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	env := map[string]string{"CUESCHED_METRICS_MAX_CONNECTIONS": "0"}
	if _, err := config.Load("", func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "metrics.max_connections") {
		t.Errorf("max_connections 0: %v", err)
	}
}
