package logging

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// RedisLog carries go-redis's own log lines (connection pool, sentinel,
// re-authentication, push notifications) into hclog, so they follow
// logging.format and logging.level like every other line of the process.
//
// go-redis keeps its logger in a package global (redis.SetLogger), so the
// binary sets it once, in main, to a RedisLog; a daemon then points the
// RedisLog at its own logger (Use) once its configuration is loaded. Until
// then lines go to the fallback. It implements go-redis's internal Logging
// interface (Printf with a context).
type RedisLog struct {
	cur atomic.Pointer[hclog.Logger]
}

// NewRedisLog returns a RedisLog writing to a text logger on out (at WARN
// and above) until Use is called.
func NewRedisLog(out io.Writer) *RedisLog {
	r := &RedisLog{}
	fallback := hclog.New(&hclog.LoggerOptions{Name: "redis", Level: hclog.Warn, Output: out})
	r.cur.Store(&fallback)
	return r
}

// Use sends go-redis's lines to l from now on.
func (r *RedisLog) Use(l hclog.Logger) {
	if l != nil {
		r.cur.Store(&l)
	}
}

// Printf logs one go-redis line: at WARN when it reports a failure or an
// error, else at INFO.
func (r *RedisLog) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	l := *r.cur.Load()
	lower := strings.ToLower(msg)
	if strings.Contains(lower, "fail") || strings.Contains(lower, "error") {
		l.Warn(msg)
		return
	}
	l.Info(msg)
}
