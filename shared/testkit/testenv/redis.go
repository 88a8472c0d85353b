package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RedisOptions tunes a throwaway redis-server.
type RedisOptions struct {
	// Databases is the number of logical DBs (default 1024) so that each test
	// of a package can have its own.
	Databases int
	// AppendOnly turns on AOF with appendfsync always (durability tests).
	AppendOnly bool
	// ReplicaOf ("host:port") starts the server as a replica of that
	// primary (Sentinel tests).
	ReplicaOf string
	// takenPorts are tried before free ones (the port-clash test).
	takenPorts []int
}

// Redis is a redis-server this process started (or an external one).
type Redis struct {
	mu       sync.Mutex
	addr     string
	external bool
	url      string
	dbs      int

	dir     string
	port    int
	opts    RedisOptions
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// RedisBinary finds redis-server.
func RedisBinary() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		return "/usr/bin/redis-server", nil
	}
	return "", errors.New("testenv: redis-server not found; install it with: apt-get install -y redis-server")
}

// StartRedis starts redis-server without persistence on 127.0.0.1 and a free
// port, with its Unix socket in a temp dir.
func StartRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	bin, err := RedisBinary()
	if err != nil {
		return nil, err
	}
	if opts.Databases == 0 {
		opts.Databases = 1024
	}
	dir, err := makeTempDir("redis")
	if err != nil {
		return nil, err
	}
	r := &Redis{dir: dir, opts: opts, dbs: opts.Databases}
	for i := 0; i < portAttempts; i++ {
		r.port = 0
		if i < len(opts.takenPorts) {
			r.port = opts.takenPorts[i]
		}
		if err = r.start(ctx, bin); !errors.Is(err, errPortTaken) {
			break
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

// ExternalRedis wraps an existing server named by a redis:// URL
// (CUESCHED_TEST_REDIS_URL). Tests pick DB numbers below its "databases".
func ExternalRedis(url string, databases int) *Redis {
	if databases <= 0 {
		databases = 16
	}
	return &Redis{url: url, external: true, dbs: databases}
}

func (r *Redis) start(ctx context.Context, bin string) error {
	if r.port == 0 {
		port, err := FreePort()
		if err != nil {
			return err
		}
		r.port = port
	}
	args := []string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(r.port),
		"--unixsocket", filepath.Join(r.dir, "redis.sock"),
		"--unixsocketperm", "700",
		"--dir", r.dir,
		"--save", "",
		"--databases", strconv.Itoa(r.opts.Databases),
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", filepath.Join(r.dir, "redis.log"),
	}
	if r.opts.ReplicaOf != "" {
		host, port, err := net.SplitHostPort(r.opts.ReplicaOf)
		if err != nil {
			return fmt.Errorf("testenv: replica of %q: %w", r.opts.ReplicaOf, err)
		}
		args = append(args, "--replicaof", host, port)
	}
	if r.opts.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.cmd, r.exited = cmd, exited
	r.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
	r.url = "redis://" + r.addr

	deadline := time.Now().Add(20 * time.Second)
	for {
		if pid, err := redisPID(r.addr); err == nil {
			// The server that answers must be ours: another one may hold
			// the port while ours is still failing to bind it.
			if pid != cmd.Process.Pid {
				_ = cmd.Process.Kill()
				<-exited
				return fmt.Errorf("%w: %d answers for pid %d", errPortTaken, r.port, pid)
			}
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			if strings.Contains(string(log), "Address already in use") {
				return fmt.Errorf("%w: %d", errPortTaken, r.port)
			}
			return fmt.Errorf("testenv: redis-server exited during start-up: %s", tail(string(log), 2000))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			return errors.New("testenv: redis-server did not answer PING within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisPID asks the server on addr for its process id (INFO server).
func redisPID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	// A bulk string: $<len>\r\n<body>\r\n. The body is a few KB at most.
	rd := bufio.NewReader(c)
	head, err := rd.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("unexpected INFO reply %q", head)
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("unexpected INFO reply %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// Addr is host:port.
func (r *Redis) Addr() string { return r.addr }

// Dir is the server's data directory ("" for an external server): SAVE
// writes dump.rdb there, and a server started by StartServer loads it, so
// a test can bring Redis back from an older snapshot.
func (r *Redis) Dir() string { return r.dir }

// PID is the redis-server process this Redis started (0 for an external
// server, or once it was stopped).
func (r *Redis) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil || r.stopped {
		return 0
	}
	return r.cmd.Process.Pid
}

// Port is the TCP port (0 for an external server).
func (r *Redis) Port() int { return r.port }

// Databases is how many logical DBs the server has.
func (r *Redis) Databases() int { return r.dbs }

// URL returns a redis:// URL for logical database db.
func (r *Redis) URL(db int) string {
	if r.external {
		return withRedisDB(r.url, db)
	}
	return fmt.Sprintf("redis://%s/%d", r.addr, db)
}

func withRedisDB(url string, db int) string {
	// Strip any path from redis://host:port/N.
	rest := url[len("redis://"):]
	if i := indexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	return fmt.Sprintf("redis://%s/%d", rest, db)
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// Restart kills redis-server (SIGKILL: nothing is saved) and starts an empty
// one on the same port, as a Redis crash looks to clients.
func (r *Redis) Restart(ctx context.Context) error {
	r.StopServer()
	return r.StartServer(ctx)
}

// StopServer kills the server, keeping its port for StartServer.
func (r *Redis) StopServer() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.exited
	r.cmd = nil
}

// StartServer starts a server stopped with StopServer.
func (r *Redis) StartServer(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.external {
		return errors.New("testenv: cannot restart an external Redis")
	}
	bin, err := RedisBinary()
	if err != nil {
		return err
	}
	return r.start(ctx, bin)
}

// Signal sends sig to the running server (SIGSTOP/SIGCONT to freeze it).
func (r *Redis) Signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return errors.New("testenv: redis-server not running")
	}
	return syscall.Kill(r.cmd.Process.Pid, sig)
}

// Stop kills the server and removes its temp dir. Safe to call twice.
func (r *Redis) Stop() {
	if r == nil || r.external {
		return
	}
	r.StopServer()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.stopped = true
		_ = os.RemoveAll(r.dir)
	}
}
