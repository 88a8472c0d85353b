package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestRedisLogFollowsTheDaemonsFormat: go-redis's lines, once the daemon's
// logger is in use, are the daemon's JSON lines (they used to be raw
// text from go-redis's default logger, which broke logging.format: json).
func TestRedisLogFollowsTheDaemonsFormat(t *testing.T) {
	var early, out bytes.Buffer
	rl := NewRedisLog(&early)
	rl.Printf(context.Background(), "redis: failed to close connection: %v\n", "boom")
	if !strings.Contains(early.String(), "[WARN]") || !strings.Contains(early.String(), "boom") {
		t.Errorf("before Use: %q", early.String())
	}
	l, err := New(Options{Name: "scheduler", Level: "info", Format: "json", Output: &out})
	if err != nil {
		t.Fatal(err)
	}
	rl.Use(l.Named("redis"))
	rl.Printf(context.Background(), "sentinel: GetMasterAddrByName name=%q failed: %s", "mymaster", "i/o timeout")
	rl.Printf(context.Background(), "sentinel: new master=%q addr=%q", "mymaster", "10.0.0.2:6379")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", out.String())
	}
	for i, want := range []string{"warn", "info"} {
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &m); err != nil {
			t.Fatalf("line %d is not JSON: %q", i, lines[i])
		}
		if m["@level"] != want || m["@module"] != "scheduler.redis" || !strings.Contains(m["@message"].(string), "sentinel") {
			t.Errorf("line %d = %v", i, m)
		}
	}
}
