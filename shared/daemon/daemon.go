// Package daemon is the scaffolding every long-running cuesched mode shares:
// configuration-driven logging, a private Prometheus registry with /metrics,
// /healthz and /readyz, SIGUSR1 toggling debug logging, and a SIGTERM/SIGINT
// drain with a deadline.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/logging"
	"github.com/cuesched/cuesched/shared/metrics"
)

// Daemon carries what a mode needs to run.
type Daemon struct {
	Name     string
	Config   config.Config
	Logger   hclog.Logger
	Registry *prometheus.Registry
	Health   *metrics.Health
	// DrainTimeout bounds how long Run waits for the mode to stop after
	// SIGTERM before returning an error.
	DrainTimeout time.Duration
	toggle       *logging.DebugToggle
	web          *metrics.WebConfig
}

// New builds the logger and registry from cfg.
func New(name string, cfg config.Config, logOut io.Writer, build metrics.Build) (*Daemon, error) {
	logger, err := logging.New(logging.Options{Name: name, Level: cfg.Logging.Level, Format: cfg.Logging.Format, Output: logOut})
	if err != nil {
		return nil, err
	}
	var web *metrics.WebConfig
	if cfg.Metrics.WebConfigFile != "" {
		if web, err = metrics.LoadWebConfig(cfg.Metrics.WebConfigFile); err != nil {
			return nil, fmt.Errorf("metrics.web_config_file: %w", err)
		}
	}
	return &Daemon{
		web:          web,
		Name:         name,
		Config:       cfg,
		Logger:       logger,
		Registry:     metrics.NewRegistry(build),
		Health:       metrics.NewHealth(),
		DrainTimeout: 30 * time.Second,
		toggle:       logging.NewDebugToggle(logger),
	}, nil
}

// Run serves the metrics endpoint and runs fn until it returns or a
// SIGTERM/SIGINT arrives; then fn's context is cancelled and Run waits up to
// DrainTimeout for fn to return. A second signal exits at once.
func (d *Daemon) Run(parent context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	d.toggle.HandleSIGUSR1(ctx)

	var srv *metrics.Server
	if d.Config.Metrics.Listen != "" {
		s, err := metrics.Serve(d.Config.Metrics.Listen, d.Registry, d.Health, d.Logger.Named("http"),
			metrics.ServeOptions{MaxConnections: d.Config.Metrics.MaxConnections, Web: d.web})
		if err != nil {
			return err
		}
		srv = s
		defer func() {
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		}()
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()

	select {
	case err := <-done:
		return err
	case s := <-sigs:
		d.Logger.Info("signal received: draining", "signal", s.String(), "timeout", d.DrainTimeout)
		cancel()
	case <-parent.Done():
		cancel()
	}
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		d.Logger.Info("drained cleanly")
		return nil
	case s := <-sigs:
		return fmt.Errorf("second signal (%s) during drain: exiting without waiting", s)
	case <-time.After(d.DrainTimeout):
		return fmt.Errorf("drain did not finish within %s", d.DrainTimeout)
	}
}
