package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelGroup is a Redis primary, one replica and three Sentinels
// (quorum 2) on loopback and free ports, as a studio's HA Redis runs:
// clients find the primary through the Sentinels, and killing or freezing
// the primary makes them promote the replica.
type SentinelGroup struct {
	// Master is the Sentinel name of the primary.
	Master string
	// Servers are the two data servers; which one is the primary changes
	// with failovers (Primary asks the Sentinels).
	Servers []*Redis

	mu        sync.Mutex
	sentinels []*Sentinel
	addrs     []string
	dir       string
}

// SentinelOptions tunes StartSentinelGroup.
type SentinelOptions struct {
	// Databases of each data server (default 16).
	Databases int
	// DownAfter is Sentinel's down-after-milliseconds (default 1 s): how
	// long the primary must be silent before a failover starts.
	DownAfter time.Duration
}

// The Sentinels' failover-timeout is 4 s: an election lost to split votes
// is retried after twice that, not after Sentinel's default 6 minutes.
//
// StartSentinelGroup starts the primary, its replica and three Sentinels,
// and returns once the replica is in sync and every Sentinel knows the
// replica and the other two Sentinels (so a failover can be elected).
func StartSentinelGroup(ctx context.Context, opts SentinelOptions) (*SentinelGroup, error) {
	if opts.Databases == 0 {
		opts.Databases = 16
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = time.Second
	}
	if _, err := RedisBinary(); err != nil {
		return nil, err
	}
	g := &SentinelGroup{Master: "acct"}
	ok := false
	defer func() {
		if !ok {
			g.Stop()
		}
	}()
	primary, err := StartRedis(ctx, RedisOptions{Databases: opts.Databases})
	if err != nil {
		return nil, err
	}
	g.Servers = append(g.Servers, primary)
	replica, err := StartRedis(ctx, RedisOptions{Databases: opts.Databases, ReplicaOf: primary.Addr()})
	if err != nil {
		return nil, err
	}
	g.Servers = append(g.Servers, replica)
	if g.dir, err = makeTempDir("sentinel"); err != nil {
		return nil, err
	}
	for i := 0; i < 3; i++ {
		dir := filepath.Join(g.dir, strconv.Itoa(i))
		conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 4000\n"+
			"sentinel parallel-syncs %s 1\n",
			g.Master, primary.Port(), g.Master, opts.DownAfter.Milliseconds(), g.Master, g.Master)
		sn, err := StartSentinel(ctx, SentinelProcOptions{Dir: dir, Conf: conf})
		if err != nil {
			return nil, err
		}
		g.mu.Lock()
		g.sentinels = append(g.sentinels, sn)
		g.addrs = append(g.addrs, sn.Addr())
		g.mu.Unlock()
	}
	deadline := time.Now().Add(Patience(20 * time.Second))
	for {
		err := g.settled(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("testenv: Sentinel group not settled: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ok = true
	return g, nil
}

// settled: the replica is in sync, and every Sentinel sees the primary
// up, the replica and the two other Sentinels.
func (g *SentinelGroup) settled(ctx context.Context) error {
	rc := redis.NewClient(&redis.Options{Addr: g.Servers[1].Addr(), DialTimeout: time.Second, ReadTimeout: time.Second})
	info, err := rc.Info(ctx, "replication").Result()
	rc.Close()
	if err != nil {
		return err
	}
	if !containsLine(info, "master_link_status:up") {
		return errors.New("replica not in sync")
	}
	for _, a := range g.SentinelAddrs() {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: time.Second, ReadTimeout: time.Second})
		m, err := sc.Master(ctx, g.Master).Result()
		sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", a, err)
		}
		if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" || m["flags"] != "master" {
			return fmt.Errorf("sentinel %s sees flags=%s replicas=%s other sentinels=%s", a, m["flags"], m["num-slaves"], m["num-other-sentinels"])
		}
	}
	return nil
}

func containsLine(text, line string) bool {
	for len(text) > 0 {
		i := 0
		for i < len(text) && text[i] != '\n' {
			i++
		}
		l := text[:i]
		if len(l) > 0 && l[len(l)-1] == '\r' {
			l = l[:len(l)-1]
		}
		if l == line {
			return true
		}
		if i == len(text) {
			break
		}
		text = text[i+1:]
	}
	return false
}

// SentinelAddrs are the Sentinels' host:port addresses.
func (g *SentinelGroup) SentinelAddrs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.addrs...)
}

// Primary is the data server the Sentinels currently name as primary
// (asked of the first Sentinel that answers).
func (g *SentinelGroup) Primary(ctx context.Context) (*Redis, error) {
	var last error
	for _, a := range g.SentinelAddrs() {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: time.Second, ReadTimeout: time.Second})
		addr, err := sc.GetMasterAddrByName(ctx, g.Master).Result()
		sc.Close()
		if err != nil {
			last = err
			continue
		}
		hp := net.JoinHostPort(addr[0], addr[1])
		for _, s := range g.Servers {
			if s.Addr() == hp {
				return s, nil
			}
		}
		return nil, fmt.Errorf("testenv: Sentinel names %s, not one of the group's servers", hp)
	}
	return nil, fmt.Errorf("testenv: no Sentinel answered: %w", last)
}

// Stop kills the Sentinels and the data servers and removes their dirs.
func (g *SentinelGroup) Stop() {
	if g == nil {
		return
	}
	g.mu.Lock()
	cmds := g.sentinels
	g.sentinels = nil
	g.mu.Unlock()
	for _, c := range cmds {
		c.Stop()
	}
	for _, s := range g.Servers {
		s.Stop()
	}
	if g.dir != "" {
		_ = os.RemoveAll(g.dir)
	}
}

// WaitReplica waits until r serves as an in-sync replica (a restarted
// former primary is reconfigured by the Sentinels, then syncs).
func (g *SentinelGroup) WaitReplica(ctx context.Context, r *Redis, timeout time.Duration) error {
	deadline := time.Now().Add(Patience(timeout))
	for {
		rc := redis.NewClient(&redis.Options{Addr: r.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second})
		info, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err == nil && containsLine(info, "role:slave") && containsLine(info, "master_link_status:up") {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("testenv: %s not an in-sync replica after %s (last error %v)", r.Addr(), timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Sentinel is one redis-sentinel process started by StartSentinel.
type Sentinel struct {
	cmd    *exec.Cmd
	exited chan struct{}
	addr   string
}

// SentinelProcOptions configures StartSentinel.
type SentinelProcOptions struct {
	// Dir holds the configuration file (Sentinel rewrites it) and the
	// log; created if missing.
	Dir string
	// Conf is the configuration without port, bind, dir and logfile
	// (sentinel monitor ..., requirepass ...).
	Conf string
	// Password is the Sentinel's own requirepass, if Conf sets one (used
	// to ask the process on the port who it is).
	Password string
	// takenPorts, for tests of the retry: ports tried first.
	takenPorts []int
}

// StartSentinel starts redis-sentinel on 127.0.0.1 and a free port. A port
// another process bound between FreePort and the Sentinel's own bind is
// given up for another (up to portAttempts), whether the clash shows as
// the Sentinel failing to bind or as another server answering there, as
// StartRedis does.
func StartSentinel(ctx context.Context, o SentinelProcOptions) (*Sentinel, error) {
	bin, err := RedisBinary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	for i := 0; i < portAttempts; i++ {
		port := 0
		if i < len(o.takenPorts) {
			port = o.takenPorts[i]
		} else if port, err = FreePort(); err != nil {
			return nil, err
		}
		var s *Sentinel
		if s, err = startSentinel(ctx, bin, o, port); !errors.Is(err, errPortTaken) {
			return s, err
		}
	}
	return nil, err
}

func startSentinel(ctx context.Context, bin string, o SentinelProcOptions, port int) (*Sentinel, error) {
	logfile := filepath.Join(o.Dir, "sentinel.log")
	_ = os.Remove(logfile)
	conf := filepath.Join(o.Dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n%s", port, o.Dir, logfile, o.Conf)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start redis-sentinel: %w", err)
	}
	s := &Sentinel{cmd: cmd, exited: make(chan struct{}), addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(Patience(20 * time.Second))
	for {
		if pid, err := s.pid(ctx, o.Password); err == nil {
			// The process answering must be ours: another may hold the
			// port while ours is still failing to bind it.
			if pid != cmd.Process.Pid {
				s.Stop()
				return nil, fmt.Errorf("%w: %d answers for pid %d", errPortTaken, port, pid)
			}
			return s, nil
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(logfile)
			if strings.Contains(string(log), "Address already in use") {
				return nil, fmt.Errorf("%w: %d", errPortTaken, port)
			}
			return nil, fmt.Errorf("testenv: redis-sentinel exited during start-up: %s", tail(string(log), 2000))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Stop()
			return nil, fmt.Errorf("testenv: redis-sentinel on %s did not answer within %s", s.addr, Patience(20*time.Second))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pid asks the process on the Sentinel's address for its process id.
func (s *Sentinel) pid(ctx context.Context, password string) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: s.addr, Password: password, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1, DisableIdentity: true, Protocol: 2})
	defer c.Close()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(qctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// Addr is the Sentinel's host:port.
func (s *Sentinel) Addr() string { return s.addr }

// Port is the Sentinel's TCP port.
func (s *Sentinel) Port() int {
	_, p, _ := net.SplitHostPort(s.addr)
	n, _ := strconv.Atoi(p)
	return n
}

// Stop kills the Sentinel (and its process group) and waits for it.
func (s *Sentinel) Stop() {
	if s == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}
