// Package rqdclient calls RQD's gRPC interface (rqd.RqdInterface) on render
// hosts: LaunchFrame and KillRunningFrame.
//
// Connections are plaintext HTTP/2 as with every OpenCue party, one
// grpc.ClientConn per dialed address, shared by all calls and closed after
// sitting idle (default 5 minutes). The address of a host is its name and
// the configured port unless Options.Resolve says otherwise; tests resolve
// every host to one fake RQD, and because the cache is keyed by address
// they then share a single connection.
//
// Every call carries the gRPC metadata "x-cuesched-host: <host name>": real
// RQDs ignore it, a multi-host fake uses it to know which host the call is
// for.
//
// Retries. A LaunchFrame is retried once, and only when the status is
// UNAVAILABLE, which grpc-go reports when the request could not be sent on
// a ready connection. The reference also retries UNKNOWN, INTERNAL,
// DEADLINE_EXCEEDED and ABORTED; those can come back after the RQD accepted
// the frame, and a second launch of a running frame is refused as a
// duplicate, which would make a started frame look failed. Any failure is
// returned to the dispatcher, which compensates and sends a best-effort
// KillRunningFrame in case the frame did start.
package rqdclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cuesched/cuesched/proto/rqdpb"
)

// HostMetadataKey names the render host in every call's metadata.
const HostMetadataKey = "x-cuesched-host"

// Options configures a Pool.
type Options struct {
	// Port is RQD's gRPC port (8444).
	Port int
	// Resolve maps a host name to the address to dial; default
	// "<name>:<Port>".
	Resolve func(host string) string
	// DialOptions are added to the defaults (plaintext, connect timeout).
	DialOptions []grpc.DialOption
	// TLS, when set, replaces plaintext (rqd.tls; upstream RQD is plaintext).
	TLS *tls.Config
	// ConnectTimeout bounds connection establishment (default 10 s).
	ConnectTimeout time.Duration
	// RequestTimeout bounds each call (default 30 s).
	RequestTimeout time.Duration
	// IdleClose closes a connection unused for this long (default 5 m).
	IdleClose time.Duration
	Logger    hclog.Logger
}

// Pool is a cache of RQD connections. It is safe for concurrent use.
type Pool struct {
	o   Options
	log hclog.Logger

	mu        sync.Mutex
	conns     map[string]*entry
	lastSweep time.Time
	closed    bool
}

type entry struct {
	conn     *grpc.ClientConn
	client   rqdpb.RqdInterfaceClient
	lastUsed time.Time
}

// New returns an empty pool.
func New(o Options) *Pool {
	if o.Port == 0 {
		o.Port = 8444
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.IdleClose <= 0 {
		o.IdleClose = 5 * time.Minute
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Pool{o: o, log: log.Named("rqd"), conns: map[string]*entry{}}
}

// ErrClosed is returned by calls after Close.
var ErrClosed = errors.New("rqd client pool closed")

func (p *Pool) addr(host string) string {
	if p.o.Resolve != nil {
		return p.o.Resolve(host)
	}
	return net.JoinHostPort(host, strconv.Itoa(p.o.Port))
}

func (p *Pool) client(host string) (rqdpb.RqdInterfaceClient, error) {
	addr := p.addr(host)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	now := time.Now()
	if now.Sub(p.lastSweep) > p.o.IdleClose/4 {
		p.lastSweep = now
		for a, e := range p.conns {
			if a != addr && now.Sub(e.lastUsed) > p.o.IdleClose {
				_ = e.conn.Close()
				delete(p.conns, a)
			}
		}
	}
	if e, ok := p.conns[addr]; ok {
		e.lastUsed = now
		return e.client, nil
	}
	creds := insecure.NewCredentials()
	if p.o.TLS != nil {
		creds = credentials.NewTLS(p.o.TLS)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: p.o.ConnectTimeout}),
	}, p.o.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("rqd %s (%s): %w", host, addr, err)
	}
	e := &entry{conn: conn, client: rqdpb.NewRqdInterfaceClient(conn), lastUsed: now}
	p.conns[addr] = e
	return e.client, nil
}

func (p *Pool) callCtx(ctx context.Context, host string) (context.Context, context.CancelFunc) {
	ctx = metadata.AppendToOutgoingContext(ctx, HostMetadataKey, host)
	return context.WithTimeout(ctx, p.o.RequestTimeout)
}

// LaunchFrame asks host's RQD to start rf.
func (p *Pool) LaunchFrame(ctx context.Context, host string, rf *rqdpb.RunFrame) error {
	c, err := p.client(host)
	if err != nil {
		return err
	}
	req := &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: rf}
	for attempt := 0; ; attempt++ {
		cctx, cancel := p.callCtx(ctx, host)
		_, err = c.LaunchFrame(cctx, req)
		cancel()
		if err == nil {
			return nil
		}
		if attempt == 0 && status.Code(err) == codes.Unavailable && ctx.Err() == nil && !pastDeadline(ctx) {
			p.log.Debug("launch unavailable, retrying once", "host", host, "frame", rf.GetFrameName(), "error", err)
			continue
		}
		return fmt.Errorf("launch frame %s on %s: %w", rf.GetFrameName(), host, err)
	}
}

// KillRunningFrame asks host's RQD to kill a frame. NOT_FOUND (not running
// there) counts as success, as in Cuebot.
func (p *Pool) KillRunningFrame(ctx context.Context, host, frameID, reason string) error {
	c, err := p.client(host)
	if err != nil {
		return err
	}
	cctx, cancel := p.callCtx(ctx, host)
	defer cancel()
	_, err = c.KillRunningFrame(cctx, &rqdpb.RqdStaticKillRunningFrameRequest{FrameId: frameID, Message: reason})
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("kill frame %s on %s: %w", frameID, host, err)
	}
	return nil
}

// RunningProcs is what host's RQD reports running (ReportStatus: the
// frames of its HostReport): the proc (resource_id) of each.
// Python RQD's GetRunningFrameStatus fails on every call; ReportStatus
// answers on every RQD.
func (p *Pool) RunningProcs(ctx context.Context, host string) (map[string]bool, error) {
	c, err := p.client(host)
	if err != nil {
		return nil, err
	}
	cctx, cancel := p.callCtx(ctx, host)
	defer cancel()
	r, err := c.ReportStatus(cctx, &rqdpb.RqdStaticReportStatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", host, err)
	}
	out := map[string]bool{}
	for _, f := range r.GetHostReport().GetFrames() {
		if id := f.GetResourceId(); id != "" {
			out[id] = true
		}
	}
	return out, nil
}

// Len is the number of open connections.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close closes every connection; later calls fail with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for a, e := range p.conns {
		errs = append(errs, e.conn.Close())
		delete(p.conns, a)
	}
	return errors.Join(errs...)
}

// pastDeadline reads ctx's deadline from the clock: right after the process
// resumes from a stall the deadline's timer may not have fired yet, and a
// retried launch must not leave after the deadline the dispatcher set.
func pastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
