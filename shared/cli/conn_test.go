package cli

import (
	"testing"

	"github.com/cuesched/cuesched/shared/config"
)

// The environment variables of the connection settings are the config
// keys' overrides: the tools and the daemons read the same name.
func TestConnEnvIsTheConfigOverride(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	want := map[string]string{
		KeyDatabaseURL:    "postgres://u@db.example:5432/cuebot",
		KeyRedisURL:       "redis://redis.example:6379/3",
		KeySentinelMaster: "acct",
		KeySentinelAddrs:  "s1:26379,s2:26379",
	}
	for _, s := range ConnSettings() {
		if s.Env() != config.EnvName(s.Key) {
			t.Errorf("%s: env %s, config override %s", s.Key, s.Env(), config.EnvName(s.Key))
		}
		if want[s.Key] == "" {
			t.Fatalf("no test value for %s", s.Key)
		}
		env[s.Env()] = want[s.Key]
	}
	cfg, err := config.Load("", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ConnSettings() {
		if got := configValue(cfg, s.Key); got != want[s.Key] {
			t.Errorf("config.Load with $%s=%q: %s = %q", s.Env(), want[s.Key], s.Key, got)
		}
	}
}
