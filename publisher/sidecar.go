package publisher

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ProcRecord is a per-proc booking record (acct:proc:{proc}) as stored,
// read by ReleaseBatchObserved just before the release undid it.
type ProcRecord struct {
	Show string
	// Keys are the five keys charged: sub, folder, job, layer, point.
	Keys [5]string
	// Centi and GPUs are the stored decimal amounts ("" if absent).
	Centi, GPUs string
}

// recordFields are read from acct:proc:{id} by ReleaseBatchObserved, in
// the order of ProcRecord.
var recordFields = []string{"show", "sub", "folder", "job", "layer", "point", "centi", "gpus"}

// ObservedRelease is what ReleaseBatchObserved did and saw.
type ObservedRelease struct {
	ReleaseResult
	// Records holds, per release (same order), the proc's record as it was
	// right before the script ran; nil for a proc without a record, and nil
	// altogether for a batch applied in several script calls (larger than
	// Options.ReleaseChunk).
	Records []*ProcRecord
}

// ReleaseBatchObserved is ReleaseBatch for the sidecar: one source
// transaction's releases, exactly once, with the checkpoint LSN checked and
// stored in the same script, sent in ONE pipelined round trip on one
// connection:
//
//	GET acct:sidecar:lsn; HMGET acct:proc:{id}...; EVALSHA release(lsn, ids)
//
// checkpoint is called with the stored checkpoint the GET read (ok false:
// none) before the script's reply is looked at, and its error is returned
// as is; as the GET runs on the same connection right before the script, a
// Redis restart hidden by the client's transparent retry (the whole
// pipeline is re-sent to the new server) is still seen. A NOSCRIPT reply
// (a restarted or failed-over Redis has an empty script cache; the GET and
// HMGETs changed nothing) loads the script and sends the pipeline once
// more, calling checkpoint again.
//
// A batch larger than Options.ReleaseChunk reads the checkpoint alone,
// calls checkpoint, and is then applied by ReleaseBatch (no records).
// lsn must be > 0; an empty batch only advances the checkpoint. The
// pipelined path records none of the publisher's release metrics: the
// caller counts what Result reports.
func (p *Publisher) ReleaseBatchObserved(ctx context.Context, lsn uint64, rels []Release, checkpoint func(stored uint64, ok bool) error) (ObservedRelease, error) {
	if lsn == 0 {
		return ObservedRelease{}, errors.New("accounting release batch: LSN must be > 0")
	}
	if len(rels) > p.chunk {
		stored, ok, err := p.readCheckpoint(p.rdb.Get(ctx, LSNKey))
		if err != nil {
			return ObservedRelease{}, err
		}
		if err := checkpoint(stored, ok); err != nil {
			return ObservedRelease{}, err
		}
		res, err := p.ReleaseBatch(ctx, lsn, rels)
		return ObservedRelease{ReleaseResult: res}, err
	}
	args := make([]any, 0, 3+len(rels))
	args = append(args, "release", FormatLSN(lsn), p.tombTTL.Milliseconds())
	for _, r := range rels {
		args = append(args, r.ProcID)
	}
	for attempt := 0; ; attempt++ {
		pipe := p.rdb.Pipeline()
		cp := pipe.Get(ctx, LSNKey)
		recs := make([]*redis.SliceCmd, len(rels))
		for i, r := range rels {
			recs[i] = pipe.HMGet(ctx, ProcKey(r.ProcID), recordFields...)
		}
		ev := p.release.EvalSha(ctx, pipe, []string{SeqKey, LSNKey}, args...)
		_, _ = pipe.Exec(ctx) // errors are per command, checked below
		stored, ok, err := p.readCheckpoint(cp)
		if err != nil {
			return ObservedRelease{}, err
		}
		if err := checkpoint(stored, ok); err != nil {
			return ObservedRelease{}, err
		}
		if err := ev.Err(); err != nil {
			if attempt == 0 && isNoScript(err) {
				if err := p.release.Load(ctx, p.rdb).Err(); err != nil {
					return ObservedRelease{}, err
				}
				continue
			}
			return ObservedRelease{}, err
		}
		res, err := parseReleaseReply(ev, lsn)
		if err != nil {
			return ObservedRelease{}, err
		}
		out := ObservedRelease{ReleaseResult: res, Records: make([]*ProcRecord, len(rels))}
		for i, cmd := range recs {
			if v := cmd.Val(); len(v) == len(recordFields) && v[0] != nil {
				out.Records[i] = recordOf(v)
			}
		}
		return out, nil
	}
}

// readCheckpoint reads a GET of LSNKey: ok is false when there is none;
// a transport error is returned unwrapped (the caller retries it).
func (p *Publisher) readCheckpoint(cmd *redis.StringCmd) (uint64, bool, error) {
	v, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	stored, err := ParseLSN(v)
	if err != nil {
		return 0, false, fmt.Errorf("%s holds %q: %w", LSNKey, v, err)
	}
	return stored, true, nil
}

func recordOf(v []any) *ProcRecord {
	s := func(i int) string { x, _ := v[i].(string); return x }
	return &ProcRecord{Show: s(0), Keys: [5]string{s(1), s(2), s(3), s(4), s(5)}, Centi: s(6), GPUs: s(7)}
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// parseReleaseReply reads release.lua's reply: {1, released, already,
// unknown} (applied at lsn) or {0, stored_lsn}.
func parseReleaseReply(ev *redis.Cmd, lsn uint64) (ReleaseResult, error) {
	v, err := ev.Slice()
	if err != nil {
		return ReleaseResult{}, err
	}
	num := func(i int) (int64, bool) {
		if i >= len(v) {
			return 0, false
		}
		n, ok := v[i].(int64)
		return n, ok
	}
	code, ok := num(0)
	if !ok {
		return ReleaseResult{}, fmt.Errorf("release script: unexpected reply %v", v)
	}
	if code == 0 {
		s, _ := v[1].(string)
		stored, err := ParseLSN(s)
		if err != nil {
			return ReleaseResult{}, fmt.Errorf("release script: stored LSN %q: %w", s, err)
		}
		return ReleaseResult{Applied: false, StoredLSN: stored}, nil
	}
	r, ok1 := num(1)
	d, ok2 := num(2)
	u, ok3 := num(3)
	if !ok1 || !ok2 || !ok3 {
		return ReleaseResult{}, fmt.Errorf("release script: unexpected reply %v", v)
	}
	return ReleaseResult{Applied: true, StoredLSN: lsn, Released: int(r), AlreadyReleased: int(d), NeverBooked: int(u)}, nil
}

// SaveSidecarState writes the sidecar's managed-show set
// (SidecarShowsKey) unless the stored one is valid at the same or a later
// position; force overwrites it (a new slot, possibly on another
// timeline). state must begin with the FormatLSN of the position it is
// valid at. written reports whether it was stored.
func (p *Publisher) SaveSidecarState(ctx context.Context, state string, force bool) (written bool, err error) {
	if len(state) < 16 {
		return false, fmt.Errorf("accounting save %s: state %.40q does not begin with an LSN", SidecarShowsKey, state)
	}
	if _, err := ParseLSN(state[:16]); err != nil {
		return false, fmt.Errorf("accounting save %s: %w", SidecarShowsKey, err)
	}
	mode := ""
	if force {
		mode = "force"
	}
	n, err := p.sidecarState.Run(ctx, p.rdb, []string{SidecarShowsKey}, state, mode).Int64()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}
