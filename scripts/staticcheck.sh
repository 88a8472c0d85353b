#!/usr/bin/env bash
# Runs staticcheck at a pinned release on the given packages (default ./...),
# installing it from the Go module proxy into $(go env GOPATH)/bin first if
# that version is not there yet. STATICCHECK_GOFLAGS (e.g. -race) is added to
# GOFLAGS for the check only, not for the install: with the tests' build
# flags, the packages it compiles to load them are the tests' own, already in
# (or left in) the build cache.
set -euo pipefail
cd "$(dirname "$0")/.."
# honnef.co/go/tools v0.8.2 is staticcheck 2026.1.2.
version=v0.8.2
bin="$(go env GOPATH)/bin/staticcheck"
if ! [ -x "$bin" ] || ! "$bin" -version 2>/dev/null | grep -qF "(${version#v})"; then
  echo "installing staticcheck $version" >&2
  go install "honnef.co/go/tools/cmd/staticcheck@$version"
fi
if [ $# -eq 0 ]; then set -- ./...; fi
if [ -n "${STATICCHECK_GOFLAGS:-}" ]; then
  export GOFLAGS="${GOFLAGS:+$GOFLAGS }$STATICCHECK_GOFLAGS"
fi
exec "$bin" "$@"
