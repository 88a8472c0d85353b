package rqdclient_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

func frame() *rqdpb.RunFrame {
	return &rqdpb.RunFrame{
		ResourceId: uuid.NewString(), FrameId: uuid.NewString(), JobId: uuid.NewString(), LayerId: uuid.NewString(),
		FrameName: "0001-l", JobName: "j", NumCores: 100, Command: "true",
	}
}

func TestLaunchKillAndSharing(t *testing.T) {
	fake, err := fakerqd.Start(fakerqd.Config{
		Default: fakerqd.Behavior{RunTime: time.Hour},
		Hosts: map[string]fakerqd.Behavior{
			"down":    {Mode: fakerqd.Unreachable},
			"refuses": {Mode: fakerqd.RefuseLaunch},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	if rqdclient.HostMetadataKey != fakerqd.HostMetadataKey {
		t.Fatalf("metadata keys differ: %q vs %q", rqdclient.HostMetadataKey, fakerqd.HostMetadataKey)
	}
	p := rqdclient.New(rqdclient.Options{Resolve: fake.Resolve, RequestTimeout: 5 * time.Second})
	defer p.Close()
	ctx := context.Background()

	a, b := frame(), frame()
	if err := p.LaunchFrame(ctx, "hostA", a); err != nil {
		t.Fatal(err)
	}
	if err := p.LaunchFrame(ctx, "hostB", b); err != nil {
		t.Fatal(err)
	}
	if got := fake.Running("hostA"); len(got) != 1 || got[0].GetFrameId() != a.FrameId {
		t.Fatalf("hostA runs %v", got)
	}
	if got := fake.Running("hostB"); len(got) != 1 || got[0].GetFrameId() != b.FrameId {
		t.Fatalf("hostB runs %v", got)
	}
	if p.Len() != 1 {
		t.Fatalf("%d connections for hosts resolving to one address, want 1", p.Len())
	}

	// Unreachable: UNAVAILABLE, retried exactly once.
	before := len(fake.Launches())
	err = p.LaunchFrame(ctx, "down", frame())
	if status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Fatalf("launch on an unreachable host = %v", err)
	}
	if n := len(fake.Launches()) - before; n != 2 {
		t.Fatalf("unreachable launch attempted %d times, want 2", n)
	}
	// Refused: not retried.
	before = len(fake.Launches())
	if err := p.LaunchFrame(ctx, "refuses", frame()); status.Code(errors.Unwrap(err)) != codes.Aborted {
		t.Fatalf("refused launch = %v", err)
	}
	if n := len(fake.Launches()) - before; n != 1 {
		t.Fatalf("refused launch attempted %d times, want 1", n)
	}

	// Kill: running frame stops; unknown frame is fine (NOT_FOUND).
	if err := p.KillRunningFrame(ctx, "hostA", a.FrameId, "test"); err != nil {
		t.Fatal(err)
	}
	if got := fake.Running("hostA"); len(got) != 0 {
		t.Fatalf("hostA still runs %v", got)
	}
	if err := p.KillRunningFrame(ctx, "hostA", uuid.NewString(), "test"); err != nil {
		t.Fatalf("killing an unknown frame: %v", err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.LaunchFrame(ctx, "hostA", frame()); !errors.Is(err, rqdclient.ErrClosed) {
		t.Fatalf("launch after Close = %v", err)
	}
}

func TestIdleConnectionsClose(t *testing.T) {
	fake, err := fakerqd.Start(fakerqd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	addrs := map[string]string{"h1": fake.Addr(), "h2": "localhost:" + portOf(fake.Addr())}
	p := rqdclient.New(rqdclient.Options{Resolve: func(h string) string { return addrs[h] }, IdleClose: 40 * time.Millisecond})
	defer p.Close()
	ctx := context.Background()
	if err := p.LaunchFrame(ctx, "h1", frame()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	if err := p.LaunchFrame(ctx, "h2", frame()); err != nil {
		t.Fatal(err)
	}
	if p.Len() != 1 {
		t.Fatalf("idle connection kept: %d open", p.Len())
	}
}

func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}
