package accounting

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/pause"
)

// The booking gate of this instance, the binding of the accounting Redis
// to this database, and the watch of the Redis epoch and its lineage that
// closes the gate when Redis is emptied, re-bootstrapped or rolled back.

// IsLeader reports whether this instance currently runs the loops.
func (s *Service) IsLeader() bool { return s.isLeader.Load() }

// Ready reports whether booking may proceed: Redis holds a completed
// bootstrap (acct:epoch). Individual shows may still be unseeded: the
// booking script answers that per show (publisher.ErrShowNotSeeded).
func (s *Service) Ready() bool {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	return s.ready
}

// ReadyErr is nil when Ready, else an error saying why booking is paused
// (for /readyz).
func (s *Service) ReadyErr() error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.ready {
		return nil
	}
	return errors.New(s.reason)
}

// WaitReady blocks until Ready or ctx is done.
func (s *Service) WaitReady(ctx context.Context) error {
	for {
		s.gateMu.Lock()
		ch, ready := s.readyCh, s.ready
		s.gateMu.Unlock()
		if ready {
			return nil
		}
		t := time.NewTimer(100 * time.Millisecond) // the channel is replaced on every close
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

func (s *Service) setGate(ready bool, reason string) {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	s.setGateLocked(ready, reason)
}

func (s *Service) setGateLocked(ready bool, reason string) {
	if ready == s.ready && reason == s.reason {
		return
	}
	if ready && !s.ready {
		close(s.readyCh)
		s.log.Info("booking resumed: Redis accounting is bootstrapped")
		s.m.paused.Set(0)
	}
	if !ready && s.ready {
		s.readyCh = make(chan struct{})
		s.log.Warn("booking paused", "reason", reason)
		s.m.paused.Set(1)
	}
	s.ready, s.reason = ready, reason
}

// watchEpoch keeps the gate in line with acct:epoch on every instance.
func (s *Service) watchEpoch(ctx context.Context) {
	for ctx.Err() == nil {
		s.checkEpoch(ctx)
		_ = pause.For(ctx, s.cfg.EpochPollInterval)
	}
}

func (s *Service) checkEpoch(ctx context.Context) string {
	if err := s.identityGuard(ctx, false); errors.Is(err, publisher.ErrIdentityMismatch) {
		return ""
	}
	// A rollback detected elsewhere (the leader's recompute) while this
	// check reads Redis closes the gate; this check's older reading must
	// not open it again.
	rollbacks := s.rollbackCloses()
	// The epoch known and the high-water mark are read before the state: a
	// booking acknowledged after the read cannot make a live Redis look
	// rolled back, and an epoch adopted after it is not the one found gone.
	known := s.knownEpoch()
	hw, term := s.pub.SeqMark()
	st, err := s.pub.State(ctx)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.setGate(false, "accounting: Redis unreachable: "+err.Error())
		}
		return ""
	case st.Epoch == "":
		if s.epochGone(known) {
			s.setGate(false, "accounting: Redis empty (restarted?), waiting for the bootstrap")
		}
		return ""
	}
	if why, kind, judged := s.checkLineage(st, hw, term); why != "" {
		s.rolledBack(ctx, st, kind, why, judged)
		return ""
	}
	s.openGateUnless(rollbacks)
	return st.Epoch
}

func (s *Service) knownEpoch() string {
	s.lineageMu.Lock()
	defer s.lineageMu.Unlock()
	return s.known
}

// epochGone acts on a poll that found acct:epoch empty while this instance
// knew epoch: it closes the pool's connections once for that epoch. It
// reports false, and does nothing, when this instance adopted another epoch
// since the poll's read (its own bootstrap wrote one meanwhile): that read
// is stale, and recycling or closing the gate on it would hit the new
// epoch's connections and gate. The next poll judges.
func (s *Service) epochGone(epoch string) bool {
	return s.recycleFor(epoch, "acct:epoch is gone (Redis restarted, or another instance found it rolled back)")
}

// recycleFor closes the pool's connections once for epoch, the epoch known
// when the caller judged it lost, and reports true; it does nothing and
// reports false when another epoch has been adopted since (its connections
// are not the lost epoch's).
func (s *Service) recycleFor(epoch, why string) bool {
	s.lineageMu.Lock()
	defer s.lineageMu.Unlock()
	if s.known != epoch {
		return false
	}
	s.recycleLocked(why)
	return true
}

func (s *Service) rollbackCloses() int64 {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	return s.rollbacks
}

// openGateUnless opens the gate unless a rollback closed it since
// rollbackCloses returned seen.
func (s *Service) openGateUnless(seen int64) {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.rollbacks == seen {
		s.setGateLocked(true, "")
	}
}

// checkLineage compares a polled state with the epoch this instance knows
// (see publisher's lineage.go): the same epoch with acct:seq below what was
// seen acknowledged, or an epoch of an older generation, is a rollback; a
// newer epoch (a re-bootstrap) is adopted.
//
// hw and term are the publisher's SeqMark read before st was polled; a
// mark reset since (this instance adopted a new epoch meanwhile, e.g. its
// own bootstrap) belongs to the old epoch and proves nothing: the next
// poll judges.
//
// judged is the epoch known when a rollback was judged: rolledBack acts on
// it, not on one adopted since.
func (s *Service) checkLineage(st publisher.State, hw, term int64) (why, kind, judged string) {
	s.lineageMu.Lock()
	defer s.lineageMu.Unlock()
	judged = s.known
	gen := publisher.EpochGeneration(st.Epoch)
	switch {
	case s.known == "":
		s.known, s.knownGen = st.Epoch, gen
		s.pub.ObserveSeq(st.Seq)
	case st.Epoch == s.known:
		if _, now := s.pub.SeqMark(); now != term {
			return "", "", ""
		}
		if st.Seq < hw {
			return fmt.Sprintf("acct:seq is %d under epoch %s, but %d was already acknowledged: Redis lost acknowledged writes (restarted from an older snapshot, or a failover to a replica that missed them)", st.Seq, st.Epoch, hw), "seq", judged
		}
		// A booking found it first (publisher.ErrSeqWentBack; the
		// publisher refuses bookings since): acct:seq may have climbed
		// back past the mark by now, so this poll could not see it.
		if seq, bhw, ok := s.pub.SeqWentBack(); ok {
			return fmt.Sprintf("a booking under epoch %s was acknowledged with acct:seq %d, but %d was already acknowledged: Redis lost acknowledged writes (restarted from an older snapshot, or a failover to a replica that missed them)", st.Epoch, seq, bhw), "seq", judged
		}
		s.pub.ObserveSeq(st.Seq)
	case gen == 0 || s.knownGen == 0 || gen > s.knownGen:
		// A re-bootstrap this instance did not see happen (or an epoch
		// without a generation, from an older version: trusted as before).
		// Its polls may have missed the empty acct:epoch in between.
		s.log.Info("accounting epoch changed (re-bootstrapped)", "from", s.known, "to", st.Epoch)
		s.recycleLocked("acct:epoch replaced by a re-bootstrap")
		s.known, s.knownGen = st.Epoch, gen
		s.pub.ResetSeqHighWater(st.Seq)
	default:
		return fmt.Sprintf("acct:epoch %s is older than %s, the epoch this instance booked under: Redis came back from a snapshot taken before the last bootstrap", st.Epoch, s.known), "epoch", judged
	}
	return "", "", ""
}

// mark reads a recompute's or seed's mark (publisher.Mark) and judges it as
// the epoch watch judges a poll: a reconcile adopts the procs a rolled-back
// Redis lost and raises acct:seq by as many, so a rollback it ran over
// would look whole to every watch after it. A mark under the known epoch
// with acct:seq below what this instance saw acknowledged, or under an
// older epoch, is a rollback: every show is closed and the recompute
// stops. (A rollback after the mark is refused by the reconcile script
// itself: publisher.ErrSeqRolledBack.)
func (s *Service) mark(ctx context.Context) (publisher.Mark, error) {
	hw, term := s.pub.SeqMark()
	m, err := s.pub.Mark(ctx)
	if err != nil || m.Epoch == "" {
		// No epoch: a bootstrap is seeding; nothing to judge against.
		return m, err
	}
	st := publisher.State{Epoch: m.Epoch, Seq: m.Seq}
	if why, kind, judged := s.checkLineage(st, hw, term); why != "" {
		s.rolledBack(ctx, st, kind, why, judged)
		return publisher.Mark{}, fmt.Errorf("accounting: %s: %w", why, publisher.ErrSeqRolledBack)
	}
	return m, nil
}

// adoptEpoch records the epoch this instance's own bootstrap wrote. When
// the epoch watch adopted it already (it polled between SetEpoch and here),
// nothing is reset: the high-water mark has followed every acknowledged
// booking under that epoch since, and a reset now, from a State read that
// may come late (a slow goroutine on a loaded machine), could lower it to a
// rolled-back acct:seq and hide the rollback for good.
func (s *Service) adoptEpoch(ctx context.Context, epoch string) {
	s.lineageMu.Lock()
	defer s.lineageMu.Unlock()
	if s.known == epoch {
		return
	}
	s.known, s.knownGen = epoch, publisher.EpochGeneration(epoch)
	if st, err := s.pub.State(ctx); err == nil && st.Epoch == epoch {
		s.pub.ResetSeqHighWater(st.Seq)
	}
}

// rolledBack closes the gate and every show (publisher.Invalidate): no
// instance books against the rolled-back counters, and the loop leader
// re-bootstraps from Postgres (it finds acct:epoch gone).
func (s *Service) rolledBack(ctx context.Context, st publisher.State, kind, why, judged string) {
	s.gateMu.Lock()
	s.rollbacks++
	s.setGateLocked(false, "accounting: Redis state rolled back, waiting for the re-bootstrap: "+why)
	s.gateMu.Unlock()
	s.recycleFor(judged, "Redis state rolled back")
	done, shows, err := s.pub.Invalidate(ctx, st.Epoch)
	switch {
	case err != nil:
		s.log.Error("accounting state rolled back; closing it for booking failed (retried at the next poll)", "reason", why, "error", err)
	case done:
		s.m.rollbacks.WithLabelValues(kind).Inc()
		s.log.Error("accounting state rolled back: closed every show for booking and requested a re-bootstrap from Postgres (deleted acct:epoch)",
			"reason", why, "shows_closed", shows)
	default:
		s.log.Info("accounting state rolled back, but it was re-bootstrapped meanwhile", "reason", why)
	}
}

// recycleLocked closes every connection of the pool (one a dispatch
// holds when it is returned, so after that dispatch's transactions ended),
// once per epoch this instance booked under, when that epoch is lost: Redis
// rolled back or emptied, or a re-bootstrap replaced it. A Redis restored
// from an older snapshot holds records of procs released since; each names
// the backend its booking ran on, and a pooled backend lives on, so the
// reconcile could only drop them after the in-flight grace, holding their
// shows' caps meanwhile. Once the backend is gone its transaction has
// provably ended, so the re-bootstrap (or its follow-up reconcile,
// FlipSettle later, for backends that ended after its snapshot or of other
// instances) drops them instead. The only cost is reconnecting the pool.
// lineageMu is held (pool.Reset does not block: idle connections close in
// the background).
func (s *Service) recycleLocked(why string) {
	epoch := s.known
	if epoch == "" || s.recycled == epoch {
		return
	}
	s.recycled = epoch
	s.st.pool.Reset()
	s.m.recycles.Inc()
	s.log.Info("closed this instance's database connections: a booking record naming one of their backends is dropped once that backend is gone, not after the in-flight grace",
		"reason", why, "epoch", epoch)
}

// CheckIdentity returns a *publisher.IdentityMismatchError when the
// accounting Redis is bound to another database than this pool's (nil when
// it is bound to this one or not bound yet). The scheduler refuses to start
// on a mismatch; Run keeps checking it with every gate check.
func (s *Service) CheckIdentity(ctx context.Context) error { return s.identityGuard(ctx, false) }

// identityGuard checks the accounting keyspace's binding against this
// database (bind: binds it first when unbound, as the bootstrap does). A
// mismatch closes the booking gate and stops every loop that writes Redis
// until it is resolved; it is logged once per occurrence.
func (s *Service) identityGuard(ctx context.Context, bind bool) error {
	id := s.identity.Load()
	if id == nil {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := publisher.DatabaseIdentity(qctx, s.st.pool)
		cancel()
		if err != nil {
			return err
		}
		id = &v
		s.identity.Store(id)
	}
	var err error
	if bind {
		err = s.pub.BindIdentity(ctx, *id)
	} else {
		err = s.pub.CheckIdentity(ctx, *id)
	}
	if errors.Is(err, publisher.ErrIdentityMismatch) {
		s.m.foreign.Set(1)
		s.setGate(false, "accounting: "+err.Error())
		if !s.foreign.Swap(true) {
			s.log.Error("REFUSING THE ACCOUNTING REDIS: it accounts for another database; booking stays paused", "error", err)
		}
		return err
	}
	if err == nil && s.foreign.Swap(false) {
		s.m.foreign.Set(0)
		s.log.Info("the accounting Redis is no longer bound to another database", "identity", id.String())
	}
	return err
}
