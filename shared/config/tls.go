package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLS is a client's TLS settings: the CA that signs the server's
// certificate (empty: the system's roots), a client certificate and key
// for mutual TLS (both or neither), and the name the server's certificate
// must carry (empty: the host dialed). Enabled turns TLS on where it is
// optional (RQD, plaintext by default as upstream RQD is); for Redis a
// rediss:// URL turns it on too.
type TLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// configured reports whether any setting asks for TLS.
func (t TLS) configured() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != ""
}

// Client builds the *tls.Config (nil when no setting asks for TLS). Errors
// name the key under prefix ("accounting.redis_tls") that is wrong.
func (t TLS) Client(prefix string) (*tls.Config, error) {
	if !t.configured() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &Error{Key: prefix + ".ca_file", Msg: err.Error()}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &Error{Key: prefix + ".ca_file", Msg: fmt.Sprintf("%s holds no PEM certificate", t.CAFile)}
		}
		c.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &Error{Key: prefix + ".cert_file", Msg: "client certificate and key: " + err.Error()}
		}
		c.Certificates = []tls.Certificate{pair}
	case t.CertFile != "":
		return nil, &Error{Key: prefix + ".key_file", Msg: "must be set with cert_file (mutual TLS needs both)"}
	case t.KeyFile != "":
		return nil, &Error{Key: prefix + ".cert_file", Msg: "must be set with key_file (mutual TLS needs both)"}
	}
	return c, nil
}
