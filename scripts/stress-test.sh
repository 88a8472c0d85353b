#!/usr/bin/env bash
# Runs `make test` repeatedly while CPU hogs load the machine, and reports
# each run's verdict and wall time. The suite must stay green on a busy
# machine: a failure here is a test that depends on the machine's speed.
#
#   scripts/stress-test.sh [-n RUNS] [-c HOGS] [-k LOGDIR]
#
#   -n RUNS   how many `make test` runs (default 3; env STRESS_RUNS)
#   -c HOGS   stress-ng --cpu workers kept busy alongside (default 2 = one
#             per core here; env STRESS_CPUS; 0 runs on a quiet machine)
#   -k LOGDIR keep each run's full output there (default: a temp dir,
#             printed at the end)
#
# Extra `make test` variables pass through the environment (e.g.
# PKGS=./scheduler/... or TEST_FLAGS='-count=1').
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${STRESS_RUNS:-3}
hogs=${STRESS_CPUS:-2}
logdir=""
while getopts "n:c:k:h" opt; do
  case "$opt" in
    n) runs=$OPTARG ;;
    c) hogs=$OPTARG ;;
    k) logdir=$OPTARG ;;
    h) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-n RUNS] [-c HOGS] [-k LOGDIR]" >&2; exit 2 ;;
  esac
done
case "$runs$hogs" in *[!0-9]*) echo "stress-test: -n and -c take whole numbers" >&2; exit 2 ;; esac
[ -n "$logdir" ] || logdir=$(mktemp -d -t cuesched-stress.XXXXXX)
mkdir -p "$logdir"

bash scripts/ensure-deps.sh stress

hog_pid=""
cleanup() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null && wait "$hog_pid" 2>/dev/null; true; }
trap cleanup EXIT INT TERM
if [ "$hogs" -gt 0 ]; then
  stress-ng --cpu "$hogs" --quiet --timeout 0 &
  hog_pid=$!
  echo "stress-test: stress-ng --cpu $hogs running (pid $hog_pid)"
fi

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
