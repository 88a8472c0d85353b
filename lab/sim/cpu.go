package sim

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// cpuSnap is the CPU every process on the machine had used at one moment,
// and the machine's busy and total CPU time (/proc/stat), in seconds.
type cpuSnap struct {
	at          time.Time
	procs       map[int]float64
	busy, total float64
}

// takeCPU reads /proc. On a system without it the snapshot is empty and
// fillBound says nothing.
func takeCPU() cpuSnap {
	s := cpuSnap{at: time.Now(), procs: map[int]float64{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return s
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if secs := procCPU(pid); secs > 0 {
			s.procs[pid] = secs
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseFloat(v, 64)
			// user nice system idle iowait irq softirq steal (guest is
			// already in user); idle and iowait are not busy.
			if i >= 8 {
				break
			}
			s.total += n / 100
			if i != 3 && i != 4 {
				s.busy += n / 100
			}
		}
	}
	return s
}

// productApp: the application_name of a product connection (a scheduler,
// in its own process or in this one, or the sidecar); any other client
// backend serves the simulator (Cuebot emulator, monitor, seeding).
var productApp = regexp.MustCompile(`^(cuesched-scheduler|cuesched-sidecar|cuesched-lab/sim[0-9]+$)`)

// cpuPart is one consumer's share of a window.
type cpuPart struct {
	who  string
	secs float64
}

// fillCPU is where the machine's CPU went between two snapshots: each
// consumer's seconds, and how busy the machine's cores were.
type fillCPU struct {
	wall  float64 // seconds between the snapshots
	cores int
	busy  float64 // share of all cores' time that was busy (0..1)
	parts []cpuPart
}

// cpuBetween splits the CPU used between a and b by consumer: PostgreSQL's
// backends by whom they serve (pg_stat_activity read now: the product's
// connections by application_name, walsenders, background processes), the
// scheduler child processes, this process (sidecar, fakes, emulator,
// monitor), redis-server, and every other process on the machine.
func (w *World) cpuBetween(ctx context.Context, a, b cpuSnap) fillCPU {
	out := fillCPU{wall: b.at.Sub(a.at).Seconds(), cores: runtime.NumCPU()}
	if b.total > a.total {
		out.busy = (b.busy - a.busy) / (b.total - a.total)
	}
	class := map[int]string{}
	if rows, err := w.Pool.Query(ctx, `SELECT pid, COALESCE(backend_type, ''), COALESCE(application_name, '') FROM pg_stat_activity`); err == nil {
		for rows.Next() {
			var pid int
			var typ, app string
			if rows.Scan(&pid, &typ, &app) != nil {
				continue
			}
			switch {
			case typ == "walsender":
				class[pid] = "PostgreSQL walsenders (logical decoding for the host caches and the sidecar)"
			case typ == "client backend" && productApp.MatchString(app):
				class[pid] = "PostgreSQL serving the product"
			case typ == "client backend":
				class[pid] = "PostgreSQL serving the simulator"
			default:
				class[pid] = "PostgreSQL background (autovacuum, WAL writer, checkpointer)"
			}
		}
		rows.Close()
	}
	for _, pid := range w.childPIDs() {
		class[pid] = "scheduler processes"
	}
	if w.scale && len(w.childPIDs()) > 0 {
		class[os.Getpid()] = "simulator process (sidecar, fake RQD, Cuebot emulator, monitor)"
	} else {
		class[os.Getpid()] = "simulator process (schedulers, sidecar, fake RQD, Cuebot emulator, monitor)"
	}
	if pid := w.env.redis.PID(); pid > 0 {
		class[pid] = "redis-server"
	}
	sums := map[string]float64{}
	for pid, end := range b.procs {
		used := end - a.procs[pid] // a process born in the window counts whole
		if used <= 0 {
			continue
		}
		who, ok := class[pid]
		if !ok {
			who = "other processes on this machine"
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
				who = "PostgreSQL background (autovacuum, WAL writer, checkpointer)"
			}
		}
		sums[who] += used
	}
	for who, secs := range sums {
		out.parts = append(out.parts, cpuPart{who, secs})
	}
	sort.Slice(out.parts, func(i, j int) bool { return out.parts[i].secs > out.parts[j].secs })
	return out
}

// String is the window's split: "2 cores 97% busy over 62 s: PostgreSQL
// serving the product 58% of the cores, ...".
func (f fillCPU) String() string {
	var parts []string
	for _, p := range f.parts {
		if share := p.secs / (f.wall * float64(f.cores)); share >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", p.who, share*100))
		}
	}
	return fmt.Sprintf("%d cores %.0f%% busy over %.0f s; of all the cores' time: %s",
		f.cores, f.busy*100, f.wall, strings.Join(parts, ", "))
}

// fillBound notes where the CPU went during a fill and, when the fill took
// longer than its goal, by how much it missed and what bounds it.
func (w *World) fillBound(ctx context.Context, a, b cpuSnap, secs, goal float64) {
	if len(b.procs) == 0 {
		return
	}
	f := w.cpuBetween(ctx, a, b)
	w.Note("CPU during the fill: %s", f)
	if secs <= goal {
		return
	}
	bound := "not the CPU (the cores were idle part of the time): latency, locks or the fakes' pacing"
	if f.busy >= 0.9 && len(f.parts) > 0 {
		bound = fmt.Sprintf("this machine's CPU (%d cores, %.0f%% busy); the largest consumer: %s", f.cores, f.busy*100, f.parts[0].who)
	}
	w.Note("the fill missed its %.0f s goal by %.1f s (%.0f%%); bound by %s", goal, secs-goal, (secs-goal)/goal*100, bound)
}
