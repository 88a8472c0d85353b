// Package metrics gives each daemon its own Prometheus registry (never the
// global one) and the HTTP endpoint that serves /metrics, /healthz and
// /readyz.
//
// /healthz answers 200 while the process can serve HTTP (liveness). /readyz
// answers 200 only when every registered readiness check passes, and 503 with
// the failing checks' reasons otherwise, so a load balancer or an operator
// sees *why* (e.g. "accounting: redis empty, re-bootstrapping").
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
)

// Build identifies the binary in cuesched_build_info.
type Build struct {
	Version  string
	Revision string
}

// NewRegistry returns a registry with the Go and process collectors and
// cuesched_build_info registered.
func NewRegistry(b Build) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cuesched_build_info",
		Help: "Build information; always 1.",
	}, []string{"version", "revision"})
	info.WithLabelValues(b.Version, b.Revision).Set(1)
	reg.MustRegister(info)
	return reg
}

// Health holds named readiness checks.
type Health struct {
	mu     sync.Mutex
	checks map[string]func() error
}

// NewHealth returns an empty set of checks (ready).
func NewHealth() *Health { return &Health{checks: map[string]func() error{}} }

// SetCheck registers or replaces a readiness check.
func (h *Health) SetCheck(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks[name] = check
}

// Ready runs every check and returns the failures, sorted by name.
func (h *Health) Ready() []string {
	h.mu.Lock()
	names := make([]string, 0, len(h.checks))
	for n := range h.checks {
		names = append(names, n)
	}
	checks := make(map[string]func() error, len(h.checks))
	for n, c := range h.checks {
		checks[n] = c
	}
	h.mu.Unlock()
	sort.Strings(names)
	var failed []string
	for _, n := range names {
		if err := checks[n](); err != nil {
			failed = append(failed, n+": "+err.Error())
		}
	}
	return failed
}

// Handler serves /metrics, /healthz and /readyz.
func Handler(reg *prometheus.Registry, h *Health) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if failed := h.Ready(); len(failed) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:")
			fmt.Fprintln(w, strings.Join(failed, "\n"))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Server is the running HTTP endpoint.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Endpoint limits (ServeOptions' zero values).
const (
	DefaultMaxConnections    = 64
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
)

// ServeOptions bound the endpoint and secure it.
type ServeOptions struct {
	// MaxConnections caps the connections served at once; more wait in
	// the kernel's accept queue (0: DefaultMaxConnections).
	MaxConnections int
	// Timeouts of the http.Server (0: the defaults above). IdleTimeout
	// closes a keep-alive connection that sent no request for that long.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Web is the TLS and basic-auth configuration (nil: plain HTTP, no
	// authentication).
	Web *WebConfig
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves in the
// background until Shutdown.
func Serve(addr string, reg *prometheus.Registry, h *Health, logger hclog.Logger, o ServeOptions) (*Server, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&o.ReadTimeout, DefaultReadTimeout)
	def(&o.WriteTimeout, DefaultWriteTimeout)
	def(&o.IdleTimeout, DefaultIdleTimeout)
	if o.MaxConnections <= 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	s := &Server{ln: ln, srv: &http.Server{
		Handler:           o.Web.wrap(Handler(reg, h)),
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		ReadTimeout:       o.ReadTimeout,
		WriteTimeout:      o.WriteTimeout,
		IdleTimeout:       o.IdleTimeout,
		TLSConfig:         o.Web.TLS(),
		ErrorLog:          logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}}
	limited := netutil.LimitListener(ln, o.MaxConnections)
	tlsOn := s.srv.TLSConfig != nil // read before Serve* owns the server
	go func() {
		var err error
		if tlsOn {
			err = s.srv.ServeTLS(limited, "", "")
		} else {
			err = s.srv.Serve(limited)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics endpoint stopped", "error", err)
		}
	}()
	logger.Info("serving /metrics, /healthz, /readyz", "addr", ln.Addr().String(), "tls", tlsOn,
		"basic_auth", o.Web != nil && len(o.Web.BasicAuthUsers) > 0, "max_connections", o.MaxConnections)
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops the endpoint.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }
