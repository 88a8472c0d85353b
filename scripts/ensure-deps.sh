#!/usr/bin/env bash
# Makes sure the servers the tests and the demo start are installed:
# PostgreSQL (server binaries, for initdb/postgres), redis-server, protoc,
# prometheus and promtool (package prometheus: the metric-name lint test and
# make dashboard-check, which runs a real Prometheus).
# `ensure-deps.sh stress` also makes sure stress-ng is there (make stress).
# As root it installs what is missing with apt-get; otherwise it prints the
# exact command and fails.
set -euo pipefail

missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if ! ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1 && ! command -v pgbench >/dev/null 2>&1; then
  missing+=(postgresql-contrib)
fi
for extra in "$@"; do
  case "$extra" in
    stress) command -v stress-ng >/dev/null 2>&1 || missing+=(stress-ng) ;;
    *) echo "ensure-deps.sh: unknown extra '$extra' (known: stress)" >&2; exit 2 ;;
  esac
done
# Deduplicate.
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing missing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Do not let package scripts start system services (the harness starts its own).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
