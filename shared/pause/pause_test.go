package pause

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	if err := For(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("a pause that ran its course: %v", err)
	}
	why := errors.New("stopping")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	start := time.Now()
	if err := For(ctx, time.Hour); !errors.Is(err, why) {
		t.Fatalf("a pause whose context ended: %v, want its cause", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("a pause whose context had ended waited %v", d)
	}
}
