#!/usr/bin/env bash
# Build the dualsched toolchain (Pulumi CLI + Python language host + provider plugins,
# Kubernetes control plane, etcd, KWOK) from Go modules, with pinned versions
# (tools/versions.env), into a cache outside the checkout:
#
#   ${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}/<tool>-<version>/bin/<binary>
#
# Idempotent: a tool whose binary is already in the cache is skipped; a binary already
# on PATH with the pinned version is reused (symlinked into the cache) instead of built.
# Ends by writing $CACHE/env.sh (puts every tool bin dir on PATH) and installing the
# provider plugins into the Pulumi plugin cache (see tools/pulumi-env.sh).
#
# Usage: tools/build-tools.sh [--list] [TOOL...]
#   TOOL is one of: kube-apiserver pulumi kube-controller-manager kube-scheduler
#                   pulumi-resource-kubernetes etcd kwok pulumi-language-python
#                   pulumi-resource-random kubectl kubelet kube-proxy coredns
#                   gpu-device-plugin-double kube-router pulumi-language-yaml   (default: all)
# Env: DUALSCHED_TOOLS_CACHE, GOMODCACHE/GOCACHE (shared, default go env),
#      DUALSCHED_TOOLS_FORCE=1 (rebuild even if cached), GOTOOLCHAIN (default: local),
#      DUALSCHED_TOOLS_JOBS=2 (parallel lanes: A = Kubernetes, etcd, KWOK, CoreDNS, kube-router and the
#      small tools, B = Pulumi and its providers; 1 = sequential).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
SRC="$CACHE/src"
LOGS="$CACHE/logs"
mkdir -p "$SRC" "$LOGS"

command -v go >/dev/null || { echo "[tools] ERROR: go not found on PATH" >&2; exit 1; }
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOMODCACHE="${GOMODCACHE:-$(go env GOMODCACHE)}"
export GOCACHE="${GOCACHE:-$(go env GOCACHE)}"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
FORCE="${DUALSCHED_TOOLS_FORCE:-0}"

ALL_TOOLS=(kube-apiserver pulumi kube-controller-manager kube-scheduler pulumi-resource-kubernetes
           etcd kwok pulumi-language-python pulumi-resource-random kubectl kubelet kube-proxy coredns
           gpu-device-plugin-double kube-router pulumi-language-yaml)

log() { echo "[tools] $*"; }
die() { echo "[tools] ERROR: $*" >&2; exit 1; }

tool_version() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet|kube-proxy) echo "$KUBERNETES_VERSION" ;;
    coredns) echo "$COREDNS_VERSION" ;;
    kube-router) echo "$KUBE_ROUTER_VERSION" ;;
    gpu-device-plugin-double) echo "$GPU_DEVICE_PLUGIN_DOUBLE_VERSION" ;;
    pulumi) echo "$PULUMI_VERSION" ;;
    pulumi-language-python) echo "$PULUMI_LANGHOST_VERSION" ;;
    pulumi-language-yaml) echo "$PULUMI_YAML_VERSION" ;;
    pulumi-resource-kubernetes) echo "v$PULUMI_K8S_PROVIDER_VERSION" ;;
    pulumi-resource-random) echo "v$PULUMI_RANDOM_PROVIDER_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    *) die "unknown tool $1" ;;
  esac
}
tool_bindir() { echo "$CACHE/$1-$(tool_version "$1")/bin"; }

# Prints the version a binary reports (normalised to vX.Y.Z), or nothing.
probe_version() {
  local tool=$1 bin=$2 out=""
  case "$tool" in
    pulumi) out=$("$bin" version 2>/dev/null) ;;
    kube-*|kubelet) out=$("$bin" --version 2>/dev/null | awk '{print $2}') ;;
    kubectl) out=$("$bin" version --client 2>/dev/null | awk '/Client Version/{print $3}') ;;
    etcd) out=$("$bin" --version 2>/dev/null | awk '/etcd Version/{print "v"$3}') ;;
    kwok) out=$("$bin" --version 2>/dev/null | grep -o 'v\?[0-9]\+\.[0-9]\+\.[0-9]\+' | head -1) ;;
    kube-router) out=$("$bin" --version 2>/dev/null | grep -o 'v[0-9]\+\.[0-9]\+\.[0-9]\+' | head -1) ;;
    *) out="" ;;   # plugins/langhost: never reuse an unknown binary from PATH
  esac
  out=${out#v}; [ -n "$out" ] && echo "v$out"
}

# Reuse a binary already on PATH (outside our cache) if it reports the pinned version.
reuse_from_path() {
  local tool=$1 ver bin dir
  ver=$(tool_version "$tool"); dir=$(tool_bindir "$tool")
  bin=$(command -v "$tool" 2>/dev/null) || return 1
  case "$bin" in "$CACHE"/*) return 1 ;; esac
  [ "$(probe_version "$tool" "$bin")" = "$ver" ] || return 1
  mkdir -p "$dir"; ln -sf "$bin" "$dir/$tool"
  log "reusing $tool $ver from PATH ($bin)"
}

gomod_dir() { go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }
gomod_file() { go mod download -json "$1" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p'; }

# Fresh wrapper module dir: new_wrapper NAME GOVERSION -> prints dir
new_wrapper() {
  local d="$SRC/$1"
  rm -rf "$d"; mkdir -p "$d"
  printf 'module dualsched.local/tools/%s\n\ngo %s\n' "$1" "$2" >"$d/go.mod"
  echo "$d"
}

# ---------------------------------------------------------------- Kubernetes
k8s_wrapper() {
  local v=$KUBERNETES_VERSION d
  d="$SRC/kubernetes-$v"
  if [ -f "$d/.ready" ] && [ "$FORCE" != 1 ]; then echo "$d"; return; fi
  d=$(new_wrapper "kubernetes-$v" 1.26.0)
  local modfile staging_ver
  modfile=$(gomod_file "k8s.io/kubernetes@$v")
  staging_ver="v0.${v#v1.}"
  (
    cd "$d"
    echo 'godebug default=go1.26' >>go.mod
    # every k8s.io staging module is required at v0.0.0 and replaced by a local path upstream:
    # replace each one with its published version.
    for m in $(awk '$2=="v0.0.0"{print $1}' "$modfile" | grep '^k8s.io/'); do
      go mod edit -replace="$m=$m@$staging_ver"
    done
    go mod edit -require="k8s.io/kubernetes@$v"
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$v" "k8s.io/kubernetes/cmd/kube-controller-manager@$v" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$v" "k8s.io/kubernetes/cmd/kubectl@$v" \
      "k8s.io/kubernetes/cmd/kubelet@$v" "k8s.io/kubernetes/cmd/kube-proxy@$v" >&2
  ) || return 1
  touch "$d/.ready"; echo "$d"
}

build_k8s() {
  local tool=$1 v=$KUBERNETES_VERSION d out minor
  d=$(k8s_wrapper) || return 1
  minor=${v#v1.}; minor=${minor%%.*}
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$now -X $p.gitCommit=0000000000000000000000000000000000000000"
  done
  out=$(tool_bindir "$tool"); mkdir -p "$out"
  (cd "$d" && go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$out/$tool" "k8s.io/kubernetes/cmd/$tool")
}

# ---------------------------------------------------------------- Pulumi CLI
build_pulumi() {
  local v=$PULUMI_VERSION d out
  d=$(new_wrapper "pulumi-$v" 1.26.6)
  out=$(tool_bindir pulumi); mkdir -p "$out"
  (
    cd "$d"
    # pkg/go.mod replaces sdk/v3 => ../sdk (use the published one) and clipboard; sdk/go.mod pins x/text.
    go mod edit -replace=github.com/atotto/clipboard=github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e
    local sdkmod; sdkmod=$(gomod_file "github.com/pulumi/pulumi/sdk/v3@$v")
    local xt; xt=$(awk '/^replace golang.org\/x\/text =>/{print $5}' "$sdkmod")
    [ -n "$xt" ] && go mod edit -replace="golang.org/x/text=golang.org/x/text@$xt"
    go mod edit -require="github.com/pulumi/pulumi/sdk/v3@$v" -require="github.com/pulumi/pulumi/pkg/v3@$v"
    go get -tool "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@$v"
    go build -trimpath -tags osusergo,grpcnotrace \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v" \
      -o "$out/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  )
}

# ------------------------------------------------ Python language host (own main)
build_pulumi-language-python() {
  local v=$PULUMI_LANGHOST_VERSION d out sdkdir
  d=$(new_wrapper "pulumi-language-python-$v" 1.26.6)
  out=$(tool_bindir pulumi-language-python); mkdir -p "$out"
  cp "$HERE"/gosrc/pulumi-language-python/*.go "$d/"
  (
    cd "$d"
    local sdkmod; sdkmod=$(gomod_file "github.com/pulumi/pulumi/sdk/v3@$v")
    local xt; xt=$(awk '/^replace golang.org\/x\/text =>/{print $5}' "$sdkmod")
    [ -n "$xt" ] && go mod edit -replace="golang.org/x/text=golang.org/x/text@$xt"
    go mod edit -require="github.com/pulumi/pulumi/sdk/v3@$v"
    go mod tidy
    go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$out/pulumi-language-python" .
  ) || return 1
  sdkdir=$(gomod_dir "github.com/pulumi/pulumi/sdk/v3@$v")
  # module cache files are read-only and not executable: install -m755
  install -m755 "$sdkdir/python/cmd/pulumi-language-python-exec" "$out/pulumi-language-python-exec"
  local f
  for f in "$sdkdir/python/dist/pulumi-resource-pulumi-python" "$sdkdir/python/cmd/pulumi-resource-pulumi-python"; do
    [ -f "$f" ] && { install -m755 "$f" "$out/pulumi-resource-pulumi-python"; break; }
  done
  [ -x "$out/pulumi-resource-pulumi-python" ]
}

# ------------------------------------------------ YAML language host (upstream main)
# github.com/pulumi/pulumi-yaml has no replaces. It is built against the pkg/v3 and sdk/v3 its own go.mod
# names (v1.25.0: v3.206.0, served by the proxy): pkg/v3 v3.274.0 changed APIs it calls
# (schema.NewPluginLoader, plugin.NewContextWithRoot), and the language host gRPC protocol between it
# and the v3.274.0 CLI is stable. pkg/v3 needs the CLI's clipboard replace and sdk/v3's x/text one.
build_pulumi-language-yaml() {
  local v=$PULUMI_YAML_VERSION d out sdkv
  d=$(new_wrapper "pulumi-language-yaml-$v" 1.26.6)
  out=$(tool_bindir pulumi-language-yaml); mkdir -p "$out"
  (
    cd "$d"
    sdkv=$(awk '$1=="github.com/pulumi/pulumi/sdk/v3"{print $2; exit}' "$(gomod_file "github.com/pulumi/pulumi-yaml@$v")")
    [ -n "$sdkv" ] || exit 1
    go mod edit -replace=github.com/atotto/clipboard=github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e
    local xt; xt=$(awk '/^replace golang.org\/x\/text =>/{print $5}' "$(gomod_file "github.com/pulumi/pulumi/sdk/v3@$sdkv")")
    [ -n "$xt" ] && go mod edit -replace="golang.org/x/text=golang.org/x/text@$xt"
    go mod edit -require="github.com/pulumi/pulumi-yaml@$v"
    go get -tool "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml@$v"
    go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=$v" \
      -o "$out/pulumi-language-yaml" github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
  )
}

# ------------------------------------------------ Kubernetes provider (own main)
build_pulumi-resource-kubernetes() {
  local mv=$PULUMI_K8S_PROVIDER_MODULE_VERSION v=$PULUMI_K8S_PROVIDER_VERSION d out moddir sdkv4 ver
  d=$(new_wrapper "pulumi-kubernetes-$v" 1.26.0)
  out=$(tool_bindir pulumi-resource-kubernetes); mkdir -p "$out"
  moddir=$(gomod_dir "github.com/pulumi/pulumi-kubernetes/provider/v4@$mv")
  [ -n "$moddir" ] || return 1
  # upstream main embeds generated files (schema-embed.json, terraform-mapping-embed.json):
  # generate the same from the module's schema.json / terraform-mapping.json.
  python3 - "$moddir/cmd/pulumi-resource-kubernetes" "$d" "$v" <<'PY'
import json, sys
src, dst, ver = sys.argv[1:4]
spec = json.load(open(f"{src}/schema.json"))
spec["version"] = ver
json.dump(spec, open(f"{dst}/schema-embed.json", "w"), separators=(",", ":"))
json.dump(json.load(open(f"{src}/terraform-mapping.json")), open(f"{dst}/terraform-mapping-embed.json", "w"), separators=(",", ":"))
PY
  cat >"$d/main.go" <<'GO'
// Minimal main for pulumi-resource-kubernetes (upstream's main embeds git-ignored generated files).
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var pulumiSchema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}
GO
  (
    cd "$d"
    # provider/go.mod replaces sdk/v4 => ../sdk: require the published sdk/v4 it names instead.
    sdkv4=$(awk '$1=="github.com/pulumi/pulumi-kubernetes/sdk/v4" && $2 ~ /^v/{print $2; exit}' "$moddir/go.mod")
    # copy the other (non-local) replaces of provider/go.mod
    awk '/^replace/ && $0 !~ /=> \.\.?\//' "$moddir/go.mod" | while read -r _ from _arrow to tov; do
      [ -n "$tov" ] && go mod edit -replace="$from=$to@$tov"
    done
    go mod edit -require="github.com/pulumi/pulumi-kubernetes/provider/v4@$mv" \
      -require="github.com/pulumi/pulumi-kubernetes/sdk/v4@$sdkv4"
    go mod tidy
    go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$v" \
      -o "$out/pulumi-resource-kubernetes" .
  )
}

# ------------------------------------------------ Random provider (own implementation)
build_pulumi-resource-random() {
  local v=$PULUMI_RANDOM_PROVIDER_VERSION d out
  d=$(new_wrapper "pulumi-random-$v" 1.26.6)
  out=$(tool_bindir pulumi-resource-random); mkdir -p "$out"
  cp "$HERE"/gosrc/pulumi-resource-random/*.go "$d/"
  (
    cd "$d"
    local sdkmod; sdkmod=$(gomod_file "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION")
    local xt; xt=$(awk '/^replace golang.org\/x\/text =>/{print $5}' "$sdkmod")
    [ -n "$xt" ] && go mod edit -replace="golang.org/x/text=golang.org/x/text@$xt"
    go mod edit -require="github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION"
    go mod tidy
    go build -trimpath -ldflags "-s -w -X main.version=$v" -o "$out/pulumi-resource-random" .
  )
}

# ---------------------------------------------------------------- etcd
build_etcd() {
  local v=$ETCD_VERSION d out
  d=$(new_wrapper "etcd-$v" 1.26.0)
  out=$(tool_bindir etcd); mkdir -p "$out"
  (
    cd "$d"
    # server/go.mod replaces its sibling modules with ../api etc.; all are published at $v.
    go get -tool "go.etcd.io/etcd/server/v3@$v"
    go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
  )
}

# ------------------------------------------------ CoreDNS (own main: only the plugins a cluster DNS needs)
build_coredns() {
  local v=$COREDNS_VERSION d out
  d=$(new_wrapper "coredns-$v" 1.26.0)
  out=$(tool_bindir coredns); mkdir -p "$out"
  cp "$HERE"/gosrc/coredns/*.go "$d/"
  (
    cd "$d"
    go mod edit -require="github.com/coredns/coredns@$v"
    go mod tidy
    go build -trimpath -ldflags "-s -w" -o "$out/coredns" .
  )
}

# ------------------------------------------------ kube-router (the real node's NetworkPolicy enforcer)
build_kube-router() {
  local v=$KUBE_ROUTER_VERSION d out
  d=$(new_wrapper "kube-router-$v" 1.26.0)
  out=$(tool_bindir kube-router); mkdir -p "$out"
  (
    cd "$d"
    go get -tool "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$v"
    go build -trimpath -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$v" \
      -o "$out/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
  )
}

# ------------------------------------------------ GPU device plugin double (own sources)
build_gpu-device-plugin-double() {
  local out; out=$(tool_bindir gpu-device-plugin-double); mkdir -p "$out"
  bash "$HERE/gosrc/gpu-device-plugin-double/build.sh" "$out/gpu-device-plugin-double"
}

# ---------------------------------------------------------------- KWOK
build_kwok() {
  local v=$KWOK_VERSION d out
  d=$(new_wrapper "kwok-$v" 1.26.0)
  out=$(tool_bindir kwok); mkdir -p "$out"
  (
    cd "$d"
    go get -tool "sigs.k8s.io/kwok/cmd/kwok@$v"
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok
  )
}

build_one() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet|kube-proxy) build_k8s "$1" ;;
    *) "build_$1" ;;
  esac
}

# ---------------------------------------------------------------- env.sh / plugins
write_env() {
  # Pulumi CLI (with the language host linked next to it) + control-plane tools. The provider
  # plugin dirs are deliberately NOT on PATH: tools/pulumi-env.sh installs them into the Pulumi
  # plugin cache at exact versions and sets PULUMI_IGNORE_AMBIENT_PLUGINS=true.
  # Every pinned tool dir is listed, built or not (a missing dir on PATH is harmless).
  local dirs="" t
  for t in pulumi kube-apiserver kube-controller-manager kube-scheduler etcd kwok kubelet kube-proxy coredns; do dirs+="$(tool_bindir "$t"):"; done
  [ -x "$(tool_bindir kubectl)/kubectl" ] && dirs="$(tool_bindir kubectl):$dirs"
  {
    echo "# Generated by tools/build-tools.sh: puts the dualsched tool bin dirs on PATH."
    echo "export DUALSCHED_TOOLS_CACHE=\"$CACHE\""
    echo "case \":\$PATH:\" in *\":${dirs%:}:\"*) ;; *) export PATH=\"${dirs}\$PATH\" ;; esac"
    echo "# provider plugin binaries (for pulumi plugin install --file):"
    echo "export DUALSCHED_PULUMI_KUBERNETES_BIN=\"$(tool_bindir pulumi-resource-kubernetes)/pulumi-resource-kubernetes\""
    echo "export DUALSCHED_PULUMI_RANDOM_BIN=\"$(tool_bindir pulumi-resource-random)/pulumi-resource-random\""
  } >"$CACHE/env.sh"
}

# The engine finds a language host without warnings only next to the pulumi binary ("bundled");
# with PULUMI_IGNORE_AMBIENT_PLUGINS=true it does not look on PATH at all.
link_langhost() {
  local pb lb f
  pb=$(tool_bindir pulumi); lb=$(tool_bindir pulumi-language-python)
  [ -x "$pb/pulumi" ] && [ -x "$lb/pulumi-language-python" ] || return 0
  for f in pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python; do
    ln -sfn "$lb/$f" "$pb/$f"
  done
  # The YAML host loads a component package written in Python (the dualsched package) itself, and looks
  # for pulumi-language-python next to its own binary (not next to pulumi): link the Python host there too.
  local yb; yb=$(tool_bindir pulumi-language-yaml)
  if [ -x "$yb/pulumi-language-yaml" ]; then
    ln -sfn "$yb/pulumi-language-yaml" "$pb/pulumi-language-yaml"
    for f in pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python; do
      ln -sfn "$lb/$f" "$yb/$f"
    done
  fi
  return 0
}

# Install provider plugins into the Pulumi plugin cache at the exact versions the Python
# packages request, in ${PULUMI_HOME:-~/.pulumi}/plugins (same as dualsched_install_plugins in tools/pulumi-env.sh).
install_plugins() {
  local pulumi; pulumi="$(tool_bindir pulumi)/pulumi"
  [ -x "$pulumi" ] || return 0
  export PULUMI_SKIP_UPDATE_CHECK=true
  local name ver bin
  for spec in "kubernetes $PULUMI_K8S_PROVIDER_VERSION" "random $PULUMI_RANDOM_PROVIDER_VERSION"; do
    read -r name ver <<<"$spec"
    bin="$(tool_bindir "pulumi-resource-$name")/pulumi-resource-$name"
    [ -x "$bin" ] || continue
    local dst="${PULUMI_HOME:-$HOME/.pulumi}/plugins/resource-$name-v$ver/pulumi-resource-$name"
    if [ -f "$dst" ] && cmp -s "$bin" "$dst" && [ "$FORCE" != 1 ]; then continue; fi
    log "installing plugin resource $name v$ver into ${PULUMI_HOME:-$HOME/.pulumi}/plugins"
    "$pulumi" plugin install resource "$name" "$ver" --file "$bin" --reinstall >/dev/null 2>&1 ||
      "$pulumi" plugin install resource "$name" "$ver" --file "$bin" --reinstall
  done
}

# ---------------------------------------------------------------- main
if [ "${1:-}" = "--list" ]; then
  for t in "${ALL_TOOLS[@]}"; do printf '%-28s %-10s %s\n' "$t" "$(tool_version "$t")" "$(tool_bindir "$t")"; done
  exit 0
fi
TOOLS=("$@"); [ ${#TOOLS[@]} -gt 0 ] || TOOLS=("${ALL_TOOLS[@]}")
JOBS="${DUALSCHED_TOOLS_JOBS:-2}"
failed=()

# Tools built from our own sources (tools/gosrc/<tool>): a cached binary built from other
# sources than the checkout's is stale (the cache key is only the version), so it is rebuilt.
# The hash of a tool's own sources: its Go files, and its build.sh where it has one (the double's pins
# the k8s.io/kubelet and gRPC modules it builds against).
src_hash() {
  local d="$HERE/gosrc/$1" files
  [ -d "$d" ] || return 1
  files=("$d"/*.go); [ -f "$d/build.sh" ] && files+=("$d/build.sh")
  cat "${files[@]}" | sha256sum | cut -c1-16
}
src_current() { local h; h=$(src_hash "$1") || return 0; [ "$(cat "$(tool_bindir "$1")/.src-hash" 2>/dev/null)" = "$h" ]; }

build_list() { # build_list LANE TOOL... : sequential builds, progress "(i/n)"
  local lane=$1; shift
  local n=$# i=0 t v bin logf start secs rc=0
  for t in "$@"; do
    i=$((i + 1)); v=$(tool_version "$t"); bin="$(tool_bindir "$t")/$t"
    if [ "$FORCE" != 1 ] && [ -x "$bin" ] && src_current "$t"; then log "ok       $t $v ($lane$i/$n, cached)"; continue; fi
    if [ "$FORCE" != 1 ] && reuse_from_path "$t"; then continue; fi
    logf="$LOGS/$t-$v.log"
    log "building $t $v ($lane$i/$n)... (log: $logf)"
    start=$(date +%s)
    if (build_one "$t") >"$logf" 2>&1 && [ -x "$bin" ]; then
      secs=$(( $(date +%s) - start ))
      log "built    $t $v in ${secs}s"
      if h=$(src_hash "$t"); then echo "$h" >"$(tool_bindir "$t")/.src-hash"; fi
      echo "$(date -u +%FT%TZ) $t $v ${secs}s" >>"$CACHE/build-times.log"
    else
      rm -f "$bin"
      log "FAILED   $t $v after $(( $(date +%s) - start ))s; last lines of $logf:"
      tail -n 15 "$logf" | sed 's/^/[tools]   /'
      echo "$t" >>"$CACHE/.failed.$$"
      rc=1
    fi
  done
  return $rc
}

# Two runs sharing the cache (a `make up` and a `make test`) would rebuild the same wrapper
# modules under each other: one build at a time, the second waits and then finds the cache warm.
exec 9>"$CACHE/.lock"
if ! flock -n 9; then log "waiting for another build on $CACHE to finish..."; flock 9; fi

log "cache: $CACHE  (go: $(go version | awk '{print $3}'), GOTOOLCHAIN=$GOTOOLCHAIN, lanes: $JOBS)"
rm -f "$CACHE/.failed.$$"
t0=$(date +%s)
if [ "$JOBS" -ge 2 ]; then
  # Two lanes in parallel (2 cores: one go build alone leaves the CPU idle during module
  # resolution, single-threaded big packages and linking). The Kubernetes binaries share one
  # wrapper module, so they stay in one lane; the small tools join it, so that both lanes take
  # about as long cold (measured: A 1,855 s, B 1,936 s, of which the Kubernetes provider 1,157 s).
  lane_a=(); lane_b=()
  for t in "${TOOLS[@]}"; do
    case "$t" in
      kube-*|kubectl|kubelet|etcd|kwok|coredns|gpu-device-plugin-double|pulumi-language-yaml) lane_a+=("$t") ;;
      *) lane_b+=("$t") ;;
    esac
  done
  pa=""; pb=""
  [ ${#lane_a[@]} -gt 0 ] && { build_list "A" "${lane_a[@]}" & pa=$!; }
  [ ${#lane_b[@]} -gt 0 ] && { build_list "B" "${lane_b[@]}" & pb=$!; }
  [ -n "$pa" ] && { wait "$pa" || true; }
  [ -n "$pb" ] && { wait "$pb" || true; }
else
  build_list "" "${TOOLS[@]}" || true
fi
[ -f "$CACHE/.failed.$$" ] && mapfile -t failed <"$CACHE/.failed.$$"
rm -f "$CACHE/.failed.$$"
log "builds done in $(( $(date +%s) - t0 ))s"

write_env
link_langhost
install_plugins || log "WARNING: plugin install failed"
log "bin dirs:"
for t in "${ALL_TOOLS[@]}"; do if [ -x "$(tool_bindir "$t")/$t" ]; then log "  $(tool_bindir "$t")"; fi; done
log "env: source $CACHE/env.sh   (or: source tools/pulumi-env.sh for Pulumi + cluster)"
if [ ${#failed[@]} -gt 0 ]; then log "failed: ${failed[*]}"; exit 1; fi
