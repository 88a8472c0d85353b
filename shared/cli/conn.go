package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cuesched/cuesched/shared/appname"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/redact"
)

// Connection settings. Every command that connects reads each setting the
// same way: its flag, else its environment variable, else its key in the
// --config FILE (the daemons' file, loaded with its defaults and the same
// environment overrides). The environment variable is the config key's
// override, CUESCHED_<SECTION>_<KEY> (config.EnvName), so the daemons and
// the tools share one name per setting.

// The config keys of the connection settings.
const (
	KeyDatabaseURL    = "database.url"
	KeyRedisURL       = "accounting.redis_url"
	KeySentinelMaster = "accounting.sentinel_master"
	KeySentinelAddrs  = "accounting.sentinel_addrs"
)

// ConnSetting is one connection setting.
type ConnSetting struct {
	Key   string // config key, e.g. database.url
	Flag  string // flag name, e.g. database-url
	Help  string // flag help; its `backquoted` word names the value
	Redis bool   // an accounting Redis setting
}

// Env is the setting's environment variable.
func (s ConnSetting) Env() string { return config.EnvName(s.Key) }

// ConnSettings is the one table of connection settings: the flags, their
// help and the environment lookups are all made from it.
func ConnSettings() []ConnSetting {
	return []ConnSetting{
		{KeyDatabaseURL, "database-url", "Cuebot PostgreSQL `URL`", false},
		{KeyRedisURL, "redis-url", "accounting Redis `URL`, redis://[user:pass@]host:port/db", true},
		{KeySentinelMaster, "sentinel-master", "Sentinel master `NAME` (Redis is found through the Sentinels instead of the host in the Redis URL)", true},
		{KeySentinelAddrs, "sentinel-addrs", "comma-separated Sentinel `host:port` list", true},
	}
}

// ConnFlags are the connection flags of one command.
type ConnFlags struct {
	Config   *string
	settings []ConnSetting
	values   map[string]*string // by config key
}

// AddConnFlags adds --config and the connection flags: Postgres only, or
// Postgres and the accounting Redis.
func AddConnFlags(fs *FlagSet, withRedis bool) *ConnFlags {
	f := &ConnFlags{values: map[string]*string{}}
	f.Config = fs.String("config", "", "configuration `FILE` (YAML, the daemons' file); each setting below is\nread from it when neither its flag nor its environment variable is set")
	for _, s := range ConnSettings() {
		if s.Redis && !withRedis {
			continue
		}
		f.settings = append(f.settings, s)
		f.values[s.Key] = fs.String(s.Flag, "", fmt.Sprintf("%s\n(else $%s, else %s in --config)", s.Help, s.Env(), s.Key))
	}
	return f
}

// ConnValues are the resolved settings and where each came from.
type ConnValues struct {
	DBURL, RedisURL, Master string
	Sentinels               []string
	Source                  map[string]string // by config key: "--database-url", "$CUESCHED_DATABASE_URL", "database.url in FILE"
	// Accounting is the --config FILE's accounting section (nil without
	// one): its Sentinel credentials and Redis TLS settings are used too.
	Accounting *config.Accounting
	// Sizing is the --config FILE's sizing section, else the defaults.
	Sizing config.Sizing
}

// Resolve reads every setting of the command (flags, then the environment,
// then --config FILE) and checks that Postgres, and Redis when needRedis,
// are given. code is non-zero when it failed (the error is printed).
func (f *ConnFlags) Resolve(c *Env, name string, needRedis bool) (v ConnValues, code int) {
	got := map[string]string{}
	v.Source = map[string]string{}
	v.Sizing = config.Default().Sizing
	for _, s := range f.settings {
		if val := strings.TrimSpace(*f.values[s.Key]); val != "" {
			got[s.Key], v.Source[s.Key] = val, "--"+s.Flag
		} else if val := strings.TrimSpace(c.Getenv(s.Env())); val != "" {
			got[s.Key], v.Source[s.Key] = val, "$"+s.Env()
		}
	}
	if path := strings.TrimSpace(*f.Config); path != "" {
		cfg, err := config.Load(path, c.Getenv)
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: --config: %v\n", name, err)
			return v, 1
		}
		v.Accounting = &cfg.Accounting
		v.Sizing = cfg.Sizing
		for _, s := range f.settings {
			if got[s.Key] != "" {
				continue
			}
			if val := configValue(cfg, s.Key); val != "" {
				got[s.Key], v.Source[s.Key] = val, s.Key+" in "+path
			}
		}
	}
	v.DBURL, v.RedisURL, v.Master = got[KeyDatabaseURL], got[KeyRedisURL], got[KeySentinelMaster]
	for _, a := range strings.Split(got[KeySentinelAddrs], ",") {
		if a = strings.TrimSpace(a); a != "" {
			v.Sentinels = append(v.Sentinels, a)
		}
	}
	if v.DBURL == "" {
		fmt.Fprintf(c.Stderr, "%s: no database: pass --database-url URL, set %s, or pass --config FILE (%s)\n",
			name, config.EnvName(KeyDatabaseURL), KeyDatabaseURL)
		return v, 2
	}
	if needRedis && v.RedisURL == "" && v.Master == "" {
		fmt.Fprintf(c.Stderr, "%s: no Redis: pass --redis-url URL (or --sentinel-master and --sentinel-addrs), set %s, or pass --config FILE (%s)\n",
			name, config.EnvName(KeyRedisURL), KeyRedisURL)
		return v, 2
	}
	return v, 0
}

// configValue is a connection setting's value in a loaded configuration.
func configValue(cfg config.Config, key string) string {
	switch key {
	case KeyDatabaseURL:
		return cfg.Database.URL
	case KeyRedisURL:
		return cfg.Accounting.RedisURL
	case KeySentinelMaster:
		return cfg.Accounting.SentinelMaster
	case KeySentinelAddrs:
		return strings.Join(cfg.Accounting.SentinelAddrs, ",")
	}
	return ""
}

// RedisSource names where the Redis address came from, for errors.
func (v ConnValues) RedisSource() string {
	if v.Master != "" {
		return v.Source[KeySentinelMaster]
	}
	return v.Source[KeyRedisURL]
}

// Conns are a tool's connections: Postgres always, Redis when given.
type Conns struct {
	Pool  *pgxpool.Pool
	Pub   *publisher.Publisher // nil without Redis
	Close func()
}

// OpenConns connects to Postgres (and pings it) and to Redis when v names
// one. code is non-zero on failure (the error is printed).
func OpenConns(ctx context.Context, c *Env, name string, v ConnValues, maxConns int32) (*Conns, int) {
	pcfg, err := pgxpool.ParseConfig(v.DBURL)
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: database URL (%s): %v\n", name, v.Source[KeyDatabaseURL], redact.Error(err, v.DBURL))
		return nil, 2
	}
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = appname.Format(appname.RoleCLI, "")
	}
	pcfg.MaxConns = maxConns
	var closers []func()
	cn := &Conns{Close: func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}}
	if v.RedisURL != "" || v.Master != "" {
		cc := publisher.ClientConfig{URL: v.RedisURL, MasterName: v.Master, SentinelAddrs: v.Sentinels}
		if v.Accounting != nil {
			a := *v.Accounting
			a.RedisURL, a.SentinelMaster, a.SentinelAddrs = v.RedisURL, v.Master, v.Sentinels
			var err error
			if cc, err = publisher.ClientConfigFrom(a); err != nil {
				fmt.Fprintf(c.Stderr, "%s: --config: %v\n", name, err)
				return nil, 2
			}
		}
		cc.PoolSize = 4
		rdb, err := publisher.NewClient(cc)
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: Redis (%s): %v\n", name, v.RedisSource(), redact.Error(err, v.RedisURL))
			return nil, 2
		}
		closers = append(closers, func() { _ = rdb.Close() })
		if cn.Pub, err = publisher.New(rdb, publisher.Options{Logger: c.Logger}); err != nil {
			cn.Close()
			fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
			return nil, 1
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		cn.Close()
		fmt.Fprintf(c.Stderr, "%s: database (%s): %v\n", name, v.Source[KeyDatabaseURL], redact.Error(err, v.DBURL))
		return nil, 1
	}
	closers = append(closers, pool.Close)
	cn.Pool = pool
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = pool.Ping(pctx)
	cancel()
	if err != nil {
		cn.Close()
		fmt.Fprintf(c.Stderr, "%s: connect to the database (%s): %v\n", name, v.Source[KeyDatabaseURL], redact.Error(err, v.DBURL))
		return nil, 1
	}
	if cn.Pub != nil {
		// The tools read and write the accounting of this database only:
		// a Redis bound to another one is refused.
		ictx, cancel := context.WithTimeout(ctx, 15*time.Second)
		id, err := publisher.DatabaseIdentity(ictx, pool)
		if err == nil {
			err = cn.Pub.CheckIdentity(ictx, id)
		}
		cancel()
		if err != nil {
			cn.Close()
			fmt.Fprintf(c.Stderr, "%s: %v\n", name, redact.Error(err, v.DBURL, v.RedisURL))
			return nil, 1
		}
	}
	return cn, 0
}
