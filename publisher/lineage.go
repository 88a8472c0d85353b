package publisher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/lua"
)

// Lineage: how a scheduler notices, by itself, that the accounting state it
// books against is not the one it was working with.
//
// Redis can come back with less than it acknowledged: restarted from an
// older RDB snapshot or AOF, or promoted from a replica that had not
// received the last writes (Sentinel failover). The seeding markers and
// acct:epoch come back too, so the booking gate alone would trust it. Two
// facts give it away:
//
//   - acct:seq only grows within one epoch (every booking, release and
//     reconcile INCRs it). The publisher keeps the highest value it has
//     seen (its own bookings' replies and every State poll) as a high
//     water mark; a State read that returns less, under the same epoch, is
//     a rollback of writes this instance saw acknowledged.
//     A booking's own reply is judged the same way, against the mark read
//     before it was sent (checkSeq): the first booking on a rolled-back
//     Redis finds the loss, is refused, and fences every later booking of
//     this publisher until a new epoch, so none runs on the undercounting
//     counters in the window before a poll (SeqWentBack hands the finding
//     to the poll, which acts on it even if acct:seq climbed back since).
//   - every bootstrap's epoch carries a generation, the Redis server's
//     clock at the bootstrap (NewEpoch: "g<unix µs>-<uuid>"). A re-bootstrap
//     makes a newer one; a snapshot from before the last bootstrap brings
//     back an older one.
//
// Invalidate then closes every show at once (the booking script answers
// "not seeded" on every instance) and removes acct:epoch so the loop
// leader re-bootstraps from Postgres.

// State is what a scheduler polls of the accounting store.
type State struct {
	// Epoch is acct:epoch ("" while not bootstrapped).
	Epoch string
	// Seq is acct:seq (0 when absent).
	Seq int64
}

// State reads acct:epoch and acct:seq in one round trip (one MGET: both
// from the same instant).
func (p *Publisher) State(ctx context.Context) (State, error) {
	v, err := p.rdb.MGet(ctx, EpochKey, SeqKey).Result()
	if err != nil {
		return State{}, fmt.Errorf("accounting state: %w", err)
	}
	var st State
	if s, ok := v[0].(string); ok {
		st.Epoch = s
	}
	if s, ok := v[1].(string); ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return State{}, fmt.Errorf("accounting state: %s is not an integer: %q", SeqKey, s)
		}
		st.Seq = n
	}
	return st, nil
}

// ErrSeqWentBack is returned for a booking acknowledged with an acct:seq
// at or below one this publisher saw acknowledged before the booking was
// sent, under the same epoch: Redis lost acknowledged writes (restarted
// from an older snapshot, a failover to a replica that missed them), and
// its counters undercount what runs. The booking's outcome is to be undone
// (Rollback), and every later booking is refused without reaching Redis
// until a new epoch is adopted (ResetSeqHighWater): between a rollback and
// the poll that acts on it (SeqWentBack), a booking against the stale
// counters could pass a cap the lost writes had reached.
var ErrSeqWentBack = errors.New("acct:seq went back: Redis lost acknowledged writes; booking stops until the accounting is re-bootstrapped")

// seqFault is the evidence of a booking acknowledged with a seq that went
// back, within one term of the high-water mark.
type seqFault struct{ term, seq, hw int64 }

// SeqWentBack reports a booking of the current term acknowledged with
// acct:seq seq, at or below hw acknowledged before it was sent: proof that
// Redis rolled back, for the accounting's lineage check to act on.
func (p *Publisher) SeqWentBack() (seq, hw int64, ok bool) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	if f := p.seqFault; f != nil && f.term == p.seqTerm {
		return f.seq, f.hw, true
	}
	return 0, 0, false
}

// checkSeq judges a booking's acknowledged seq against hw and term, read
// before it was sent: every booking INCRs acct:seq, so one sent after hw
// was seen acknowledged gets more, unless Redis went back. It records the
// evidence and returns ErrSeqWentBack (observeSeqIn raises the mark for a
// seq that passes).
func (p *Publisher) checkSeq(seq, hw, term int64) error {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	if p.seqTerm != term || seq > hw {
		return nil // passes, or a new epoch since: the old mark proves nothing
	}
	if p.seqFault == nil || p.seqFault.term != term {
		p.seqFault = &seqFault{term: term, seq: seq, hw: hw}
	}
	return ErrSeqWentBack
}

// fenced is ErrSeqWentBack while a rollback found by a booking of the
// current term stands.
func (p *Publisher) fenced() error {
	if _, _, ok := p.SeqWentBack(); ok {
		return ErrSeqWentBack
	}
	return nil
}

// SeqHighWater is the highest acct:seq this publisher has seen acknowledged
// (bookings' replies and ObserveSeq). Read it before a State poll: a seq
// the poll returns below it is a rollback.
func (p *Publisher) SeqHighWater() int64 {
	hw, _ := p.SeqMark()
	return hw
}

// SeqMark is the high-water mark and its term: the number of resets
// (ResetSeqHighWater, a new epoch adopted) so far. A caller that reads the
// mark before a State poll and compares later must check the term is
// unchanged: a mark read under the previous epoch says nothing of the new
// one's acct:seq.
func (p *Publisher) SeqMark() (hw, term int64) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	return p.seqHigh, p.seqTerm
}

// ObserveSeq raises the high-water mark to seq.
func (p *Publisher) ObserveSeq(seq int64) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	p.seqHigh = max(p.seqHigh, seq)
}

// observeSeqIn raises the mark to seq only if it was not reset since term
// was read (a booking whose reply straddles an epoch change proves nothing
// about the new epoch).
func (p *Publisher) observeSeqIn(seq, term int64) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	if p.seqTerm == term {
		p.seqHigh = max(p.seqHigh, seq)
	}
}

// ResetSeqHighWater sets the high-water mark to seq (a new epoch: the
// sequence of the old one means nothing there) and starts a new term.
func (p *Publisher) ResetSeqHighWater(seq int64) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	p.seqHigh = seq
	p.seqTerm++
}

// NewEpoch makes a bootstrap epoch whose generation is the Redis server's
// clock now, so a later bootstrap's epoch is always newer (EpochGeneration).
func (p *Publisher) NewEpoch(ctx context.Context) (string, error) {
	t, err := p.rdb.Time(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("accounting new epoch: TIME: %w", err)
	}
	return fmt.Sprintf("g%d-%s", t.UnixMicro(), uuid.NewString()), nil
}

// EpochGeneration is the generation of an epoch made by NewEpoch (Redis
// clock at the bootstrap, µs), 0 for an epoch without one (written by an
// older version).
func EpochGeneration(epoch string) int64 {
	rest, ok := strings.CutPrefix(epoch, "g")
	if !ok {
		return 0
	}
	num, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// Invalidate closes every show for booking and removes acct:epoch, if
// acct:epoch is still epoch ("" = whatever it is): the booking script
// answers "not seeded" everywhere until the loop leader re-bootstraps.
// done is false when acct:epoch had changed (someone re-bootstrapped
// meanwhile); shows is how many markers were removed.
func (p *Publisher) Invalidate(ctx context.Context, epoch string) (done bool, shows int, err error) {
	v, err := p.invalidate.Run(ctx, p.rdb, []string{EpochKey, ShowsKey}, epoch).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, 0, fmt.Errorf("accounting invalidate: %w", err)
	}
	code, _ := intAt(v, 0)
	if code != 1 {
		return false, 0, nil
	}
	n, _ := intAt(v, 1)
	return true, int(n), nil
}

func newInvalidateScript() *redis.Script { return redis.NewScript(lua.Invalidate()) }
