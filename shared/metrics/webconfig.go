package metrics

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// WebConfig is the subset of the Prometheus exporter-toolkit web
// configuration file (--web.config.file) the endpoint supports, with the
// same keys, so one file serves node_exporter and cuesched alike:
//
//	tls_server_config:
//	  cert_file: /etc/cuesched/tls/server.crt
//	  key_file: /etc/cuesched/tls/server.key
//	  client_ca_file: /etc/cuesched/tls/prometheus-ca.crt   # optional (mTLS)
//	  client_auth_type: RequireAndVerifyClientCert          # default NoClientCert
//	  min_version: TLS12                                    # default TLS12
//	basic_auth_users:
//	  prometheus: $2y$10$...   # a bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')
//
// Anything else in the file is an error naming the key. The files are read
// once, at start-up.
type WebConfig struct {
	TLSServerConfig *TLSServerConfig  `yaml:"tls_server_config"`
	BasicAuthUsers  map[string]string `yaml:"basic_auth_users"`

	tls   *tls.Config
	cache *authCache
}

// TLSServerConfig is the tls_server_config section.
type TLSServerConfig struct {
	CertFile       string `yaml:"cert_file"`
	KeyFile        string `yaml:"key_file"`
	ClientCAFile   string `yaml:"client_ca_file"`
	ClientAuthType string `yaml:"client_auth_type"`
	MinVersion     string `yaml:"min_version"`
}

var clientAuthTypes = map[string]tls.ClientAuthType{
	"":                           tls.NoClientCert,
	"NoClientCert":               tls.NoClientCert,
	"RequestClientCert":          tls.RequestClientCert,
	"RequireAnyClientCert":       tls.RequireAnyClientCert,
	"VerifyClientCertIfGiven":    tls.VerifyClientCertIfGiven,
	"RequireAndVerifyClientCert": tls.RequireAndVerifyClientCert,
}

var tlsVersions = map[string]uint16{"": tls.VersionTLS12, "TLS12": tls.VersionTLS12, "TLS13": tls.VersionTLS13}

// LoadWebConfig reads and checks the web configuration file at path. An
// error names the file and the key (and the file a key points at).
func LoadWebConfig(path string) (*WebConfig, error) {
	bad := func(key, format string, a ...any) error {
		if key == "" {
			return fmt.Errorf("web config %s: %s", path, fmt.Sprintf(format, a...))
		}
		return fmt.Errorf("web config %s: %s: %s", path, key, fmt.Sprintf(format, a...))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, bad("", "%v", err)
	}
	wc := &WebConfig{cache: &authCache{ok: map[[32]byte]bool{}}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(wc); err != nil && err.Error() != "EOF" {
		return nil, bad("", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	users := make([]string, 0, len(wc.BasicAuthUsers))
	for u := range wc.BasicAuthUsers {
		users = append(users, u)
	}
	sort.Strings(users)
	for _, u := range users {
		if u == "" || strings.Contains(u, ":") {
			return nil, bad("basic_auth_users", "user name %q: must be non-empty and without ':'", u)
		}
		// Never quote the hash: name the user.
		if _, err := bcrypt.Cost([]byte(wc.BasicAuthUsers[u])); err != nil {
			return nil, bad("basic_auth_users."+u, "not a bcrypt hash (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')")
		}
	}
	t := wc.TLSServerConfig
	if t == nil {
		return wc, nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, bad("tls_server_config", "cert_file and key_file are both required")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, bad("tls_server_config.cert_file/key_file", "%s, %s: %v", t.CertFile, t.KeyFile, err)
	}
	auth, ok := clientAuthTypes[t.ClientAuthType]
	if !ok {
		return nil, bad("tls_server_config.client_auth_type", "%q is not one of NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert", t.ClientAuthType)
	}
	minV, ok := tlsVersions[t.MinVersion]
	if !ok {
		return nil, bad("tls_server_config.min_version", "%q is not TLS12 or TLS13", t.MinVersion)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: auth, MinVersion: minV}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, bad("tls_server_config.client_ca_file", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, bad("tls_server_config.client_ca_file", "%s holds no PEM certificate", t.ClientCAFile)
		}
		cfg.ClientCAs = pool
	} else if auth == tls.VerifyClientCertIfGiven || auth == tls.RequireAndVerifyClientCert {
		return nil, bad("tls_server_config.client_ca_file", "required with client_auth_type %s", t.ClientAuthType)
	}
	wc.tls = cfg
	return wc, nil
}

// TLS is the server TLS configuration, nil for plain HTTP.
func (wc *WebConfig) TLS() *tls.Config {
	if wc == nil {
		return nil
	}
	return wc.tls
}

// wrap puts basic authentication in front of next when users are
// configured (every path: /metrics, /healthz and /readyz alike).
func (wc *WebConfig) wrap(next http.Handler) http.Handler {
	if wc == nil || len(wc.BasicAuthUsers) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if ok && wc.check(user, pass) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="cuesched", charset="UTF-8"`)
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	})
}

// check verifies a user's password against its bcrypt hash. Successful
// checks are remembered (by a hash of user, password and stored hash) so a
// scrape every few seconds does not pay bcrypt's cost each time; failures
// always pay it.
func (wc *WebConfig) check(user, pass string) bool {
	hash, known := wc.BasicAuthUsers[user]
	if !known {
		// Same work as a known user, so timing does not tell users apart.
		_ = bcrypt.CompareHashAndPassword([]byte("$2a$10$0000000000000000000000000000000000000000000000000000."), []byte(pass))
		return false
	}
	key := sha256.Sum256([]byte(user + "\x00" + pass + "\x00" + hash))
	if wc.cache.get(key) {
		return true
	}
	if bcrypt.CompareHashAndPassword([]byte(hash), []byte(pass)) != nil {
		return false
	}
	wc.cache.put(key)
	return true
}

// authCache remembers successful checks, bounded.
type authCache struct {
	mu sync.Mutex
	ok map[[32]byte]bool
}

func (c *authCache) get(k [32]byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for stored := range c.ok {
		if subtle.ConstantTimeCompare(stored[:], k[:]) == 1 {
			return true
		}
	}
	return false
}

func (c *authCache) put(k [32]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ok) >= 64 {
		clear(c.ok)
	}
	c.ok[k] = true
}
