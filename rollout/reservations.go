package rollout

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cuesched/cuesched/scheduler/reservations"
)

// reservationsOf reads the firm host reservations from Redis.
func (t *Tool) reservationsOf(ctx context.Context) ([]reservations.Reservation, error) {
	rctx, cancel := t.redisCtx(ctx)
	defer cancel()
	return reservations.List(rctx, t.pub.Client())
}

// writeReservations is the status report's reservation section.
func writeReservations(b *strings.Builder, r *StatusReport) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	switch {
	case r.ReservationsSkipped != "":
		p("\nreservations: not read (%s)", r.ReservationsSkipped)
		return
	case len(r.Reservations) == 0:
		p("\nreservations: none held")
		return
	}
	p("\nreservations: %d held", len(r.Reservations))
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  HOST\tJOB\tLAYER\tCORES\tHELD\tREADY IN\tEXPIRES IN\tBACKFILLS\tGRANTED BY")
	for _, v := range r.Reservations {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", orDash(orName(v.HostName, v.Host)), orDash(orName(v.JobName, v.Job)),
			orDash(orName(v.LayerName, v.Layer)), cores(v.Cores), since(r.Time, v.GrantedAt), until(r.Time, v.ReadyAt),
			until(r.Time, v.ExpiresAt), v.Backfills, orDash(v.GrantedBy))
	}
	_ = tw.Flush()
}

func orName(name, id string) string {
	if name != "" {
		return name
	}
	return id
}

func since(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String()
}

// until renders how far t is ahead of now ("now" once passed).
func until(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if d := t.Sub(now); d > 0 {
		return d.Round(time.Second).String()
	}
	return "now"
}
