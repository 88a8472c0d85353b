#!/usr/bin/env bash
# Runs `make test` repeatedly while CPU hogs load the machine, and reports
# each run's verdict and wall time. The suite must stay green on a busy
# machine: a failure here is a test that depends on the machine's speed.
#
#   scripts/stress-test.sh [-n RUNS] [-c HOGS] [-k LOGDIR]
#   scripts/stress-test.sh --seeds N|LIST [--scenario NAME]... [-c HOGS] [-k LOGDIR]
#
#   -n RUNS   how many `make test` runs (default 3; env STRESS_RUNS)
#   -c HOGS   stress-ng --cpu workers kept busy alongside (default 2 = one
#             per core here; env STRESS_CPUS; 0 runs on a quiet machine)
#   -k LOGDIR keep each run's full output there (default: a temp dir,
#             printed at the end)
#   --seeds N  instead of `make test`, run the fast simulator scenarios
#             (the nine `make test` runs, Fast in lab/sim/scenarios.go:
#             JOBCAP, LIMIT, LICENSE_DENIED, LICENSE, LICENSE_NO_HOSTS,
#             LIMIT_MIXED, DEPENDS, RETRIES, TAGS_GPU) once per seed, seeds
#             1..N (or a list: 3,8,10-12),
#             with -race as `make test` builds them, and report per seed.
#             Run it before landing a change to a scenario or to what it
#             drives. Every seed must PASS.
#   --scenario NAME  only this fast scenario (repeat, or NAME,NAME)
#
# Extra `make test` variables pass through the environment (e.g.
# PKGS=./scheduler/... or TEST_FLAGS='-count=1').
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

runs=${STRESS_RUNS:-3}
hogs=${STRESS_CPUS:-2}
logdir=""
seeds=""
scenarios=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs=${2:?-n takes a number}; shift 2 ;;
    -c) hogs=${2:?-c takes a number}; shift 2 ;;
    -k) logdir=${2:?-k takes a directory}; shift 2 ;;
    --seeds) seeds=${2:?--seeds takes N or a list like 1-20}; shift 2 ;;
    --seeds=*) seeds=${1#--seeds=}; shift ;;
    --scenario) scenarios+=("${2:?--scenario takes a name}"); shift 2 ;;
    --scenario=*) scenarios+=("${1#--scenario=}"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "stress-test: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$runs$hogs" in *[!0-9]*|"") echo "stress-test: -n and -c take whole numbers" >&2; exit 2 ;; esac
if [ -n "$seeds" ]; then
  case "$seeds" in
    *[!0-9,-]*) echo "stress-test: --seeds takes N (seeds 1..N) or a list like 1-20 or 3,8,10-12" >&2; exit 2 ;;
  esac
  case "$seeds" in *[,-]*) ;; *) [ "$seeds" -ge 1 ] || { echo "stress-test: --seeds N needs N >= 1" >&2; exit 2; }; seeds="1-$seeds" ;; esac
fi
if [ ${#scenarios[@]} -gt 0 ] && [ -z "$seeds" ]; then
  echo "stress-test: --scenario needs --seeds" >&2; exit 2
fi
[ -n "$logdir" ] || logdir=$(mktemp -d -t cuesched-stress.XXXXXX)
mkdir -p "$logdir"

bash scripts/ensure-deps.sh stress # PostgreSQL, Redis and stress-ng

hog_pid=""
cleanup() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null && wait "$hog_pid" 2>/dev/null; true; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
start_hogs() {
  if [ "$hogs" -gt 0 ]; then
    stress-ng --cpu "$hogs" --quiet --timeout 0 &
    hog_pid=$!
    echo "stress-test: stress-ng --cpu $hogs running (pid $hog_pid)"
  fi
}

# --- the fast scenarios, seed by seed -------------------------------------
if [ -n "$seeds" ]; then
  pkg=./lab/sim
  pattern='.*'
  if [ ${#scenarios[@]} -gt 0 ]; then
    pattern=$(IFS='|'; echo "${scenarios[*]}" | tr ',' '|' | tr '[:lower:]' '[:upper:]')
  fi
  # Expand the seed list (ranges) into seeds.
  list=()
  IFS=',' read -ra parts <<<"$seeds"
  for p in "${parts[@]}"; do
    case "$p" in
      *-*) lo=${p%-*}; hi=${p#*-}
           [ -n "$lo" ] && [ -n "$hi" ] && [ "$lo" -ge 1 ] && [ "$hi" -ge "$lo" ] ||
             { echo "stress-test: bad seed range $p" >&2; exit 2; }
           for s in $(seq "$lo" "$hi"); do list+=("$s"); done ;;
      "") ;;
      *) [ "$p" -ge 1 ] || { echo "stress-test: seeds start at 1" >&2; exit 2; }; list+=("$p") ;;
    esac
  done
  bin="$logdir/sim.test"
  echo "stress-test: building $pkg's tests with -race"
  go test -race -c -o "$bin" "$pkg"
  start_hogs
  failed=0 failed_seeds=() summary=()
  for seed in "${list[@]}"; do
    log="$logdir/seed-$seed.log"
    start=$(date +%s)
    rc=0
    (cd "$pkg" && CUESCHED_SIM_SEEDS=$seed "$bin" -test.v -test.count=1 -test.timeout 30m \
      -test.run "^TestFastScenarios\$/^seed=$seed\$/^($pattern)\$") >"$log" 2>&1 || rc=$?
    secs=$(( $(date +%s) - start ))
    passed=$(grep -oE -- "--- PASS: TestFastScenarios/seed=$seed/[A-Z_]+" "$log" | sed 's|.*/||' | tr '\n' ' ' || true)
    fails=$(grep -oE -- "--- FAIL: TestFastScenarios/seed=$seed/[A-Z_]+" "$log" | sed 's|.*/||' | tr '\n' ' ' || true)
    if [ "$rc" -eq 0 ] && [ -z "$fails" ] && [ -n "$passed" ]; then
      line=$(printf 'seed %d: PASS in %ds (%s)' "$seed" "$secs" "${passed% }")
    else
      failed=$((failed + 1)); failed_seeds+=("$seed")
      if [ -z "$passed$fails" ]; then
        if [ ${#scenarios[@]} -gt 0 ]; then
          fails="no scenario ran (rc=$rc; is ${scenarios[*]} a fast scenario?)"
        else
          fails="no scenario ran (rc=$rc)"
        fi
      fi
      line=$(printf 'seed %d: FAIL in %ds: %s' "$seed" "$secs" "${fails% }")
    fi
    summary+=("$line")
    echo "stress-test: $line"
    if [ "$rc" -ne 0 ]; then
      # The failed measurements (the scenario's own report line) or a panic.
      grep -E 'failed: |^panic:|^FAIL|timed out' "$log" | sed 's/^ *//' | head -10 || true
    fi
  done
  cleanup; hog_pid=""
  echo
  echo "stress-test: fast scenarios (${scenarios[*]:-all}) over ${#list[@]} seed(s) with $hogs CPU hog(s); logs in $logdir"
  printf '  %s\n' "${summary[@]}"
  if [ "$failed" -ne 0 ]; then
    echo "stress-test: $failed of ${#list[@]} seed(s) FAILED: ${failed_seeds[*]}" >&2
    exit 1
  fi
  echo "stress-test: ${#list[@]} of ${#list[@]} seed(s) PASS"
  exit 0
fi

# --- make test, RUNS times -------------------------------------------------
start_hogs
failed=0
summary=()
for i in $(seq 1 "$runs"); do
  log="$logdir/run-$i.log"
  echo "stress-test: run $i/$runs (log $log)"
  start=$(date +%s)
  if make test >"$log" 2>&1; then verdict=PASS; else verdict=FAIL; failed=$((failed + 1)); fi
  secs=$(( $(date +%s) - start ))
  line=$(printf 'run %d: %s in %dm%02ds' "$i" "$verdict" $((secs / 60)) $((secs % 60)))
  summary+=("$line")
  echo "stress-test: $line"
  if [ "$verdict" = FAIL ]; then
    grep -E '^(--- FAIL|FAIL|panic:)|_test\.go:[0-9]+:' "$log" | grep -vE '\[(INFO|DEBUG|TRACE)\]' | head -40 || true
  fi
done

echo
echo "stress-test: $runs run(s) of make test with $hogs CPU hog(s); logs in $logdir"
printf '  %s\n' "${summary[@]}"
[ "$failed" -eq 0 ] || { echo "stress-test: $failed of $runs run(s) FAILED" >&2; exit 1; }
