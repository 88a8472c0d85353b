package scheduler

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/reservations"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/config"
)

// servingHosts hands the reservation loop the host source once it exists
// (the host cache is built after the dispatcher, which needs the loop).
type servingHosts struct {
	h atomic.Pointer[reservations.Hosts]
}

func (s *servingHosts) set(h reservations.Hosts) { s.h.Store(&h) }

// EachServing implements reservations.Hosts (nothing before set).
func (s *servingHosts) EachServing(facilityID, showID string, tags []string, os string, threadable bool, fn func(hostcache.Host)) {
	if h := s.h.Load(); h != nil {
		(*h).EachServing(facilityID, showID, tags, os, threadable, fn)
	}
}

// newReservations builds the instance's reservation manager from
// queue.reservations (see scheduler/reservations).
func newReservations(cfg config.Config, pool *pgxpool.Pool, rdb redis.UniversalClient, hosts reservations.Hosts,
	policy sizing.Policy, log hclog.Logger, reg prometheus.Registerer) *reservations.Manager {
	r := cfg.Queue.Reservations
	instance := cfg.Scheduler.InstanceName
	if instance == "" {
		host, _ := os.Hostname()
		instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return reservations.New(pool, rdb, hosts, reservations.Config{
		Enabled: r.Enabled, BlockedFor: r.BlockedFor.D(), MaxGrants: r.MaxGrants, MaxFraction: r.MaxFraction,
		Timeout: r.Timeout.D(), Interval: r.RefreshInterval.D(), Policy: policy, Seed: cfg.Queue.LotterySeed,
	}, reservations.Options{Logger: log, Registerer: reg, Instance: instance})
}
