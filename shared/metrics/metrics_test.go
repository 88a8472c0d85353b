package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	reg := NewRegistry(Build{Version: "v1", Revision: "abc"})
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "scheduler_frames_dispatched_total", Help: "x"})
	reg.MustRegister(c)
	c.Add(3)
	h := NewHealth()
	srv, err := Serve("127.0.0.1:0", reg, h, hclog.NewNullLogger(), ServeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	base := "http://" + srv.Addr()

	code, body := get(t, base+"/metrics")
	if code != 200 || !strings.Contains(body, "scheduler_frames_dispatched_total 3") ||
		!strings.Contains(body, `cuesched_build_info{revision="abc",version="v1"} 1`) || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics: %d %s", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz with no checks %d", code)
	}
	var redisErr error = errors.New("redis empty, re-bootstrapping")
	h.SetCheck("accounting", func() error { return redisErr })
	code, body = get(t, base+"/readyz")
	if code != 503 || !strings.Contains(body, "accounting: redis empty, re-bootstrapping") {
		t.Fatalf("readyz: %d %q", code, body)
	}
	h.SetCheck("accounting", func() error { return nil })
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz after recovery %d", code)
	}
}
