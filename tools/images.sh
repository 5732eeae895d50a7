#!/usr/bin/env bash
# Build the container images of the local "real node" test tier from Debian packages and
# import them into a containerd.
#
# Why: the test machines cannot pull from any container registry (only Debian's, PyPI's
# and similar package registries are reachable), so the images a real kubelet runs here
# are assembled locally from Debian 12 (bookworm) packages with mmdebstrap. Debian 12
# ships Slurm 22.05 and MariaDB 10.11; production uses SchedMD's (Slinky) Slurm images,
# the upstream MariaDB image and the real vLLM image (config/models.py), so this tier
# tests the project's pods, commands, probes, mounts and security contexts, not those
# exact versions. No registry is ever contacted: the images are imported from archives.
#
#   dualsched.local/slurm:22.05        slurmctld slurmd slurmdbd slurmrestd slurm-client munge, auth/jwt (no keys)
#   dualsched.local/slurm:26.05        the same from Debian forky (DUALSCHED_SLURM_SUITE=forky; trixie: :24.11)
#   dualsched.local/login:22.05        openssh-server slurm-client munge, auth/jwt: the login pod (no host keys, no munge key)
#   dualsched.local/mariadb:10.11      mariadb-server mariadb-client (empty /var/lib/mysql)
#   dualsched.local/vllm-standin:1     python3 + tools/images/vllm_standin.py as /usr/local/bin/vllm
#   dualsched.local/python:3.11        python3 alone: the token minter and the Jobs' token sidecar
#   dualsched.local/pause:1            busybox from busybox-static: the pod sandbox image
#   dualsched.local/slurmd-pyxis:22.05 the slurm image's packages, Pyxis's SPANK plugin and Enroot (built by
#                                      tools/build-pyxis.sh against the host's libslurm-dev: Debian 12's
#                                      22.05, as the image's) and what Enroot runs (unsquashfs, awk,
#                                      column, pwck...): images.slurmdPyxis, the local stack's slurmd
#   dualsched.local/torch:1.13         python3-torch (CPU; gloo, torchrun) for Slurm jobs: only when named,
#                                      and as an Enroot squashfs file (`squashfs torch`, below)
#
# `squashfs IMAGE` builds IMAGE's docker-archive as above, then the file Enroot runs
# (`srun --container-image=/path/IMAGE.sqsh`: Pyxis takes an argument starting with '/' or '.'
# for a squashfs file and runs `enroot create` on it: no registry, no `enroot import`): the
# layer unpacked, the files `enroot import docker://` writes from the image config added
# (/etc/rc: WorkingDir, Entrypoint and Cmd; /etc/rc.local; /etc/environment: Env; /etc/fstab:
# Volumes), then `mksquashfs -all-root` as enroot import does. Cached as IMAGE-KEY.sqsh next to
# the archives (mode 0644: job users unpack it); copy it to the shared directory for jobs.
#
# Each rootfs is a tarball from `mmdebstrap --format=tar bookworm` (mmdebstrap keeps
# package scripts from starting daemons: policy-rc.d and a dummy start-stop-daemon in
# its chroot). An embedded Python helper turns it into a single-layer docker-archive
# (manifest.json + config with rootfs.diff_ids) that `ctr images import` accepts, after
# dropping /dev nodes, apt lists/caches, the host's resolv.conf/hostname and the files a
# recipe says must not be baked in (munge.key, MariaDB's data directory contents), and
# checks that the binaries a recipe requires are in the layer.
#
# Archives are cached in ${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}/images/,
# named by a hash of everything that determines their content (recipe, package list,
# mmdebstrap options, the helper's code, the stand-in script, mirror, architecture), so
# an unchanged image is never rebuilt; the cache is locked with flock, and an archive
# is written under a temporary name and renamed into place when complete. A Debian
# point release does not change the hash: DUALSCHED_IMAGES_FORCE=1 rebuilds.
#
# Usage:
#   tools/images.sh build  [IMAGE...]                      build missing archives, print their paths
#   tools/images.sh import [--address SOCK] [IMAGE...]     build if needed, import into SOCK's k8s.io namespace
#   tools/images.sh list   [IMAGE...]                      name, archive path, size
#   tools/images.sh squashfs [IMAGE...]                    build an Enroot squashfs image, print its path
#   IMAGE: slurm slurmd-pyxis login mariadb vllm-standin python pause (default: all); torch
#   (squashfs's default): never built unless named
# Env: DUALSCHED_TOOLS_CACHE, DUALSCHED_IMAGES_FORCE=1 (rebuild), DUALSCHED_IMAGES_MIRROR
#      (an mmdebstrap MIRROR argument, e.g. a URL or a sources file; default: mmdebstrap's
#      deb.debian.org + bookworm-updates + bookworm-security), CONTAINERD_ADDRESS
#      (default for --address: /run/containerd/containerd.sock), DUALSCHED_SLURM_SUITE (the
#      Debian suite of the slurm image: bookworm, the default, gives dualsched.local/slurm:22.05,
#      trixie :24.11, forky :26.05; the other images stay bookworm).
# Needs: mmdebstrap, python3, flock; ctr for import; mksquashfs for squashfs (squashfs-tools,
# installed if missing). Run as root (mmdebstrap's root mode).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
IMAGES_DIR="$CACHE/images"
SUITE=bookworm
# A newer Slurm comes from a newer Debian suite (containers carry their own libc): the slurm
# image of suite S is built as the image "slurm.S", so its archive, log and cache key are its
# own and the default bookworm image stays cached next to it.
SLURM_SUITE="${DUALSCHED_SLURM_SUITE:-bookworm}"
declare -A SLURM_TAGS=([bookworm]=22.05 [trixie]=24.11 [forky]=26.05)
FORCE="${DUALSCHED_IMAGES_FORCE:-0}"
MIRROR="${DUALSCHED_IMAGES_MIRROR:-}"
ALL_IMAGES=(slurm slurmd-pyxis login mariadb vllm-standin python pause)
# Images for Slurm jobs (Pyxis/Enroot), built only when named: `squashfs` turns them into an
# Enroot image file (see squashfs_one).
SQUASHFS_IMAGES=(torch)

# Options of every mmdebstrap run (part of the cache key): no Recommends, no man pages,
# info or translations, documentation reduced to the copyright files.
BASE_MMDEBSTRAP_OPTS=(
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
)

log() { echo "[images] $*" >&2; }
die() { echo "[images] ERROR: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }
since() { local t=$(( $(now_ms) - $1 )); printf '%d.%01ds' $((t / 1000)) $((t % 1000 / 100)); }

# The recipes: what goes into each image. Paths in drop/keep_only are fnmatch patterns on
# layer paths (no leading slash); require lists absolute paths that must resolve to a
# file in the layer (symbolic links such as /bin -> usr/bin are followed).
recipe() {
  case "$1" in
    slurm) cat <<EOF
{"ref": "dualsched.local/slurm:${SLURM_TAGS[$SUITE]}", "variant": "essential",
 "packages": ["slurmctld", "slurmd", "slurmdbd", "slurmrestd", "slurm-wlm-jwt-plugin", "slurm-client", "munge", "procps",
              "bash", "coreutils", "ca-certificates", "mount"],
 "drop": ["etc/munge/munge.key"],
 "require": ["/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/sbin/slurmrestd",
             "/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so", "/usr/bin/sbatch",
             "/usr/bin/scontrol", "/usr/bin/sinfo", "/usr/bin/sacct", "/usr/bin/sacctmgr", "/bin/sh", "/usr/sbin/mungekey", "/usr/bin/munge", "/usr/bin/unmunge", "/bin/mount"],
 "entrypoint": null, "cmd": ["/bin/sh"]}
EOF
    ;;
    login) cat <<'EOF'
{"ref": "dualsched.local/login:22.05", "variant": "essential",
 "packages": ["openssh-server", "slurm-client", "slurm-wlm-jwt-plugin", "munge", "procps", "bash", "coreutils"],
 "drop": ["etc/munge/munge.key", "etc/ssh/ssh_host_*"],
 "require": ["/usr/sbin/sshd", "/usr/sbin/munged", "/usr/bin/sbatch", "/usr/bin/sinfo", "/usr/bin/squeue", "/usr/bin/sacct",
             "/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_munge.so", "/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so",
             "/usr/bin/cat", "/usr/bin/id", "/bin/sh", "/bin/bash"],
 "entrypoint": null, "cmd": ["/bin/sh"]}
EOF
    ;;
    mariadb) cat <<'EOF'
{"ref": "dualsched.local/mariadb:10.11", "variant": "essential",
 "packages": ["mariadb-server", "mariadb-client"],
 "drop": ["var/lib/mysql/*"],
 "require": ["/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/bin/mariadb", "/usr/bin/mariadb-admin", "/bin/sh"],
 "entrypoint": null, "cmd": ["/bin/sh"]}
EOF
    ;;
    vllm-standin) cat <<'EOF'
{"ref": "dualsched.local/vllm-standin:1", "variant": "essential",
 "packages": ["python3"],
 "files": [{"name": "usr/local/bin/vllm", "src": "tools/images/vllm_standin.py", "mode": "0755"}],
 "require": ["/usr/local/bin/vllm", "/usr/bin/python3", "/usr/bin/env", "/bin/sh"],
 "env": ["PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
 "entrypoint": null, "cmd": ["/usr/local/bin/vllm", "--help"]}
EOF
    ;;
    python) cat <<'EOF'
{"ref": "dualsched.local/python:3.11", "variant": "essential",
 "packages": ["python3"],
 "require": ["/usr/bin/python3", "/bin/sh", "/usr/bin/test"],
 "env": ["PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
 "entrypoint": null, "cmd": ["/usr/bin/python3"]}
EOF
    ;;
    pause) cat <<'EOF'
{"ref": "dualsched.local/pause:1", "variant": "extract",
 "packages": ["busybox-static"],
 "keep_only": ["bin/busybox", "usr/share/doc/busybox-static/copyright"],
 "extra": [{"type": "symlink", "name": "bin/sh", "target": "busybox"},
           {"type": "dir", "name": "tmp", "mode": "1777"},
           {"type": "dir", "name": "dev"}, {"type": "dir", "name": "proc"}, {"type": "dir", "name": "sys"},
           {"type": "dir", "name": "etc"}],
 "require": ["/bin/busybox", "/bin/sh"],
 "entrypoint": ["/bin/busybox", "sleep", "2147483647"], "cmd": null}
EOF
    ;;
    slurmd-pyxis) cat <<EOF
{"ref": "dualsched.local/slurmd-pyxis:${SLURM_TAGS[$SUITE]}", "variant": "essential",
 "packages": ["slurmctld", "slurmd", "slurmdbd", "slurmrestd", "slurm-wlm-jwt-plugin", "slurm-client", "munge", "procps",
              "bash", "coreutils", "ca-certificates", "mount",
              "squashfs-tools", "mawk", "bsdextrautils", "passwd", "libbsd0"],
 "drop": ["etc/munge/munge.key"],
 "require": ["/usr/sbin/munged", "/usr/sbin/slurmd", "/usr/bin/sbatch", "/usr/bin/srun", "/usr/bin/scontrol", "/usr/bin/sinfo",
             "/usr/sbin/mungekey", "/usr/bin/munge", "/bin/sh", "/bin/mount",
             "/usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so", "/usr/local/bin/enroot", "/usr/local/bin/enroot-nsenter",
             "/usr/local/bin/enroot-switchroot", "/usr/local/bin/enroot-mount", "/usr/local/lib/enroot/runtime.sh",
             "/etc/enroot/mounts.d/10-system.fstab", "/etc/enroot/hooks.d/10-shadow.sh",
             "/usr/bin/unsquashfs", "/usr/bin/awk", "/usr/bin/column", "/usr/bin/lsns", "/usr/bin/flock",
             "/usr/bin/mountpoint", "/usr/sbin/pwck", "/usr/sbin/grpck", "/usr/bin/getent", "/usr/bin/ps"],
 "entrypoint": null, "cmd": ["/bin/sh"]}
EOF
    ;;
    torch) cat <<'EOF'
{"ref": "dualsched.local/torch:1.13", "variant": "essential",
 "packages": ["python3-torch", "python3-numpy", "bash"],
 "require": ["/usr/bin/torchrun", "/usr/bin/python3", "/usr/lib/python3/dist-packages/torch/distributed/run.py",
             "/usr/lib/python3/dist-packages/torch/_C.cpython-311-x86_64-linux-gnu.so",
             "/usr/lib/python3/dist-packages/torch/lib/libtorch_python.so", "/bin/sh", "/bin/bash"],
 "env": ["PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
 "entrypoint": null, "cmd": ["/bin/bash"]}
EOF
    ;;
    *) die "unknown image '$1' (known: ${ALL_IMAGES[*]} ${SQUASHFS_IMAGES[*]})" ;;
  esac
}

# Helper: `key` (cache key of $RECIPE), `get FIELD` (a recipe field; lists comma-joined),
# `archive ROOTFS_TAR OUT` (docker-archive from an mmdebstrap tarball).
read -r -d '' PY_HELPER <<'PYEOF' || true
import fnmatch, hashlib, io, json, os, posixpath, sys, tarfile, time

# Never in a layer: device nodes (runtimes mount /dev), apt state, the build host's files.
COMMON_DROP = ["dev/*", "var/lib/apt/lists/*", "var/cache/apt/*", "var/log/apt/*",
               "etc/resolv.conf", "etc/hostname", "etc/machine-id"]
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

def recipe():
    return json.loads(os.environ["RECIPE"])

def norm(name):
    while name.startswith("./"):
        name = name[2:]
    name = name.strip("/")
    return "" if name == "." else name

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()

def cmd_key(extra):
    r = recipe()
    h = hashlib.sha256()
    h.update(json.dumps([r, COMMON_DROP, PATH_ENV, extra], sort_keys=True).encode())
    for f in r.get("files", []):
        h.update(f["name"].encode() + b"\0" + sha256_file(os.path.join(os.environ["ROOT"], f["src"])).encode())
    print(h.hexdigest())

def cmd_get(field):
    v = recipe().get(field)
    print(",".join(v) if isinstance(v, list) else ("" if v is None else v))

def dpkg_versions(status, wanted):
    out, pkg = {}, None
    for line in status.decode("utf-8", "replace").splitlines():
        if line.startswith("Package: "):
            pkg = line.split(": ", 1)[1]
        elif line.startswith("Version: ") and pkg in wanted:
            out[pkg] = line.split(": ", 1)[1]
    return out

def changelog_version(name, data, packages):
    """(package, rank, version) from a Debian changelog, for images without a dpkg status
    (extract variant); a binNMU changelog (changelog.Debian.ARCH.gz) ranks first."""
    parts = name.split("/")
    if len(parts) != 5 or parts[:3] != ["usr", "share", "doc"] or parts[3] not in packages \
            or not (parts[4].startswith("changelog.Debian.") and parts[4].endswith(".gz")):
        return None
    import gzip
    first = gzip.decompress(data).split(b"\n", 1)[0].decode("utf-8", "replace")
    version = first.split("(", 1)[1].split(")", 1)[0] if "(" in first else "?"
    return parts[3], (0 if parts[4].count(".") == 3 else 1), version

def resolve(path, members, links):
    """Follows symbolic links inside the layer; returns the final path or None."""
    parts, done, hops = [p for p in path.split("/") if p], [], 0
    while parts:
        p = parts.pop(0)
        if p == "..":
            done = done[:-1]; continue
        if p in ("", "."):
            continue
        cur = "/".join(done + [p])
        if cur in links:
            hops += 1
            if hops > 40:
                return None
            t = links[cur]
            parts = [q for q in t.split("/") if q] + parts
            if t.startswith("/"):
                done = []
            continue
        if cur not in members:
            return None
        done.append(p)
    return "/".join(done)

def cmd_archive(src, dst, arch):
    r = recipe()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    mtime = int(time.time())
    drop = COMMON_DROP + r.get("drop", [])
    keep = r.get("keep_only")
    layer = dst + ".layer"
    members, links, dirs, versions, dropped, changelogs = {}, {}, set(), {}, [], {}

    def wanted(n):
        if not n or any(fnmatch.fnmatchcase(n, p) for p in drop):
            return False
        return keep is None or any(fnmatch.fnmatchcase(n, p) for p in keep)

    with tarfile.open(src, "r:") as tin, tarfile.open(layer, "w:", format=tarfile.PAX_FORMAT) as tout:
        def emit(info, fileobj=None):
            parent = posixpath.dirname(info.name)
            if parent and parent not in dirs and parent not in links:
                d = tarfile.TarInfo(parent); d.type = tarfile.DIRTYPE; d.mode = 0o755; d.mtime = mtime
                emit(d)
            if info.isdir():
                if info.name in dirs:
                    return
                dirs.add(info.name)
            if info.issym():
                links[info.name] = info.linkname
            members[info.name] = info
            tout.addfile(info, fileobj)

        for m in tin:
            n = norm(m.name)
            if m.isreg() and n.startswith("usr/share/doc/") and "/changelog.Debian." in n:
                found = changelog_version(n, tin.extractfile(m).read(), r["packages"])
                if found and found[1] < changelogs.get(found[0], (9, ""))[0]:
                    changelogs[found[0]] = found[1:]
            if not wanted(n):
                if n and not n.startswith("dev/"):
                    dropped.append(n)
                continue
            m.name = n
            # A pax "path"/"linkpath" record would override the normalised names.
            m.pax_headers = {k: v for k, v in m.pax_headers.items() if k not in ("path", "linkpath")}
            if m.islnk():
                m.linkname = norm(m.linkname)
            f = tin.extractfile(m) if m.isreg() else None
            if n == "var/lib/dpkg/status":
                data = f.read()
                versions = dpkg_versions(data, set(r["packages"]))
                f = io.BytesIO(data)
            emit(m, f)
        for e in r.get("extra", []):
            info = tarfile.TarInfo(e["name"]); info.mtime = mtime
            if e["type"] == "dir":
                info.type = tarfile.DIRTYPE; info.mode = int(e.get("mode", "0755"), 8)
            elif e["type"] == "symlink":
                info.type = tarfile.SYMTYPE; info.linkname = e["target"]; info.mode = 0o777
            emit(info)
        for e in r.get("files", []):
            path = os.path.join(os.environ["ROOT"], e["src"])
            info = tarfile.TarInfo(e["name"]); info.mtime = mtime
            info.mode = int(e.get("mode", "0644"), 8); info.size = os.path.getsize(path)
            with open(path, "rb") as f:
                emit(info, f)

    missing = [p for p in r.get("require", [])
               if (t := resolve(p, members, links)) is None or not (members[t].isreg() or members[t].islnk())]
    if missing:
        sys.exit(f"required paths missing from the layer: {' '.join(missing)}")
    for pattern in r.get("drop", []):
        if any(fnmatch.fnmatchcase(n, pattern) for n in members):
            sys.exit(f"{pattern} is still in the layer")

    for pkg, (_, version) in changelogs.items():
        versions.setdefault(pkg, version)
    diff_id = sha256_file(layer)
    env = [PATH_ENV] + r.get("env", [])
    packages = " ".join(f"{p}={versions.get(p, '?')}" for p in r["packages"])
    config = {
        "architecture": arch, "os": "linux", "created": created,
        "config": {"Env": env, "Entrypoint": r.get("entrypoint"), "Cmd": r.get("cmd"), "WorkingDir": "/",
                   "Labels": {"org.opencontainers.image.title": r["ref"],
                              "org.opencontainers.image.description":
                                  "dualsched real-node test image built by tools/images.sh from Debian bookworm packages",
                              "dualsched.cache-key": os.environ["KEY"],
                              "dualsched.debian-packages": packages}},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
        "history": [{"created": created,
                     "created_by": f"tools/images.sh: mmdebstrap --variant={r['variant']} bookworm {packages}"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    repo, tag = r["ref"].rsplit(":", 1)
    manifest = [{"Config": f"{config_id}.json", "RepoTags": [r["ref"]], "Layers": [f"{diff_id}/layer.tar"]}]

    def add_bytes(out, name, data):
        info = tarfile.TarInfo(name); info.size = len(data); info.mtime = mtime; info.mode = 0o644
        out.addfile(info, io.BytesIO(data))

    with tarfile.open(dst, "w:", format=tarfile.PAX_FORMAT) as out:
        d = tarfile.TarInfo(diff_id); d.type = tarfile.DIRTYPE; d.mode = 0o755; d.mtime = mtime
        out.addfile(d)
        info = tarfile.TarInfo(f"{diff_id}/layer.tar"); info.size = os.path.getsize(layer)
        info.mtime = mtime; info.mode = 0o644
        with open(layer, "rb") as f:
            out.addfile(info, f)
        add_bytes(out, f"{config_id}.json", config_bytes)
        add_bytes(out, "manifest.json", json.dumps(manifest).encode())
        add_bytes(out, "repositories", json.dumps({repo: {tag: diff_id}}).encode())
    os.unlink(layer)
    n_dropped = len(dropped)
    print(f"layer sha256:{diff_id[:12]} ({os.path.getsize(dst) >> 20} MiB, {len(members)} entries, "
          f"{n_dropped} dropped); {packages}")

cmd, args = sys.argv[1], sys.argv[2:]
{"key": lambda: cmd_key(args), "get": lambda: cmd_get(*args), "archive": lambda: cmd_archive(*args)}[cmd]()
PYEOF

py() { python3 -c "$PY_HELPER" "$@"; }

ARCH="$(dpkg --print-architecture)"

# Sets RECIPE, KEY, REF and ARCHIVE for image $1. The key covers the recipe (and the
# files it installs), the helper's code, the function that runs mmdebstrap and its
# options, suite, mirror and architecture.
load() {
  SUITE=bookworm; [ "${1%%.*}" = "$1" ] || SUITE=${1#*.}
  MMDEBSTRAP_OPTS=("${BASE_MMDEBSTRAP_OPTS[@]}")
  # Debian testing's Release files expire after a week and the mirror this machine reaches
  # serves an older forky: apt still checks their signatures, not their expiry.
  [ "$SUITE" != forky ] || MMDEBSTRAP_OPTS+=(--aptopt='Acquire::Check-Valid-Until "false"')
  [ "${1%%.*}" != slurmd-pyxis ] || pyxis_hooks
  RECIPE="$(recipe "${1%%.*}")"
  export RECIPE ROOT
  KEY="$(py key "$SUITE" "$MIRROR" "$ARCH" "${MMDEBSTRAP_OPTS[@]}" "$PY_HELPER" "$(declare -f build_one)")"
  REF="$(py get ref)"
  ARCHIVE="$IMAGES_DIR/$1-${KEY:0:16}.docker.tar"
}

# Pyxis and Enroot as tools/build-pyxis.sh caches them (versions.env; Pyxis per Slurm version of the
# host's spank.h), copied into the rootfs by mmdebstrap customize hooks: the plugin where plugstack.conf
# names it (components/slurm_files.py), Enroot under /usr/local and /etc/enroot, where Pyxis's epilog
# (PATH=/usr/local/bin:/usr/bin:/bin) and enroot.conf's ConfigMap mount expect them.
pyxis_hooks() {
  local slurm_version pyxis enroot
  # shellcheck source=versions.env
  source "$HERE/versions.env"
  [ "$SUITE" = bookworm ] || die "slurmd-pyxis: Pyxis is built against the host's (Debian 12) spank.h: bookworm only"
  slurm_version=$(dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null | cut -d- -f1)
  pyxis="$CACHE/pyxis-$PYXIS_VERSION-slurm${slurm_version:-unknown}" enroot="$CACHE/enroot-$ENROOT_VERSION/root"
  MMDEBSTRAP_OPTS+=(
    --customize-hook='mkdir -p "$1/usr/lib/x86_64-linux-gnu/slurm"'
    --customize-hook="copy-in $pyxis/spank_pyxis.so /usr/lib/x86_64-linux-gnu/slurm"
    --customize-hook="copy-in $enroot/usr/local/bin $enroot/usr/local/lib $enroot/usr/local/share /usr/local"
    --customize-hook="copy-in $enroot/etc/enroot /etc"
  )
}

TMP=""
cleanup() { [ -z "$TMP" ] || rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

build_one() {
  local img=$1 t0 t1 variant packages out opts
  load "$img"
  if [ -f "$ARCHIVE" ] && [ "$FORCE" != 1 ]; then
    log "$img: cached $REF ($(du -h "$ARCHIVE" | cut -f1))"
    echo "$ARCHIVE"; return
  fi
  if ! command -v mmdebstrap >/dev/null; then
    log "installing mmdebstrap (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null ||
      die "mmdebstrap not found and could not be installed (apt-get install mmdebstrap)"
  fi
  variant="$(py get variant)"; packages="$(py get packages)"
  TMP="$(mktemp -d "$IMAGES_DIR/.tmp.$img.XXXXXX")"
  log "$img: building $REF: mmdebstrap --variant=$variant $SUITE +$packages"
  t0=$(now_ms)
  # The extract variant installs nothing (no dpkg): the trimming options would only hide
  # the changelog the package version is read from. Mirror last (none: mmdebstrap's
  # default Debian mirrors).
  opts=("${MMDEBSTRAP_OPTS[@]}"); [ "$variant" != extract ] || opts=()
  if ! mmdebstrap --variant="$variant" --include="$packages" --format=tar "${opts[@]}" \
       "$SUITE" "$TMP/rootfs.tar" ${MIRROR:+"$MIRROR"} >"$TMP/mmdebstrap.log" 2>&1; then
    tail -n 30 "$TMP/mmdebstrap.log" >&2
    cp "$TMP/mmdebstrap.log" "$IMAGES_DIR/$img.mmdebstrap.log" 2>/dev/null || true
    die "$img: mmdebstrap failed (log: $IMAGES_DIR/$img.mmdebstrap.log)"
  fi
  cp "$TMP/mmdebstrap.log" "$IMAGES_DIR/$img.mmdebstrap.log"
  log "$img: rootfs $(du -h "$TMP/rootfs.tar" | cut -f1) in $(since "$t0")"
  t1=$(now_ms)
  out="$(KEY="$KEY" py archive "$TMP/rootfs.tar" "$TMP/image.tar" "$ARCH")" || die "$img: archive failed"
  log "$img: $out"
  mv -f "$TMP/image.tar" "$ARCHIVE"
  rm -rf "$TMP"; TMP=""
  # Older archives of this image (other keys) and their import records.
  find "$IMAGES_DIR" -maxdepth 1 -name "$img-*.docker.tar*" ! -name "$(basename "$ARCHIVE")*" -delete
  log "$img: archive in $(since "$t1"), built in $(since "$t0"): $ARCHIVE"
  echo "$ARCHIVE"
}

lock_cache() {
  mkdir -p "$IMAGES_DIR"
  exec 9>"$IMAGES_DIR/.lock"
  if ! flock -n 9; then
    log "another build holds $IMAGES_DIR/.lock; waiting"
    flock 9
  fi
  # Leftovers of a build that was killed (we hold the lock: nobody else is building).
  rm -rf "$IMAGES_DIR"/.tmp.*
}

# build_one, after what an image's hooks copy in (slurmd-pyxis: Pyxis and Enroot, cached).
build_image() {
  [ "${1%%.*}" != slurmd-pyxis ] || "$HERE/build-pyxis.sh" >/dev/null || die "slurmd-pyxis: tools/build-pyxis.sh failed"
  build_one "$1"
}

# each_image WHAT FN IMAGE...: FN for every image, under the cache lock
each_image() {
  local what=$1 fn=$2 t0 img
  shift 2
  t0=$(now_ms)
  lock_cache
  for img in "$@"; do "$fn" "$img"; done
  log "$what: $# image(s) ready in $(since "$t0")"
}

build_all() { each_image build build_image "$@"; }

# `layer ARCHIVE`: the path of a docker-archive's one layer in it. `configure ARCHIVE ROOTFS`:
# Enroot's image files from the archive's image config, as enroot's `docker::configure`
# (src/docker.sh, v3.5.0) writes them: labels as comments, then the rc script; Env as
# /etc/environment; Volumes as bind mounts in /etc/fstab.
read -r -d '' SQ_HELPER <<'PYEOF' || true
import json, os, shlex, sys, tarfile
cmd, archive = sys.argv[1], sys.argv[2]
with tarfile.open(archive, "r:") as t:
    [manifest] = json.load(t.extractfile("manifest.json"))
    config = json.load(t.extractfile(manifest["Config"]))["config"]
if len(manifest["Layers"]) != 1:
    sys.exit(f"expected one layer, got {manifest['Layers']}")
if cmd == "layer":
    print(manifest["Layers"][0])
    sys.exit()
rootfs = sys.argv[3]
etc = os.path.join(rootfs, "etc")
os.makedirs(etc, exist_ok=True)
workdir = config.get("WorkingDir") or "/"
entrypoint, cmd = config.get("Entrypoint") or [], config.get("Cmd") or []
if not entrypoint and not cmd:
    cmd = ["/bin/sh"]
q = lambda words: " ".join(shlex.quote(w) for w in words)
labels = "".join(f"# {k} {v}\n" for k, v in (config.get("Labels") or {}).items())
rc = (labels + ("\n" if labels else "") +
      f'mkdir -p "{workdir}" 2> /dev/null\ncd "{workdir}" && unset OLDPWD || exit 1\n\n'
      "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
      f'if [ $# -gt 0 ]; then\n    exec {q(entrypoint)} "$@"\nelse\n    exec {q(entrypoint + cmd)}\nfi\n')
files = {
    "rc": rc,
    "rc.local": "# This file is sourced by /etc/rc when the container starts.\n"
                "# It can be used to manipulate the entrypoint or the command of the container.\n",
    "environment": "".join(f"{e}\n" for e in config.get("Env") or []),
    "fstab": "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                     for v in sorted(config.get("Volumes") or {})),
}
for name, text in files.items():
    path = os.path.join(etc, name)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
os.makedirs(os.path.join(rootfs, workdir.lstrip("/")), exist_ok=True)
PYEOF

# Enroot's own default is "-comp lzo -noD" (ENROOT_SQUASH_OPTIONS: data left uncompressed, fastest
# to unpack); zstd at a low level keeps a file that sits on the shared directory small and is
# still fast to unpack (Debian 12's squashfs-tools 4.5.1 reads it).
SQUASHFS_OPTS=(-all-root -noappend -no-progress -comp zstd -Xcompression-level 6)

# squashfs_one IMAGE: IMAGE's docker-archive (build_one, cached), then its Enroot squashfs file,
# named by a hash of the archive's key, the options and this code.
squashfs_one() {
  local img=$1 key out t0 t1 layer
  build_image "$img" >/dev/null
  key="$(printf '%s\n' "$KEY" "${SQUASHFS_OPTS[*]}" "$SQ_HELPER" "$(declare -f squashfs_one)" | sha256sum | cut -c1-16)"
  out="$IMAGES_DIR/$img-$key.sqsh"
  if [ -f "$out" ] && [ "$FORCE" != 1 ]; then
    log "$img: cached squashfs ($(du -h "$out" | cut -f1))"
    echo "$out"; return
  fi
  if ! command -v mksquashfs >/dev/null; then
    log "installing squashfs-tools (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq squashfs-tools >/dev/null ||
      die "mksquashfs not found and could not be installed (apt-get install squashfs-tools)"
  fi
  t0=$(now_ms)
  TMP="$(mktemp -d "$IMAGES_DIR/.tmp.$img.sqsh.XXXXXX")"
  mkdir "$TMP/rootfs"
  layer="$(python3 -c "$SQ_HELPER" layer "$ARCHIVE")" || die "$img: cannot read $ARCHIVE"
  tar -xOf "$ARCHIVE" "$layer" | tar -x -p --numeric-owner -C "$TMP/rootfs" || die "$img: cannot unpack $layer"
  python3 -c "$SQ_HELPER" configure "$ARCHIVE" "$TMP/rootfs" || die "$img: cannot write Enroot's files"
  log "$img: rootfs $(du -sh "$TMP/rootfs" | cut -f1) unpacked in $(since "$t0")"
  t1=$(now_ms)
  mksquashfs "$TMP/rootfs" "$TMP/image.sqsh" "${SQUASHFS_OPTS[@]}" >"$TMP/mksquashfs.log" 2>&1 ||
    { tail -n 20 "$TMP/mksquashfs.log" >&2; die "$img: mksquashfs failed"; }
  unsquashfs -s "$TMP/image.sqsh" >/dev/null || die "$img: unsquashfs cannot read $TMP/image.sqsh"
  chmod 0644 "$TMP/image.sqsh"
  mv -f "$TMP/image.sqsh" "$out"
  rm -rf "$TMP"; TMP=""
  find "$IMAGES_DIR" -maxdepth 1 -name "$img-*.sqsh" ! -name "$(basename "$out")" -delete
  log "$img: squashfs $(du -h "$out" | cut -f1) in $(since "$t1") (total $(since "$t0")): $out"
  echo "$out"
}

squashfs_all() { each_image squashfs squashfs_one "$@"; }

# ctr's view of REF: "DIGEST UNPACKED" when present and complete, else nothing.
present_digest() {
  local addr=$1 ref=$2
  ctr --address "$addr" -n k8s.io images check "name==$ref" 2>/dev/null |
    awk -v ref="$ref" '$1 == ref && $4 ~ /^complete/ { print $3, $NF }'
}

import_all() {
  local addr=$1 t0 t1 img have want
  shift
  command -v ctr >/dev/null || die "ctr not found (apt-get install containerd)"
  [ -S "$addr" ] || die "no containerd socket at $addr"
  t0=$(now_ms)
  build_all "$@" >/dev/null
  for img in "$@"; do
    load "$img"
    want="$(cat "$ARCHIVE.digest" 2>/dev/null || true)"
    have="$(present_digest "$addr" "$REF")"
    if [ -n "$want" ] && [ "$have" = "$want true" ]; then
      log "$img: $REF already present in $addr (${want:0:19})"
      continue
    fi
    t1=$(now_ms)
    ctr --address "$addr" -n k8s.io images import "$ARCHIVE" >&2 || die "$img: import into $addr failed"
    have="$(present_digest "$addr" "$REF")"
    [ -n "$have" ] || die "$img: $REF not in $addr after import"
    echo "${have%% *}" >"$ARCHIVE.digest.tmp" && mv -f "$ARCHIVE.digest.tmp" "$ARCHIVE.digest"
    log "$img: imported $REF ${have%% *} in $(since "$t1")"
  done
  log "import: done in $(since "$t0")"
}

list_all() {
  local img size
  printf '%-34s %-8s %s\n' IMAGE SIZE ARCHIVE
  for img in "$@"; do
    load "$img"
    if [ -f "$ARCHIVE" ]; then size="$(du -h "$ARCHIVE" | cut -f1)"; else size="-"; fi
    printf '%-34s %-8s %s%s\n' "$REF" "$size" "$ARCHIVE" "$([ -f "$ARCHIVE" ] || echo ' (not built)')"
  done
}

usage() { sed -n '/^# Usage:/,/^# Needs:/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1 addr="${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}" images=()
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --address) [ $# -ge 2 ] || usage; addr=$2; shift 2 ;;
      --address=*) addr=${1#--address=}; shift ;;
      -h|--help) usage 0 ;;
      -*) usage ;;
      *) recipe "$1" >/dev/null; images+=("$1"); shift ;;
    esac
  done
  if [ ${#images[@]} -eq 0 ]; then
    if [ "$cmd" = squashfs ]; then images=("${SQUASHFS_IMAGES[@]}"); else images=("${ALL_IMAGES[@]}"); fi
  fi
  [ -n "${SLURM_TAGS[$SLURM_SUITE]:-}" ] || die "DUALSCHED_SLURM_SUITE=$SLURM_SUITE: not one of ${!SLURM_TAGS[*]}"
  [ "$SLURM_SUITE" = bookworm ] || for i in "${!images[@]}"; do [ "${images[$i]}" != slurm ] || images[$i]=slurm.$SLURM_SUITE; done
  command -v python3 >/dev/null || die "python3 not found"
  case "$cmd" in
    build) build_all "${images[@]}" ;;
    import) import_all "$addr" "${images[@]}" ;;
    list) list_all "${images[@]}" ;;
    squashfs) squashfs_all "${images[@]}" ;;
    -h|--help|help) usage 0 ;;
    *) usage ;;
  esac
}

main "$@"
