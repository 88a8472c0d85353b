package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func runStatusT(env map[string]string, args ...string) (int, string, string) {
	c, out, errb := testCLI(env)
	code := runStatus(context.Background(), c, args)
	return code, out.String(), errb.String()
}

func TestStatusCLIUsage(t *testing.T) {
	t.Parallel()
	if code, _, errOut := runStatusT(map[string]string{}, "extra"); code != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("extra argument: %d %s", code, errOut)
	}
	if code, _, errOut := runStatusT(map[string]string{}); code != 2 || !strings.Contains(errOut, "no database") {
		t.Errorf("no database: %d %s", code, errOut)
	}
	if code, out, errOut := runStatusT(map[string]string{}, "-h"); code != 0 || !strings.Contains(out, "exit status: 0 when nothing needs attention") {
		t.Errorf("help: %d %s%s", code, out, errOut)
	}
}

func TestStatusCLIExitCodes(t *testing.T) {
	t.Parallel()
	f := newROFarm(t)

	// Nothing managed, nothing running: healthy.
	code, out, errOut := runStatusT(f.env)
	if code != 0 || !strings.Contains(out, "status: OK") {
		t.Fatalf("idle farm: %d\n%s\n%s", code, out, errOut)
	}

	// A managed show with a leader but without a sidecar: attention, exit 1.
	roLeaderConn(t, f.db)
	if _, err := f.pool.Exec(context.Background(), `UPDATE show SET b_scheduler_managed = true WHERE str_name = 'alpha'`); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runStatusT(f.env, "--no-audit")
	if code != 1 || !strings.Contains(out, "status: NEEDS ATTENTION") || !strings.Contains(out, "no sidecar slot") ||
		!strings.Contains(out, "loop leader: scheduler/fake") {
		t.Fatalf("no sidecar: %d\n%s", code, out)
	}

	// JSON: the same verdict, machine-readable.
	code, out, _ = runStatusT(f.env, "--json")
	var js struct {
		Leader *struct {
			Instance string `json:"instance"`
		} `json:"leader"`
		Attention []string `json:"attention"`
		Audit     *struct {
			Drifts int `json:"drifts"`
		} `json:"audit"`
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil || code != 1 || js.Leader == nil || js.Leader.Instance != "scheduler/fake" ||
		len(js.Attention) == 0 || js.Audit == nil || js.Audit.Drifts == 0 {
		t.Fatalf("json: %d %v %+v\n%s", code, err, js, out)
	}
}
