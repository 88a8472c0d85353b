package rqdclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/certs"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

// rqd.tls: with TLS configured the pool launches on an RQD that serves
// mutual TLS; a plaintext pool (the default, as upstream RQD is plaintext)
// cannot reach it, and a pool without the client certificate is refused.
func TestLaunchOverMutualTLS(t *testing.T) {
	ca := certs.NewCA(t, "rqd")
	srv, cli := ca.Server(t, "rqd-server"), ca.Client(t, "cuesched")
	pair, err := tls.LoadX509KeyPair(srv.CertFile, srv.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AppendCertsFromPEM(pem)
	fake, err := fakerqd.Start(fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour},
		TLS: &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	ctx := context.Background()
	launch := func(tc *tls.Config) error {
		p := rqdclient.New(rqdclient.Options{Resolve: fake.Resolve, TLS: tc, RequestTimeout: 5 * time.Second, ConnectTimeout: 2 * time.Second})
		defer p.Close()
		return p.LaunchFrame(ctx, "hostA", frame())
	}

	mutual, err := config.TLS{Enabled: true, CAFile: ca.CertPEM, CertFile: cli.CertFile, KeyFile: cli.KeyFile, ServerName: "localhost"}.Client("rqd.tls")
	if err != nil {
		t.Fatal(err)
	}
	if err := launch(mutual); err != nil {
		t.Fatalf("launch over mutual TLS: %v", err)
	}
	if n := len(fake.Running("hostA")); n != 1 {
		t.Fatalf("%d frames running after the TLS launch, want 1", n)
	}
	if err := launch(nil); err == nil {
		t.Fatal("a plaintext pool launched on an RQD that serves TLS")
	}
	serverOnly, err := config.TLS{Enabled: true, CAFile: ca.CertPEM, ServerName: "localhost"}.Client("rqd.tls")
	if err != nil {
		t.Fatal(err)
	}
	if err := launch(serverOnly); err == nil {
		t.Fatal("a pool without the client certificate launched on an RQD that requires one")
	}
	if n := len(fake.Running("hostA")); n != 1 {
		t.Fatalf("%d frames running, want only the TLS launch's", n)
	}
}
