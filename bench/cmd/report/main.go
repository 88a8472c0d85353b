// Command report runs every benchmark in the module (or reads saved
// `go test -bench` output with -in) and writes bench/report.md,
// bench/report.json and one PNG chart per benchmark family.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/cuesched/cuesched/bench"
)

func main() {
	out := flag.String("out", "bench", "directory for report.md, report.json and the charts")
	in := flag.String("in", "", "read saved `go test -bench` output instead of running the benchmarks")
	pkgs := flag.String("pkgs", "./...", "packages to benchmark")
	run := flag.String("bench", ".", "benchmark regexp")
	benchtime := flag.String("benchtime", "", "passed to go test -benchtime when set")
	flag.Parse()
	if err := mainErr(*out, *in, *pkgs, *run, *benchtime); err != nil {
		fmt.Fprintln(os.Stderr, "bench report:", err)
		os.Exit(1)
	}
}

func mainErr(outDir, in, pkgs, run, benchtime string) error {
	started := time.Now()
	var raw []byte
	var runErr error
	if in != "" {
		b, err := os.ReadFile(in)
		if err != nil {
			return err
		}
		raw = b
	} else {
		// -p 1: one package's benchmarks at a time. go test otherwise
		// runs as many test binaries at once as there are CPUs, and a
		// benchmark and its same-run baseline would each share the machine
		// with whatever other package happened to be running.
		args := []string{"test", "-p", "1", "-run", "^$", "-bench", run, "-timeout", "60m"}
		if benchtime != "" {
			args = append(args, "-benchtime", benchtime)
		}
		args = append(args, strings.Fields(pkgs)...)
		cmd := exec.Command("go", args...)
		var buf bytes.Buffer
		cmd.Stdout = io.MultiWriter(&buf, os.Stdout)
		cmd.Stderr = io.MultiWriter(&buf, os.Stderr)
		fmt.Fprintln(os.Stderr, "running: go", strings.Join(args, " "))
		runErr = cmd.Run()
		raw = buf.Bytes()
	}
	rep, err := bench.Parse(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	rep.Started = started
	rep.Duration = time.Since(started).Round(time.Second).String()
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "raw.txt"), raw, 0o644); err != nil {
		return err
	}
	charts := map[string]string{}
	unsafe := regexp.MustCompile(`[^a-zA-Z0-9_-]+`)
	for _, fam := range rep.Families() {
		name := "chart-" + unsafe.ReplaceAllString(strings.TrimPrefix(fam[0].Package, "github.com/cuesched/cuesched/")+"-"+fam[0].Family, "_") + ".png"
		f, err := os.Create(filepath.Join(outDir, name))
		if err != nil {
			return err
		}
		err = bench.Chart(f, fam)
		f.Close()
		if err != nil {
			return err
		}
		charts[fam[0].Package+" "+fam[0].Family] = name
		if !bench.Growth(fam) {
			continue
		}
		gname := strings.TrimSuffix(name, ".png") + "-growth.png"
		g, err := os.Create(filepath.Join(outDir, gname))
		if err != nil {
			return err
		}
		err = bench.GrowthChart(g, fam)
		g.Close()
		if err != nil {
			return err
		}
		charts[fam[0].Package+" "+fam[0].Family+" growth"] = gname
	}
	jf, err := os.Create(filepath.Join(outDir, "report.json"))
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(jf); err != nil {
		jf.Close()
		return err
	}
	jf.Close()
	mf, err := os.Create(filepath.Join(outDir, "report.md"))
	if err != nil {
		return err
	}
	if err := rep.WriteMarkdown(mf, charts); err != nil {
		mf.Close()
		return err
	}
	mf.Close()
	fmt.Fprintf(os.Stderr, "wrote %s (%d results, %d charts)\n", filepath.Join(outDir, "report.md"), len(rep.Results), len(charts))
	if runErr != nil || len(rep.Failures) > 0 {
		return fmt.Errorf("some benchmarks failed (see %s): %v", filepath.Join(outDir, "report.md"), runErr)
	}
	return nil
}
