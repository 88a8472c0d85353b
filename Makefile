# cuesched — the two commands are `make demo` and `make test`.
# Each installs what it needs (Debian packages, as root) and starts its own
# PostgreSQL and Redis; nothing has to be running beforehand.

GO        ?= go
PKGS      ?= ./...
# RACE is the race detector's flag (empty turns it off everywhere). Vet and
# staticcheck build with it too, so their compiled packages are the ones
# the tests link: on a cold machine that saves about a third of the build.
RACE      ?= -race
# -p 4: most test binaries wait on farms (Postgres, Redis, timers) more
# than they compute, so four run at once on 2 cores (the suite must pass
# on a loaded machine anyway: make stress).
TEST_FLAGS ?= $(RACE) -count=1 -p 4 -timeout 20m
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
REVISION  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -X main.version=$(VERSION) -X main.revision=$(REVISION)

.PHONY: all deps build test stress demo bench verify dashboard-check scale faults lint proto clean

all: build

deps:
	@bash scripts/ensure-deps.sh

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/cuesched ./cmd/cuesched
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/cuesched-lab ./cmd/cuesched-lab

test: deps lint
	$(GO) test $(TEST_FLAGS) $(PKGS)

# `make test` STRESS_RUNS times while STRESS_CPUS stress-ng CPU hogs run
# alongside: the suite must stay green on a busy machine. With
# STRESS_SEEDS=20 it runs the fast simulator scenarios over seeds 1..20
# instead, one verdict per seed (scripts/stress-test.sh --seeds).
STRESS_RUNS ?= 3
STRESS_CPUS ?= 2
STRESS_SEEDS ?=
stress:
	STRESS_RUNS=$(STRESS_RUNS) STRESS_CPUS=$(STRESS_CPUS) bash scripts/stress-test.sh $(if $(STRESS_SEEDS),--seeds $(STRESS_SEEDS))

demo: deps build
	./bin/cuesched-lab demo $(DEMO_FLAGS)

bench: deps build
	$(GO) run ./bench/cmd/report

# The verify battery: every `cuesched-lab sim` scenario (and its comparison
# variants) against an embedded farm; writes verify/report.md, report.json
# and the fill charts, and fails if any judged scenario fails.
# VERIFY_FLAGS passes more flags (e.g. --seed 7 --scale 2).
# Then the dashboard check (below).
verify: deps build
	./bin/cuesched-lab sim --scenario all --out verify $(VERIFY_FLAGS)
	./bin/cuesched-lab dashboard-check $(DASHCHECK_FLAGS)

# Is the dashboard true? A real Prometheus (Debian package prometheus; temp
# dir, free port) scrapes an embedded farm (real scheduler and sidecar, fake
# RQD, Cuebot emulator) for a minute or more (until every expression has
# data, at most 4 min); every panel target of
# docs/grafana/*.json and every rule of docs/prometheus is evaluated over
# the run, and any expression that errors or returns no data fails it (all
# listed), as do `promtool check metrics` on both daemons and `promtool
# check/test rules`. Ends with the panel coverage. The parse-only part
# (every expression parses; every metric is in the operator guide) runs in
# `make test` (lab/dashcheck).
dashboard-check: deps build
	./bin/cuesched-lab dashboard-check $(DASHCHECK_FLAGS)

# Issue #28's SCALE scenario (not in `make verify`'s "all", nor in make
# test): 10,000 hosts, 1,000,000 waiting frames, 1 scheduler, beside a
# 1/10 farm and 2 and 3 schedulers; writes scale/report.md and report.json.
# SCALE_FLAGS sizes it, e.g. the short version:
#   make scale SCALE_FLAGS='--hosts 1000 --frames 50000'
SCALE_FLAGS ?=
scale: deps build
	./bin/cuesched-lab sim --scenario SCALE --scheduler-bin bin/cuesched --out scale $(SCALE_FLAGS)

# The full fault and bad-input suite (lab/faults): every fault
# randomized and repeated, the chaos run, and every bad-input case. Its fast
# part runs in `make test`. FAULTS_FLAGS=-v prints every run's timeline.
faults: deps
	CUESCHED_FAULTS=full $(GO) test -race -count=1 -timeout 60m $(FAULTS_FLAGS) ./lab/faults/

# gofmt, go vet and staticcheck (a pinned release, installed from the Go
# module proxy by scripts/staticcheck.sh). `make test` runs it first.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(RACE) $(PKGS)
	STATICCHECK_GOFLAGS='$(RACE)' bash scripts/staticcheck.sh $(PKGS)

proto:
	bash proto/generate.sh

clean:
	rm -rf bin
