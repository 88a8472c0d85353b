package publisher

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// IdentityKey binds the accounting keyspace to one Cuebot database: it
// holds the Identity of the database whose procs the counters account for.
const IdentityKey = "acct:identity"

// ErrIdentityMismatch: the accounting Redis is bound to another database.
var ErrIdentityMismatch = errors.New("accounting Redis belongs to another database")

// Identity names a Cuebot database: the cluster's system identifier
// (pg_control_system(), fixed when the cluster was initialised) and the
// database name. A dump restored elsewhere, or a second database on the
// same server, has another identity; a physical copy of the cluster
// (pg_basebackup, a volume snapshot) keeps the system identifier, so it
// differs only if its database name does.
type Identity struct {
	SystemIdentifier string
	Database         string
}

// String is the identity as stored in IdentityKey and shown in errors.
func (id Identity) String() string {
	return "system_identifier=" + id.SystemIdentifier + " database=" + id.Database
}

// Querier is what DatabaseIdentity reads from: a pool, a connection or a
// transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DatabaseIdentity reads the identity of the database q is connected to.
func DatabaseIdentity(ctx context.Context, q Querier) (Identity, error) {
	var id Identity
	err := q.QueryRow(ctx, `SELECT system_identifier::text, current_database() FROM pg_control_system()`).
		Scan(&id.SystemIdentifier, &id.Database)
	if err != nil {
		return Identity{}, fmt.Errorf("read the database identity (pg_control_system): %w", err)
	}
	return id, nil
}

// IdentityMismatchError names both identities. It matches
// ErrIdentityMismatch with errors.Is.
type IdentityMismatchError struct {
	Redis    string // the identity Redis is bound to
	Database Identity
}

func (e *IdentityMismatchError) Error() string {
	return fmt.Sprintf("%v: Redis (%s) is bound to %s, this database is %s; "+
		"a staging or second database needs its own Redis (or another Redis db number in accounting.redis_url); "+
		"if this Redis db really is to be reused, empty it first (FLUSHDB) so the next bootstrap binds it anew",
		ErrIdentityMismatch, IdentityKey, e.Redis, e.Database)
}

func (e *IdentityMismatchError) Unwrap() error { return ErrIdentityMismatch }

// BindIdentity binds the keyspace to id when it is not bound yet, and
// returns an *IdentityMismatchError when it is bound to another database.
// The scheduler's bootstrap and the sidecar's sessions bind; the tools
// only check (CheckIdentity).
func (p *Publisher) BindIdentity(ctx context.Context, id Identity) error {
	if _, err := p.rdb.SetNX(ctx, IdentityKey, id.String(), 0).Result(); err != nil {
		return fmt.Errorf("accounting bind identity: %w", err)
	}
	return p.CheckIdentity(ctx, id)
}

// CheckIdentity returns an *IdentityMismatchError when the keyspace is
// bound to another database; nil when it is bound to id or not bound.
func (p *Publisher) CheckIdentity(ctx context.Context, id Identity) error {
	got, err := p.BoundIdentity(ctx)
	if err != nil {
		return err
	}
	if got != "" && got != id.String() {
		return &IdentityMismatchError{Redis: got, Database: id}
	}
	return nil
}

// BoundIdentity is the identity the keyspace is bound to, "" if none.
func (p *Publisher) BoundIdentity(ctx context.Context) (string, error) {
	got, err := p.rdb.Get(ctx, IdentityKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("accounting identity: %w", err)
	}
	return got, nil
}
