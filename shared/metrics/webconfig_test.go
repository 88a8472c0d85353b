package metrics

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/bcrypt"

	"github.com/cuesched/cuesched/shared/testkit/certs"
)

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func serveWith(t *testing.T, o ServeOptions) *Server {
	t.Helper()
	srv, err := Serve("127.0.0.1:0", NewRegistry(Build{Version: "v", Revision: "r"}), NewHealth(), hclog.NewNullLogger(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv
}

// TLS and basic auth from an exporter-toolkit web configuration file: the
// endpoint answers only over TLS and only with a configured user's
// password, on every path.
func TestWebConfigTLSAndBasicAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := certs.NewCA(t, "metrics")
	srvPair := ca.Server(t, "cuesched")
	hash, err := bcrypt.GenerateFromPassword([]byte("scrape-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, dir, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n  prometheus: %s\n",
		srvPair.CertFile, srvPair.KeyFile, hash))
	wc, err := LoadWebConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := serveWith(t, ServeOptions{Web: wc})
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	do := func(path, user, pass string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+srv.Addr()+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if code := do(p, "", ""); code != http.StatusUnauthorized {
			t.Errorf("%s without credentials: %d, want 401", p, code)
		}
		if code := do(p, "prometheus", "wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong password: %d, want 401", p, code)
		}
		if code := do(p, "nobody", "scrape-pw"); code != http.StatusUnauthorized {
			t.Errorf("%s as an unknown user: %d, want 401", p, code)
		}
		for range 2 { // the second time from the cache
			if code := do(p, "prometheus", "scrape-pw"); code != http.StatusOK {
				t.Errorf("%s with the password: %d, want 200", p, code)
			}
		}
	}
	// Plain HTTP to the TLS port is not served.
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + srv.Addr() + "/metrics")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP served /metrics")
		}
	}
}

// client_auth_type RequireAndVerifyClientCert with client_ca_file: only a
// client with a certificate that CA signed is served.
func TestWebConfigMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := certs.NewCA(t, "server")
	clientCA := certs.NewCA(t, "prom")
	other := certs.NewCA(t, "other")
	sp := ca.Server(t, "cuesched")
	path := writeFile(t, dir, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n",
		sp.CertFile, sp.KeyFile, clientCA.CertPEM))
	wc, err := LoadWebConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := serveWith(t, ServeOptions{Web: wc})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	get := func(pair *certs.Pair) error {
		cfg := &tls.Config{RootCAs: roots}
		if pair != nil {
			c, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := cl.Get("https://" + srv.Addr() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	good := clientCA.Client(t, "prometheus")
	bad := other.Client(t, "intruder")
	if err := get(&good); err != nil {
		t.Errorf("client certificate of the client CA: %v", err)
	}
	if err := get(nil); err == nil {
		t.Error("served a client without a certificate")
	}
	if err := get(&bad); err == nil {
		t.Error("served a client certificate of another CA")
	}
}

// A bad web configuration is refused at load, naming the file and the key
// (and the file a key points at), never quoting a password hash.
func TestWebConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := certs.NewCA(t, "e")
	sp := ca.Server(t, "s")
	missing := filepath.Join(dir, "no-such.crt")
	for _, c := range []struct {
		name, body string
		want       []string
	}{
		{"missing cert", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", missing, sp.KeyFile), []string{"tls_server_config.cert_file", missing}},
		{"no key", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n", sp.CertFile), []string{"tls_server_config", "key_file"}},
		{"missing ca", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n", sp.CertFile, sp.KeyFile, missing), []string{"tls_server_config.client_ca_file", missing}},
		{"ca not pem", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n", sp.CertFile, sp.KeyFile, sp.KeyFile), []string{"tls_server_config.client_ca_file", "no PEM certificate"}},
		{"verify without ca", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n", sp.CertFile, sp.KeyFile), []string{"client_ca_file", "required"}},
		{"bad auth type", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_auth_type: Maybe\n", sp.CertFile, sp.KeyFile), []string{"client_auth_type", "Maybe"}},
		{"unknown key", "tls_server_config:\n  cert_fil: x\n", []string{"cert_fil"}},
		{"plain password", "basic_auth_users:\n  prometheus: hunter2secret\n", []string{"basic_auth_users.prometheus", "not a bcrypt hash"}},
	} {
		path := writeFile(t, dir, strings.ReplaceAll(c.name, " ", "-")+".yml", c.body)
		_, err := LoadWebConfig(path)
		if err == nil {
			t.Errorf("%s: loaded", c.name)
			continue
		}
		for _, w := range append(c.want, path) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", c.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "hunter2secret") {
			t.Errorf("%s: error quotes the password: %q", c.name, err)
		}
	}
	if _, err := LoadWebConfig(filepath.Join(dir, "absent.yml")); err == nil || !strings.Contains(err.Error(), "absent.yml") {
		t.Errorf("absent file: %v", err)
	}
}

// An idle keep-alive connection is closed after IdleTimeout (it used to
// stay open for ever), and no more than MaxConnections are served at once.
func TestServerTimeoutsAndConnectionCap(t *testing.T) {
	t.Parallel()
	request := "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	// Idle timeout.
	srv := serveWith(t, ServeOptions{IdleTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("idle keep-alive connection: read %v, want EOF (closed by the server)", err)
	}

	// Connection cap: three idle keep-alive connections hold every slot;
	// a fourth is served only once one of them goes.
	srv = serveWith(t, ServeOptions{MaxConnections: 3, IdleTimeout: time.Hour})
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		held = append(held, c)
	}
	fourth, err := net.Dial("tcp", srv.Addr()) // queued by the kernel
	if err != nil {
		t.Fatal(err)
	}
	defer fourth.Close()
	if _, err := io.WriteString(fourth, request); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(fourth), nil)
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	// Not served while the three hold their slots (a slow machine can only
	// make this pass, never fail, wrongly).
	select {
	case err := <-got:
		t.Fatalf("a fourth connection was served past max_connections 3 (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("fourth connection after a slot freed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("fourth connection not served after a slot freed")
	}
}
