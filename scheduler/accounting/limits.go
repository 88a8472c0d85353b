package accounting

// The limit reseed: limit_record caps and running counts copied to Redis.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/publisher"
)

// ReseedShowLimits copies the caps of the given shows (those managed; the
// others are skipped) from Postgres to Redis now: the limit reseed for a
// few shows, and on any instance. The cluster feed calls it when the WAL
// reports a subscription, folder or job cap change, before it wakes the
// show's clusters, so their next pass books against the new caps whether
// or not the sidecar has forwarded them yet. The writes are ordered by WAL
// position (publisher.Limits.LSN) like every cap write, so it never
// reverts a newer cap; while Redis is not bootstrapped it does nothing
// (the bootstrap seeds every cap).
func (s *Service) ReseedShowLimits(ctx context.Context, shows []string) error {
	start := time.Now()
	err := func() error {
		if err := s.identityGuard(ctx, false); errors.Is(err, publisher.ErrIdentityMismatch) {
			return err
		}
		epoch, err := s.pub.Epoch(ctx)
		if err != nil {
			return err
		}
		if epoch == "" {
			return errSkipped
		}
		managed, err := s.st.managedShows(ctx)
		if err != nil {
			return err
		}
		want := make(map[string]bool, len(shows))
		for _, sh := range shows {
			want[sh] = true
		}
		var list []string
		for _, sh := range managed {
			if want[sh] {
				list = append(list, sh)
			}
		}
		if len(list) == 0 {
			return errSkipped
		}
		sn, err := s.st.load(ctx, list, false)
		if err != nil {
			return err
		}
		all := publisher.Limits{LSN: sn.lsn}
		for _, sh := range list {
			l := sn.limits[sh]
			all.Subs, all.Folders = append(all.Subs, l.Subs...), append(all.Folders, l.Folders...)
			all.Jobs, all.Points = append(all.Jobs, l.Jobs...), append(all.Points, l.Points...)
		}
		_, err = s.pub.WriteLimits(ctx, all, s.cfg.BatchSize)
		return err
	}()
	s.m.reseedDuration.WithLabelValues("show_limit").Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, errSkipped):
		s.m.reseedCycles.WithLabelValues("show_limit", "skipped").Inc()
		return nil
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		s.m.reseedCycles.WithLabelValues("show_limit", "error").Inc()
		return fmt.Errorf("limit reseed of %d show(s): %w", len(shows), err)
	}
	s.m.reseedCycles.WithLabelValues("show_limit", "ok").Inc()
	return nil
}

func (s *Service) limitCycle(ctx context.Context, fence func(context.Context) error) {
	if err := s.reseedLimits(ctx, fence); err != nil && ctx.Err() == nil {
		s.log.Warn("limit reseed failed", "error", err)
	}
}

// reseedLimits copies the caps of every managed show from Postgres to Redis
// (plain HSETs of limit fields only: no booked counter is touched, so it
// needs no compare-and-swap and cannot starve).
func (s *Service) reseedLimits(ctx context.Context, fence func(context.Context) error) error {
	start := time.Now()
	err := func() error {
		if err := s.identityGuard(ctx, false); errors.Is(err, publisher.ErrIdentityMismatch) {
			return err
		}
		managed, err := s.st.managedShows(ctx)
		if err != nil {
			return err
		}
		if len(managed) == 0 {
			return errSkipped
		}
		sn, err := s.st.load(ctx, managed, false)
		if err != nil {
			return err
		}
		for _, sh := range managed {
			if err := fence(ctx); err != nil {
				return err
			}
			lim := *sn.limits[sh]
			lim.LSN = sn.lsn
			skipped, err := s.pub.WriteLimits(ctx, lim, s.cfg.BatchSize)
			if err != nil {
				return err
			}
			if skipped > 0 {
				s.log.Debug("limit reseed: caps newer than the snapshot left alone (written by the sidecar since)",
					"show", sh, "hashes", skipped)
			}
		}
		return nil
	}()
	s.m.reseedDuration.WithLabelValues("limit").Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, errSkipped):
		s.m.reseedCycles.WithLabelValues("limit", "skipped").Inc()
		return nil
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		s.m.reseedCycles.WithLabelValues("limit", "error").Inc()
		return fmt.Errorf("limit reseed: %w", err)
	}
	s.m.reseedCycles.WithLabelValues("limit", "ok").Inc()
	return nil
}
