#!/usr/bin/env bash
# Build Pyxis's SPANK plugin and Enroot from source for the real-Slurm tier
# (tests/slurm/test_pyxis_plugstack.py), into a cache outside the checkout:
#
#   $CACHE/pyxis-<version>-slurm<slurm version>/spank_pyxis.so
#   $CACHE/enroot-<version>/root/{usr/local,etc/enroot}      (a staged install, prefix /usr/local)
#
# CACHE is ${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}. Slurm refuses a SPANK plugin built
# against another release's spank.h ("Incompatible plugin version"), so the Slurm version is part of
# Pyxis's cache key. Idempotent (what is cached is reused), serialized by a lock on the cache.
#
# Usage: tools/build-pyxis.sh [--install-enroot]
#   Prints the plugin's path last. --install-enroot also copies the staged Enroot into /usr/local and
#   /etc/enroot (a file already there is kept): Pyxis's job epilog runs `enroot` with
#   PATH=/usr/local/bin:/usr/bin:/bin (pyxis_slurmd.c job_epilog_fixup), so it must be there.
# Sources: vendored archives of the pinned commits (tools/vendor, checksums in tools/versions.env), so
# the build needs no network.
# Needs root for --install-enroot, and what scripts/install-slurm.sh installs (libslurm-dev, gcc, make,
# makeself, libbsd-dev).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
log() { echo "[pyxis] $*" >&2; }
die() { echo "[pyxis] ERROR: $*" >&2; exit 1; }

# unpack NAME VERSION SHA256 DIR: the vendored source (tools/vendor/NAME-VERSION.tar.gz), after checking
# it is the pinned archive.
unpack() {
  local name=$1 version=$2 sha=$3 dir=$4 archive="$HERE/vendor/$1-$2.tar.gz"
  log "unpacking $archive"
  echo "$sha  $archive" | sha256sum --check --quiet - || die "$archive is not the pinned $name $version (sha256)"
  mkdir "$dir" && tar -xzf "$archive" -C "$dir" --strip-components=1
}

# timed NAME LOG COMMAND...: run a build step into LOG, its last lines on failure.
timed() {
  local name=$1 logf=$2 start; shift 2
  start=$(date +%s)
  log "building $name (log: $logf)"
  "$@" >"$logf" 2>&1 || { tail -20 "$logf" >&2; die "building $name failed"; }
  log "built    $name in $(( $(date +%s) - start ))s"
}

build_pyxis() {
  local out=$1 src=$work/pyxis
  unpack pyxis "$PYXIS_VERSION" "$PYXIS_SHA256" "$src"
  timed "pyxis $PYXIS_VERSION against Slurm $slurm_version's spank.h" "$out.log" \
    make -C "$src" -j2 PYXIS_VER="${PYXIS_VERSION#v}"
  mkdir -p "$out.tmp" && install -m 644 "$src/spank_pyxis.so" "$out.tmp/" && mv "$out.tmp" "$out"
}

# make_enroot SRC DESTDIR: `all` first, where the scripts get their paths (install's DESTDIR would end up in them).
make_enroot() {
  local vars=(FORCE_GLIBC=1 prefix=/usr/local sysconfdir=/etc "LDLIBS=-l:libbsd.a $libbsd")
  make -C "$1" "${vars[@]}" all && make -C "$1" "${vars[@]}" install DESTDIR="$2"
}

build_enroot() {
  local out=$1 src=$work/enroot
  unpack enroot "$ENROOT_VERSION" "$ENROOT_SHA256" "$src"
  # The submodules are not in the tag's tree: glibc instead of musl (FORCE_GLIBC), whose strlcpy and
  # strlcat Debian 12's glibc (2.36) lacks, so libbsd's; the system's kernel headers; Debian's makeself.
  install -D -m 755 "$(command -v makeself)" "$src/deps/makeself/makeself.sh"
  cp /usr/share/makeself/makeself-header.sh "$src/deps/makeself/"
  mkdir -p "$src/deps/linux-headers" && touch "$src/deps/linux-headers/.stamp"
  timed "enroot $ENROOT_VERSION (glibc)" "$out.log" make_enroot "$src" "$out.tmp/root"
  mv "$out.tmp" "$out"
}

[ -f /usr/include/slurm/spank.h ] || die "no /usr/include/slurm/spank.h: install libslurm-dev (scripts/install-slurm.sh)"
slurm_version=$(dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null | cut -d- -f1)
[ -n "$slurm_version" ] || die "cannot tell the Slurm version of spank.h (dpkg-query libslurm-dev)"
libbsd=$(ls /usr/lib/*/libbsd.so 2>/dev/null | head -1)
[ -n "$libbsd" ] || die "no libbsd.so: install libbsd-dev (scripts/install-slurm.sh)"
pyxis_out="$CACHE/pyxis-$PYXIS_VERSION-slurm$slurm_version"
enroot_out="$CACHE/enroot-$ENROOT_VERSION"

mkdir -p "$CACHE"
exec 9>"$CACHE/.pyxis.lock"
if ! flock -n 9; then log "waiting for another build on $CACHE to finish..."; flock 9; fi
work=$(mktemp -d "$CACHE/.pyxis-build.XXXXXX")
trap 'rm -rf "$work" "$pyxis_out.tmp" "$enroot_out.tmp"' EXIT

if [ -f "$pyxis_out/spank_pyxis.so" ]; then log "ok       pyxis $PYXIS_VERSION for Slurm $slurm_version (cached)"
else build_pyxis "$pyxis_out"; fi
if [ -x "$enroot_out/root/usr/local/bin/enroot" ]; then log "ok       enroot $ENROOT_VERSION (cached)"
else build_enroot "$enroot_out"; fi

if [ "${1:-}" = --install-enroot ]; then
  cp -a "$enroot_out/root/usr/local/." /usr/local/
  cp -a -n "$enroot_out/root/etc/enroot" /etc/
  log "installed enroot $(/usr/local/bin/enroot version) into /usr/local and /etc/enroot"
fi
echo "$pyxis_out/spank_pyxis.so"
