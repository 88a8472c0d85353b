package publisher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cuesched/cuesched/shared/config"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/shared/redact"
)

// ClientConfig selects the accounting Redis: a single node by URL, or a
// Sentinel-managed primary (MasterName + SentinelAddrs). One config, one
// redis.UniversalClient either way.
type ClientConfig struct {
	// URL is redis://[user:pass@]host:port/db. With Sentinel it may still
	// carry the DB number and credentials of the primary.
	URL string
	// MasterName and SentinelAddrs select Sentinel.
	MasterName    string
	SentinelAddrs []string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels.
	SentinelUsername, SentinelPassword string
	// TLS, when set, is used for the primary and the Sentinels (a rediss://
	// URL brings its own otherwise).
	TLS *tls.Config
	// PoolSize bounds connections (0 = go-redis default, 10 per CPU).
	PoolSize int
}

// ClientConfigFrom is the client configuration of a daemon's accounting
// section: URL or Sentinel, Sentinel credentials, TLS (its files are read
// now; an error names the key).
func ClientConfigFrom(a config.Accounting) (ClientConfig, error) {
	t, err := a.RedisTLS.Client("accounting.redis_tls")
	if err != nil {
		return ClientConfig{}, err
	}
	return ClientConfig{URL: a.RedisURL, MasterName: a.SentinelMaster, SentinelAddrs: a.SentinelAddrs,
		SentinelUsername: a.SentinelUsername, SentinelPassword: a.SentinelPassword, TLS: t, PoolSize: a.RedisPoolSize}, nil
}

// NewClient returns a universal client: a *redis.Client for a single node,
// a failover client (always talking to the current primary) for Sentinel.
// Redis Cluster is deliberately not supported (see package lua, Topology).
func NewClient(cfg ClientConfig) (redis.UniversalClient, error) {
	opts := &redis.UniversalOptions{PoolSize: cfg.PoolSize}
	if cfg.URL != "" {
		u, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("redis url %s: %w", redact.URL(cfg.URL), redact.Error(err, cfg.URL))
		}
		opts.Addrs = []string{u.Addr}
		opts.DB, opts.Username, opts.Password, opts.TLSConfig = u.DB, u.Username, u.Password, u.TLSConfig
		if cfg.PoolSize == 0 {
			opts.PoolSize = u.PoolSize
		}
	}
	if cfg.MasterName != "" {
		if len(cfg.SentinelAddrs) == 0 {
			return nil, errors.New("redis sentinel: master name given without sentinel addresses")
		}
		opts.MasterName = cfg.MasterName
		opts.Addrs = cfg.SentinelAddrs
		opts.SentinelUsername, opts.SentinelPassword = cfg.SentinelUsername, cfg.SentinelPassword
	} else if len(cfg.SentinelAddrs) > 0 {
		return nil, errors.New("redis sentinel: sentinel addresses given without a master name")
	}
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS
	}
	if len(opts.Addrs) == 0 {
		return nil, errors.New("redis: no URL and no sentinel configured")
	}
	if len(opts.Addrs) > 1 && opts.MasterName == "" {
		return nil, errors.New("redis: several addresses without a sentinel master name would mean Redis Cluster, which the accounting scripts do not support")
	}
	return redis.NewUniversalClient(opts), nil
}

// IsAuthError reports whether err is Redis refusing the credentials
// (WRONGPASS, NOAUTH, or AUTH sent to a server without a password). Such an
// error never heals by retrying.
func IsAuthError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") ||
		(strings.Contains(msg, "AUTH") && strings.Contains(msg, "without any password configured"))
}

// CheckAuth pings Redis once at start-up. Refused credentials are returned
// as an error (a daemon exits on it: retrying a wrong password only logs
// forever); any other failure (unreachable, loading) returns nil and is
// left to the daemon's retries. The error never contains the URL.
func CheckAuth(ctx context.Context, rdb redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); IsAuthError(err) {
		return fmt.Errorf("redis refused the credentials (%v): fix the password or user in accounting.redis_url "+
			"(CUESCHED_ACCOUNTING_REDIS_URL, or --redis-url)", err)
	}
	return nil
}
