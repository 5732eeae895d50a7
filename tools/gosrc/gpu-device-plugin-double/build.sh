#!/usr/bin/env bash
# build.sh OUT_BINARY: build the GPU device plugin double in a throwaway wrapper module (no
# go.mod is kept in the checkout). RUN_TESTS=1 also runs gofmt -l, go vet and go test there
# (the tests mknod char devices: run them as root).
set -euo pipefail

KUBELET_MODULE_VERSION=v0.36.3 # k8s.io/kubelet, matching the kubelet v1.36.3 of the node tier
GRPC_VERSION=v1.79.3           # what k8s.io/kubelet v0.36.3 requires

[ $# -eq 1 ] || { echo "usage: $0 OUT_BINARY" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$1
case $out in /*) ;; *) out="$PWD/$out" ;; esac

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
d=$(mktemp -d "${TMPDIR:-/tmp}/gpu-device-plugin-double.XXXXXX")
trap 'rm -rf "$d"' EXIT

cp "$here"/*.go "$d/"
cd "$d"
go mod init dualsched.local/tools/gpu-device-plugin-double 2>/dev/null
go mod edit -go=1.26 \
  -require="k8s.io/kubelet@$KUBELET_MODULE_VERSION" \
  -require="google.golang.org/grpc@$GRPC_VERSION"
go mod tidy
go build -trimpath -ldflags "-s -w" -o "$out" .

if [ "${RUN_TESTS:-0}" = 1 ]; then
  unformatted=$(gofmt -l .)
  [ -z "$unformatted" ] || { echo "gofmt: not formatted: $unformatted" >&2; exit 1; }
  go vet .
  go test -count=1 -v .
fi
