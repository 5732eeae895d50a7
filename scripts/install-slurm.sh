#!/usr/bin/env bash
# Install what the real-Slurm test tier (tests/slurm, `pytest -m slurm`) runs:
# Debian's Slurm 22.05 daemons, slurmrestd and clients, munge and MariaDB.
#
# Idempotent: installs only missing packages, and stops/disables any daemon the
# packages start on their own, because the test harness starts its own copies on
# private ports, sockets and directories. Needs root (or sudo) and Debian/Ubuntu.
set -euo pipefail

PACKAGES=(slurm-wlm slurmdbd slurmrestd slurm-wlm-jwt-plugin slurm-client munge mariadb-server mariadb-client
          # tools/build-pyxis.sh: Pyxis against this Slurm (spank.h), Enroot (makeself, libbsd for glibc < 2.38)
          libslurm-dev gcc make makeself libbsd-dev
          # what Enroot runs (doc/requirements.md)
          curl jq parallel squashfs-tools pigz zstd)
SERVICES=(slurmctld slurmd slurmdbd slurmrestd munge mariadb mysql)

if [ "$(id -u)" -ne 0 ]; then
    exec sudo --preserve-env=DEBIAN_FRONTEND "$0" "$@"
fi

missing=()
for package in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-slurm: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Keep package scripts from starting daemons where policy-rc.d is honoured
    # (101 = action forbidden); removed again whatever happens.
    policy=/usr/sbin/policy-rc.d
    created_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        created_policy=1
    fi
    trap '[ -n "$created_policy" ] && rm -f "$policy"' EXIT
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "install-slurm: all of ${PACKAGES[*]} already installed"
fi

# Whatever the packages started (systemd or SysV init), stop it and keep it from
# starting at boot: the tests run their own munged on the default munge socket, and
# their own MariaDB and Slurm daemons on private ports and directories.
for service in "${SERVICES[@]}"; do
    if command -v systemctl >/dev/null 2>&1; then
        systemctl disable "$service" >/dev/null 2>&1 || true  # works without a running systemd too
        if [ -d /run/systemd/system ]; then
            systemctl stop "$service" >/dev/null 2>&1 || true
        fi
    fi
    if [ ! -d /run/systemd/system ] && [ -x "/etc/init.d/$service" ]; then
        "/etc/init.d/$service" stop >/dev/null 2>&1 || true
        update-rc.d "$service" disable >/dev/null 2>&1 || true
    fi
done

for tool in slurmctld slurmd slurmdbd sinfo sbatch sacct sacctmgr scontrol munged mariadbd mariadb-install-db; do
    command -v "$tool" >/dev/null || { echo "install-slurm: $tool not found after install" >&2; exit 1; }
done
echo "install-slurm: $(slurmctld -V), $(mariadbd --version | head -n1)"
