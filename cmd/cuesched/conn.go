package main

import (
	"context"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/rollout"
	"github.com/cuesched/cuesched/shared/config"
)

// Connection settings. Every command that connects reads each setting the
// same way: its flag, else its environment variable, else its key in the
// --config FILE (the daemons' file, loaded with its defaults and the same
// environment overrides). The environment variable is the config key's
// override, CUESCHED_<SECTION>_<KEY> (config.EnvName), so the daemons and
// the tools share one name per setting.

// The config keys of the connection settings.
const (
	keyDatabaseURL    = "database.url"
	keyRedisURL       = "accounting.redis_url"
	keySentinelMaster = "accounting.sentinel_master"
	keySentinelAddrs  = "accounting.sentinel_addrs"
)

// connSetting is one connection setting.
type connSetting struct {
	key   string // config key, e.g. database.url
	flag  string // flag name, e.g. database-url
	help  string // flag help; its `backquoted` word names the value
	redis bool   // an accounting Redis setting
}

// env is the setting's environment variable.
func (s connSetting) env() string { return config.EnvName(s.key) }

// connSettings is the one table of connection settings: the flags, their
// help and the environment lookups are all made from it.
func connSettings() []connSetting {
	return []connSetting{
		{keyDatabaseURL, "database-url", "Cuebot PostgreSQL `URL`", false},
		{keyRedisURL, "redis-url", "accounting Redis `URL`, redis://[user:pass@]host:port/db", true},
		{keySentinelMaster, "sentinel-master", "Sentinel master `NAME` (Redis is found through the Sentinels instead of the host in the Redis URL)", true},
		{keySentinelAddrs, "sentinel-addrs", "comma-separated Sentinel `host:port` list", true},
	}
}

// connFlags are the connection flags of one command.
type connFlags struct {
	config   *string
	settings []connSetting
	values   map[string]*string // by config key
}

// addConnFlags adds --config and the connection flags: Postgres only, or
// Postgres and the accounting Redis.
func addConnFlags(fs *flagSet, withRedis bool) *connFlags {
	f := &connFlags{values: map[string]*string{}}
	f.config = fs.String("config", "", "configuration `FILE` (YAML, the daemons' file); each setting below is\nread from it when neither its flag nor its environment variable is set")
	for _, s := range connSettings() {
		if s.redis && !withRedis {
			continue
		}
		f.settings = append(f.settings, s)
		f.values[s.key] = fs.String(s.flag, "", fmt.Sprintf("%s\n(else $%s, else %s in --config)", s.help, s.env(), s.key))
	}
	return f
}

// connValues are the resolved settings and where each came from.
type connValues struct {
	dbURL, redisURL, master string
	sentinels               []string
	source                  map[string]string // by config key: "--database-url", "$CUESCHED_DATABASE_URL", "database.url in FILE"
}

// resolve reads every setting of the command (flags, then the environment,
// then --config FILE) and checks that Postgres, and Redis when needRedis,
// are given. code is non-zero when it failed (the error is printed).
func (f *connFlags) resolve(c *cli, name string, needRedis bool) (v connValues, code int) {
	got := map[string]string{}
	v.source = map[string]string{}
	for _, s := range f.settings {
		if val := strings.TrimSpace(*f.values[s.key]); val != "" {
			got[s.key], v.source[s.key] = val, "--"+s.flag
		} else if val := strings.TrimSpace(c.getenv(s.env())); val != "" {
			got[s.key], v.source[s.key] = val, "$"+s.env()
		}
	}
	if path := strings.TrimSpace(*f.config); path != "" {
		cfg, err := config.Load(path, c.getenv)
		if err != nil {
			fmt.Fprintf(c.stderr, "%s: --config: %v\n", name, err)
			return v, 1
		}
		for _, s := range f.settings {
			if got[s.key] != "" {
				continue
			}
			if val := configValue(cfg, s.key); val != "" {
				got[s.key], v.source[s.key] = val, s.key+" in "+path
			}
		}
	}
	v.dbURL, v.redisURL, v.master = got[keyDatabaseURL], got[keyRedisURL], got[keySentinelMaster]
	for _, a := range strings.Split(got[keySentinelAddrs], ",") {
		if a = strings.TrimSpace(a); a != "" {
			v.sentinels = append(v.sentinels, a)
		}
	}
	if v.dbURL == "" {
		fmt.Fprintf(c.stderr, "%s: no database: pass --database-url URL, set %s, or pass --config FILE (%s)\n",
			name, config.EnvName(keyDatabaseURL), keyDatabaseURL)
		return v, 2
	}
	if needRedis && v.redisURL == "" && v.master == "" {
		fmt.Fprintf(c.stderr, "%s: no Redis: pass --redis-url URL (or --sentinel-master and --sentinel-addrs), set %s, or pass --config FILE (%s)\n",
			name, config.EnvName(keyRedisURL), keyRedisURL)
		return v, 2
	}
	return v, 0
}

// configValue is a connection setting's value in a loaded configuration.
func configValue(cfg config.Config, key string) string {
	switch key {
	case keyDatabaseURL:
		return cfg.Database.URL
	case keyRedisURL:
		return cfg.Accounting.RedisURL
	case keySentinelMaster:
		return cfg.Accounting.SentinelMaster
	case keySentinelAddrs:
		return strings.Join(cfg.Accounting.SentinelAddrs, ",")
	}
	return ""
}

// redisSource names where the Redis address came from, for errors.
func (v connValues) redisSource() string {
	if v.master != "" {
		return v.source[keySentinelMaster]
	}
	return v.source[keyRedisURL]
}

// conns are a tool's connections: Postgres always, Redis when given.
type conns struct {
	pool  *pgxpool.Pool
	pub   *publisher.Publisher // nil without Redis
	close func()
}

// openConns connects to Postgres (and pings it) and to Redis when v names
// one. code is non-zero on failure (the error is printed).
func openConns(ctx context.Context, c *cli, name string, v connValues, maxConns int32) (*conns, int) {
	pcfg, err := pgxpool.ParseConfig(v.dbURL)
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: database URL (%s): %v\n", name, v.source[keyDatabaseURL], err)
		return nil, 2
	}
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = appname.Format(appname.RoleCLI, "")
	}
	pcfg.MaxConns = maxConns
	var closers []func()
	cn := &conns{close: func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}}
	if v.redisURL != "" || v.master != "" {
		rdb, err := publisher.NewClient(publisher.ClientConfig{URL: v.redisURL, MasterName: v.master, SentinelAddrs: v.sentinels, PoolSize: 4})
		if err != nil {
			fmt.Fprintf(c.stderr, "%s: Redis (%s): %v\n", name, v.redisSource(), err)
			return nil, 2
		}
		closers = append(closers, func() { _ = rdb.Close() })
		if cn.pub, err = publisher.New(rdb, publisher.Options{Logger: c.logger}); err != nil {
			cn.close()
			fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
			return nil, 1
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		cn.close()
		fmt.Fprintf(c.stderr, "%s: database (%s): %v\n", name, v.source[keyDatabaseURL], err)
		return nil, 1
	}
	closers = append(closers, pool.Close)
	cn.pool = pool
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = pool.Ping(pctx)
	cancel()
	if err != nil {
		cn.close()
		fmt.Fprintf(c.stderr, "%s: connect to the database (%s): %v\n", name, v.source[keyDatabaseURL], err)
		return nil, 1
	}
	return cn, 0
}

// openTool opens the connections and the rollout tool on them.
func openTool(ctx context.Context, c *cli, name string, v connValues) (tool *rollout.Tool, cleanup func(), code int) {
	cn, code := openConns(ctx, c, name, v, 4)
	if code != 0 {
		return nil, nil, code
	}
	tool, err := rollout.New(cn.pool, rollout.Options{Publisher: cn.pub, Logger: c.logger})
	if err != nil {
		cn.close()
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return nil, nil, 1
	}
	return tool, cn.close, 0
}
