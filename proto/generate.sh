#!/usr/bin/env bash
# Regenerates the Go code for the protocol definitions in proto/*.proto.
#
# Output goes to proto/<package>pb/ (chosen by each file's go_package option)
# and is committed, so building cuesched never needs protoc. Run this after
# editing a .proto file:  bash proto/generate.sh   (or: make proto)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

module="github.com/cuesched/cuesched"
gobin="$(go env GOBIN 2>/dev/null || true)"
[[ -n "$gobin" ]] || gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
export PATH="$gobin:$PATH"

missing=0
need() {
  local tool="$1" hint="$2"
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "generate.sh: '$tool' not found on PATH (also looked in $gobin)." >&2
    echo "  install it with: $hint" >&2
    missing=1
  fi
}
need protoc "apt-get install -y protobuf-compiler   (or a release from https://github.com/protocolbuffers/protobuf/releases)"
need protoc-gen-go "go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12"
need protoc-gen-go-grpc "go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2   (the version the committed code was generated with; @latest also works)"
if [[ "$missing" -ne 0 ]]; then
  exit 1
fi

# The include root is the repository root, so files import each other as
# "proto/<name>.proto" and register under that path in the Go registry.
mapfile -t protos < <(find proto -maxdepth 1 -name '*.proto' | LC_ALL=C sort)
if [[ "${#protos[@]}" -eq 0 ]]; then
  echo "generate.sh: no .proto files under proto/" >&2
  exit 1
fi

# Drop previous output so that code for a deleted or renamed file disappears.
find proto -mindepth 2 -path 'proto/*pb/*' \( -name '*.pb.go' \) -delete

protoc \
  -I . \
  --go_out=. --go_opt="module=$module" \
  --go-grpc_out=. --go-grpc_opt="module=$module" \
  "${protos[@]}"

echo "generate.sh: generated Go code for ${protos[*]} with $(protoc --version)," \
  "$(protoc-gen-go --version 2>&1 | head -n1), $(protoc-gen-go-grpc --version 2>&1 | head -n1)"
