// Package logging builds the hclog loggers cuesched's daemons use: structured
// text or JSON, a configured level, and SIGUSR1 toggling debug on and off at
// run time. Components take an hclog.Logger and call Named on it; sub-loggers
// share the root's level, so the toggle reaches every component.
package logging

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// Options configures New.
type Options struct {
	Name   string // root logger name, e.g. "cuesched"
	Level  string // trace, debug, info, warn, error
	Format string // text or json
	Output io.Writer
}

// ParseLevel maps a level name to hclog's, rejecting unknown names.
func ParseLevel(s string) (hclog.Level, error) {
	l := hclog.LevelFromString(strings.ToLower(strings.TrimSpace(s)))
	if l == hclog.NoLevel {
		return l, fmt.Errorf("unknown log level %q (trace, debug, info, warn, error)", s)
	}
	return l, nil
}

// New builds the root logger.
func New(o Options) (hclog.Logger, error) {
	lvl, err := ParseLevel(o.Level)
	if err != nil {
		return nil, err
	}
	var json bool
	switch o.Format {
	case "", "text":
	case "json":
		json = true
	default:
		return nil, fmt.Errorf("unknown log format %q (text or json)", o.Format)
	}
	out := o.Output
	if out == nil {
		out = os.Stderr
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:            o.Name,
		Level:           lvl,
		Output:          out,
		JSONFormat:      json,
		IncludeLocation: false,
		TimeFormat:      "2006-01-02T15:04:05.000Z0700",
	}), nil
}

// DebugToggle flips a logger between its base level and debug.
type DebugToggle struct {
	mu     sync.Mutex
	logger hclog.Logger
	base   hclog.Level
	debug  bool
}

// NewDebugToggle remembers logger's current level as the base.
func NewDebugToggle(logger hclog.Logger) *DebugToggle {
	return &DebugToggle{logger: logger, base: logger.GetLevel()}
}

// Toggle switches debug on or off and returns whether debug is now on.
func (d *DebugToggle) Toggle() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.debug = !d.debug
	if d.debug {
		lvl := hclog.Debug
		if d.base < lvl { // already more verbose (trace)
			lvl = d.base
		}
		d.logger.SetLevel(lvl)
		d.logger.Info("SIGUSR1: debug logging on")
	} else {
		d.logger.SetLevel(d.base)
		d.logger.Info("SIGUSR1: debug logging off", "level", d.base.String())
	}
	return d.debug
}

// HandleSIGUSR1 toggles debug logging on every SIGUSR1 until ctx ends.
func (d *DebugToggle) HandleSIGUSR1(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				d.Toggle()
			}
		}
	}()
}
