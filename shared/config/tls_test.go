package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/certs"
)

// Bad TLS settings are refused at load, naming the key and the file.
func TestTLSSettings(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "redis")
	cli := ca.Client(t, "cuesched")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "cuesched.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		body, key string
	}{
		{"accounting:\n  redis_tls:\n    ca_file: " + filepath.Join(dir, "missing.pem") + "\n", "accounting.redis_tls.ca_file"},
		{"accounting:\n  redis_tls:\n    ca_file: " + notPEM + "\n", "accounting.redis_tls.ca_file"},
		{"accounting:\n  redis_tls:\n    cert_file: " + cli.CertFile + "\n", "accounting.redis_tls.key_file"},
		{"rqd:\n  tls:\n    enabled: true\n    key_file: " + cli.KeyFile + "\n", "rqd.tls.cert_file"},
		{"rqd:\n  tls:\n    cert_file: " + cli.CertFile + "\n    key_file: " + notPEM + "\n", "rqd.tls.cert_file"},
	}
	for _, c := range cases {
		path := write(c.body)
		_, err := config.Load(path, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), path) {
			t.Errorf("%q: error %v, want one naming %s and %s", c.body, err, c.key, path)
		}
	}
	good := write("accounting:\n  sentinel_master: acct\n  sentinel_addrs: [s1:26379]\n  sentinel_username: sentuser\n  sentinel_password: sentpass\n" +
		"  redis_tls:\n    ca_file: " + ca.CertPEM + "\n    cert_file: " + cli.CertFile + "\n    key_file: " + cli.KeyFile + "\n    server_name: redis.internal\n")
	cfg, err := config.Load(good, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	tc, err := cfg.Accounting.RedisTLS.Client("accounting.redis_tls")
	if err != nil || tc == nil || tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "redis.internal" {
		t.Fatalf("redis TLS = %+v, %v", tc, err)
	}
	if cfg.Accounting.SentinelUsername != "sentuser" || cfg.Accounting.SentinelPassword != "sentpass" {
		t.Fatalf("sentinel credentials not loaded: %+v", cfg.Accounting)
	}
	if tc, err := config.Default().RQD.TLS.Client("rqd.tls"); tc != nil || err != nil {
		t.Fatalf("RQD TLS must be off by default: %v %v", tc, err)
	}
}
