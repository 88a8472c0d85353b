// Package pause waits for a duration or for a context's end, whichever
// comes first: the sleep of every retry and poll loop of both daemons.
package pause

import (
	"context"
	"time"
)

// For waits d, or returns the cause of ctx's end (context.Cause) if it
// ends first.
func For(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
