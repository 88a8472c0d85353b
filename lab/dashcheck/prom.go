package dashcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"
)

// prometheus is a Prometheus server this package started: its own
// configuration, TSDB and log in a temp dir, on a free loopback port.
type prometheus struct {
	cmd     *exec.Cmd
	dir     string
	cfgPath string
	url     string
	client  *http.Client
	exited  chan struct{}
	waitErr error
}

// startPrometheus runs bin with cfg in a new temp dir and waits until it
// answers /-/ready.
func startPrometheus(ctx context.Context, bin, cfg string) (*prometheus, error) {
	dir, err := os.MkdirTemp("", "cuesched-dashcheck-")
	if err != nil {
		return nil, err
	}
	p := &prometheus{dir: dir, cfgPath: filepath.Join(dir, "prometheus.yml"), client: &http.Client{Timeout: 30 * time.Second},
		exited: make(chan struct{})}
	if err := os.WriteFile(p.cfgPath, []byte(cfg), 0o644); err != nil {
		p.cleanup()
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		p.cleanup()
		return nil, err
	}
	defer logf.Close()
	// Prometheus binds a free port itself (no race with another process
	// over a port picked beforehand) and logs the address it got.
	p.cmd = exec.Command(bin,
		"--config.file="+p.cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:0",
		"--web.enable-lifecycle",
		"--log.level=info")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.cleanup()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p.url == "" {
			log, _ := os.ReadFile(filepath.Join(p.dir, "prometheus.log"))
			if m := listeningRE.FindSubmatch(log); m != nil {
				p.url = "http://" + string(m[1])
			}
		}
		if p.url != "" {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/-/ready", nil)
			resp, err := p.client.Do(req)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return p, nil
				}
			}
		}
		select {
		case <-p.exited:
			log := p.logTail()
			p.cleanup()
			return nil, fmt.Errorf("prometheus exited (%v); its log:\n%s", p.waitErr, log)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log := p.logTail()
			p.stop()
			return nil, fmt.Errorf("prometheus not ready after 60 s; its log:\n%s", log)
		}
	}
}

// listeningRE finds the address in Prometheus's "Listening on" log line
// (logfmt in 2.x: msg="Listening on" address=127.0.0.1:41234).
var listeningRE = regexp.MustCompile(`msg="Listening on" address=\[?(127\.0\.0\.1:[0-9]+)\]?`)

func (p *prometheus) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "prometheus.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// reload writes cfg and has Prometheus reload it.
func (p *prometheus) reload(ctx context.Context, cfg string) error {
	if err := os.WriteFile(p.cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/-/reload", nil)
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("prometheus reload: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("prometheus reload: %s: %s", resp.Status, b)
	}
	return nil
}

func (p *prometheus) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	p.cleanup()
}

func (p *prometheus) cleanup() { _ = os.RemoveAll(p.dir) }

type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// get calls the HTTP API and returns its data (an API error as error).
func (p *prometheus) get(ctx context.Context, path string, params url.Values) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// rangeResult is what a range query returned: series count, and how many
// of them have at least one number (not NaN).
type rangeResult struct {
	Series, WithNumbers int
	// Max is the largest number seen (instant queries only).
	Max float64
}

// queryRange evaluates expr over [start, end] at step.
func (p *prometheus) queryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) (rangeResult, error) {
	data, err := p.get(ctx, "/api/v1/query_range", url.Values{
		"query": {expr},
		"start": {strconv.FormatInt(start.Unix(), 10)},
		"end":   {strconv.FormatInt(end.Unix(), 10)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	})
	if err != nil {
		return rangeResult{}, err
	}
	var d struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Values [][2]any `json:"values"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return rangeResult{}, err
	}
	var r rangeResult
	for _, s := range d.Result {
		r.Series++
		for _, v := range s.Values {
			str, _ := v[1].(string)
			f, err := strconv.ParseFloat(str, 64)
			if err == nil && !math.IsNaN(f) {
				r.WithNumbers++
				break
			}
		}
	}
	return r, nil
}

// queryInstant evaluates expr at t.
func (p *prometheus) queryInstant(ctx context.Context, expr string, t time.Time) (rangeResult, error) {
	data, err := p.get(ctx, "/api/v1/query", url.Values{
		"query": {expr},
		"time":  {strconv.FormatInt(t.Unix(), 10)},
	})
	if err != nil {
		return rangeResult{}, err
	}
	var d struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return rangeResult{}, err
	}
	var r rangeResult
	for _, s := range d.Result {
		r.Series++
		str, _ := s.Value[1].(string)
		if f, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(f) {
			if r.WithNumbers == 0 || f > r.Max {
				r.Max = f
			}
			r.WithNumbers++
		}
	}
	return r, nil
}

type scrapeTarget struct {
	Job    string `json:"scrapePool"`
	URL    string `json:"scrapeUrl"`
	Health string `json:"health"`
	Error  string `json:"lastError"`
}

func (p *prometheus) targets(ctx context.Context) ([]scrapeTarget, error) {
	data, err := p.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}})
	if err != nil {
		return nil, err
	}
	var d struct {
		Active []scrapeTarget `json:"activeTargets"`
	}
	err = json.Unmarshal(data, &d)
	return d.Active, err
}

type rule struct {
	Name      string `json:"name"`
	Type      string `json:"type"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"`
}

func (p *prometheus) rules(ctx context.Context) ([]rule, error) {
	data, err := p.get(ctx, "/api/v1/rules", url.Values{})
	if err != nil {
		return nil, err
	}
	var d struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	var out []rule
	for _, g := range d.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// waitTargetsUp waits until every active target has been scraped healthy.
func (p *prometheus) waitTargetsUp(ctx context.Context, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ts, err := p.targets(ctx)
		up := 0
		for _, t := range ts {
			if t.Health == "up" {
				up++
			}
		}
		if err == nil && up >= want {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%d of %d targets up: %+v", up, want, ts)
			}
			return fmt.Errorf("prometheus targets not up after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.exited:
			return errors.New("prometheus exited: " + p.logTail())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
