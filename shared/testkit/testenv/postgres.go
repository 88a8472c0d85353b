package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresOptions tunes a throwaway cluster. The zero value is what tests use.
type PostgresOptions struct {
	// WALLevel defaults to "logical". Tests of the migrate preflight start a
	// cluster with "replica" to check the refusal.
	WALLevel string
	// ExtraSettings are passed as -c key=value to postgres.
	ExtraSettings map[string]string
	// Log receives postgres' stderr; nil writes it to a file in the data dir.
	LogFile string
	// takenPorts are tried before free ones (the port-clash test).
	takenPorts []int
}

// Postgres is a PostgreSQL cluster: either one this process started in a temp
// dir (owned and torn down by us) or an external server named by a URL.
type Postgres struct {
	mu       sync.Mutex
	adminURL string
	external bool

	// Fields below are only set for clusters we started.
	binDir  string
	dir     string // temp dir: data/, sockets, log
	port    int
	opts    PostgresOptions
	cmd     *exec.Cmd
	exited  chan struct{}
	cred    *syscall.Credential
	stopped bool
}

// PostgresBinDir finds the directory holding initdb and postgres, preferring
// PostgreSQL 15 as Debian installs it.
func PostgresBinDir() (string, error) {
	if dir := os.Getenv("CUESCHED_PG_BINDIR"); dir != "" {
		return dir, nil
	}
	candidates, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(candidates, func(i, j int) bool { return pgMajor(candidates[i]) > pgMajor(candidates[j]) })
	for _, c := range candidates {
		if strings.Contains(c, "/15/") {
			candidates = append([]string{c}, candidates...)
			break
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(filepath.Join(c, "initdb")); err == nil {
			return c, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("testenv: PostgreSQL server binaries not found (looked in /usr/lib/postgresql/*/bin and PATH); install them with: apt-get install -y postgresql")
}

func pgMajor(dir string) int {
	parts := strings.Split(dir, "/")
	for i, p := range parts {
		if p == "postgresql" && i+1 < len(parts) {
			n, _ := strconv.Atoi(parts[i+1])
			return n
		}
	}
	return 0
}

// StartPostgres starts a fresh cluster in a temp dir with logical replication
// enabled. When running as root, initdb and postgres run as the "postgres"
// user. The server listens on 127.0.0.1 on a free port and on a Unix socket in
// the temp dir. The returned cluster must be stopped with Stop.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	binDir, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	if opts.WALLevel == "" {
		opts.WALLevel = "logical"
	}
	dir, err := makeTempDir("pg")
	if err != nil {
		return nil, err
	}
	p := &Postgres{binDir: binDir, dir: dir, opts: opts}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: running as root needs the postgres user (apt-get install -y postgresql): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: chown %s: %w", dir, err)
		}
	}
	initdb := p.command(filepath.Join(binDir, "initdb"),
		"-D", p.dataDir(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testenv: initdb failed: %w\n%s", err, out)
	}
	// Allow replication connections over TCP from loopback (initdb's trust
	// defaults already cover the Unix socket and 127.0.0.1, but be explicit).
	hba := "local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(p.dataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if p.cred != nil {
		_ = os.Chown(filepath.Join(p.dataDir(), "pg_hba.conf"), int(p.cred.Uid), int(p.cred.Gid))
	}
	if err := p.startOnFreePort(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

// errPortTaken: the server could not have the port it was given, because
// another process (a parallel test's server, say) bound it between FreePort
// and the server's own bind.
var errPortTaken = errors.New("testenv: port taken before the server bound it")

// portAttempts bounds how often a fresh server tries a new port.
const portAttempts = 8

// startOnFreePort starts the server on a free port, and on another when the
// port was taken in the meantime (FreePort's answer is only a hint on a
// machine where other test processes pick ports too).
func (p *Postgres) startOnFreePort(ctx context.Context) error {
	var err error
	for i := 0; i < portAttempts; i++ {
		p.port = 0
		if i < len(p.opts.takenPorts) {
			p.port = p.opts.takenPorts[i]
		}
		if err = p.start(ctx); !errors.Is(err, errPortTaken) {
			return err
		}
	}
	return err
}

// ExternalPostgres wraps a server we do not own (CUESCHED_TEST_PG_URL). The URL
// must name a role that can CREATE DATABASE and replicate.
func ExternalPostgres(adminURL string) *Postgres {
	return &Postgres{adminURL: adminURL, external: true}
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }

// Dir is the temp dir holding the cluster (empty for an external server).
func (p *Postgres) Dir() string { return p.dir }

func (p *Postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if p.cred != nil {
		attr.Credential = p.cred
		cmd.Dir = p.dir
	}
	cmd.SysProcAttr = attr
	return cmd
}

func (p *Postgres) start(ctx context.Context) error {
	if p.port == 0 {
		port, err := FreePort()
		if err != nil {
			return err
		}
		p.port = port
	}
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(p.port),
		"unix_socket_directories": p.dir,
		"wal_level":               p.opts.WALLevel,
		"max_wal_senders":         "64",
		"max_replication_slots":   "64",
		// Bounded, as the operator guide asks (migrate warns at -1).
		"max_slot_wal_keep_size":   "8GB",
		"max_connections":          "400",
		"shared_preload_libraries": "pg_stat_statements",
		"fsync":                    "off",
		"synchronous_commit":       "off",
		"full_page_writes":         "off",
		"wal_sender_timeout":       "10s",
		"shared_buffers":           "128MB",
		"timezone":                 "UTC",
		"log_min_messages":         "warning",
	}
	for k, v := range p.opts.ExtraSettings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", p.dataDir()}
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logPath := p.opts.LogFile
	if logPath == "" {
		logPath = filepath.Join(p.dir, "postgres.log")
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := p.command(filepath.Join(p.binDir, "postgres"), args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("testenv: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	p.adminURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)

	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, p.adminURL)
		if err == nil {
			// The server that answers must be ours: another one may hold the
			// port while ours is still failing to bind it.
			var dataDir string
			err = conn.QueryRow(cctx, "SHOW data_directory").Scan(&dataDir)
			conn.Close(ctx)
			cancel()
			if err == nil && filepath.Clean(dataDir) != filepath.Clean(p.dataDir()) {
				_ = cmd.Process.Kill()
				<-exited
				// Killed mid start-up, it may leave its lock file empty,
				// which the next attempt's server refuses ("lock file
				// postmaster.pid is empty"): the process is gone and the
				// data directory is ours, so remove it.
				_ = os.Remove(filepath.Join(p.dataDir(), "postmaster.pid"))
				return fmt.Errorf("%w: %d answers for %s", errPortTaken, p.port, dataDir)
			}
			if err == nil {
				return nil
			}
		} else {
			cancel()
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			if strings.Contains(string(log), "Address already in use") {
				return fmt.Errorf("%w: %d", errPortTaken, p.port)
			}
			return fmt.Errorf("testenv: postgres exited during start-up: %s", tail(string(log), 2000))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			return fmt.Errorf("testenv: postgres did not accept connections within 60s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AdminURL connects to the "postgres" database as a superuser.
func (p *Postgres) AdminURL() string { return p.adminURL }

// Port is the TCP port (0 for an external server).
func (p *Postgres) Port() int { return p.port }

// URL returns a connection URL for database db on this server.
func (p *Postgres) URL(db string) string { return withDatabase(p.adminURL, db) }

// Restart stops the server with the given mode ("fast" = SIGINT,
// "immediate" = SIGQUIT, "kill" = SIGKILL) and starts it again on the same port,
// for fault tests. It is an error on an external server.
func (p *Postgres) Restart(ctx context.Context, mode string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.external {
		return errors.New("testenv: cannot restart an external PostgreSQL")
	}
	p.signalAndWait(mode)
	return p.start(ctx)
}

// StopServer stops the server without removing its data (see Restart).
func (p *Postgres) StopServer(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.signalAndWait(mode)
}

// StartServer starts a server stopped with StopServer.
func (p *Postgres) StartServer(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start(ctx)
}

func (p *Postgres) signalAndWait(mode string) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	sig := syscall.SIGINT
	switch mode {
	case "immediate":
		sig = syscall.SIGQUIT
	case "kill":
		sig = syscall.SIGKILL
	}
	if sig == syscall.SIGKILL {
		// Kill the whole process group so no backend outlives the postmaster.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	if sig == syscall.SIGKILL {
		// A killed postmaster leaves its pid file; postgres refuses to start
		// while it names a live process, which it no longer does.
		time.Sleep(100 * time.Millisecond)
	}
	p.cmd = nil
}

// Stop shuts the server down and removes its temp dir. Safe to call twice.
func (p *Postgres) Stop() {
	if p == nil || p.external {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	p.signalAndWait("immediate")
	_ = os.RemoveAll(p.dir)
}

// CreateDatabase creates database name, optionally as a copy of template.
func (p *Postgres) CreateDatabase(ctx context.Context, name, template string) error {
	conn, err := pgx.Connect(ctx, p.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	_, err = conn.Exec(ctx, sql)
	return err
}

// DropDatabase drops a database, terminating its connections and dropping any
// replication slot created in it first.
func (p *Postgres) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for i := 0; i < 20; i++ {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
		_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, name)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func withDatabase(rawURL, db string) string {
	// URLs we build are postgres://user@host:port/db?params.
	q := ""
	if i := strings.IndexByte(rawURL, '?'); i >= 0 {
		rawURL, q = rawURL[:i], rawURL[i:]
	}
	scheme := strings.Index(rawURL, "://")
	slash := strings.IndexByte(rawURL[scheme+3:], '/')
	if slash >= 0 {
		rawURL = rawURL[:scheme+3+slash]
	}
	return rawURL + "/" + db + q
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// StartStandby makes a streaming replica of this cluster, as an HA setup
// has one: pg_basebackup -R (WAL streamed, standby.signal and
// primary_conninfo written) into a new temp dir, started on a new port
// with the same settings. It answers read-only queries until Promote.
func (p *Postgres) StartStandby(ctx context.Context) (*Postgres, error) {
	if p.external {
		return nil, errors.New("testenv: cannot make a standby of an external PostgreSQL")
	}
	dir, err := makeTempDir("pg")
	if err != nil {
		return nil, err
	}
	s := &Postgres{binDir: p.binDir, dir: dir, opts: p.opts, cred: p.cred}
	s.opts.LogFile = ""
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: chown %s: %w", dir, err)
		}
	}
	bb := s.command(filepath.Join(p.binDir, "pg_basebackup"), "-D", s.dataDir(), "-R", "-X", "stream",
		"-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres", "--checkpoint=fast", "--no-sync")
	if out, err := bb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testenv: pg_basebackup failed: %w\n%s", err, out)
	}
	if err := s.startOnFreePort(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Promote ends recovery on a standby (pg_promote, waiting for it): it
// becomes a primary on a new timeline.
func (p *Postgres) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.adminURL)
	if err != nil {
		return fmt.Errorf("testenv: promote: %w", err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("testenv: promote: %w", err)
	}
	if !ok {
		return errors.New("testenv: promote: pg_promote returned false")
	}
	return nil
}
