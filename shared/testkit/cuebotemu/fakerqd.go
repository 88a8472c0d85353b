package cuebotemu

import (
	"context"

	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

// FromFakeRQD converts a fake RQD completion into the report Cuebot gets.
func FromFakeRQD(fc fakerqd.FrameCompletion) Completion {
	return Completion{
		FrameID:     fc.FrameID,
		ProcID:      fc.ResourceID,
		Host:        fc.Host,
		ExitStatus:  int(fc.ExitStatus),
		ExitSignal:  int(fc.ExitSignal),
		RunTime:     fc.RunTime,
		MaxRSSKB:    fc.MaxRSSKB,
		NimbyLocked: fc.Report.GetHost().GetNimbyLocked(),
	}
}

// FakeRQDCallback returns a function to plug into fakerqd.Config.OnComplete:
// every completed frame is handed to Complete with ctx. Errors (which leave
// the database unchanged) go to onError when it is non-nil, else to the
// emulator's logger.
func (e *Emulator) FakeRQDCallback(ctx context.Context, onError func(fakerqd.FrameCompletion, error)) func(fakerqd.FrameCompletion) {
	return func(fc fakerqd.FrameCompletion) {
		if err := e.Complete(ctx, FromFakeRQD(fc)); err != nil {
			if onError != nil {
				onError(fc, err)
				return
			}
			e.log.Error("frame completion failed", "frame", fc.FrameID, "host", fc.Host, "error", err)
		}
	}
}
