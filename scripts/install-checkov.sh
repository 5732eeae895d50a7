#!/usr/bin/env bash
# Install checkov (tests/test_checkov.py) into its OWN virtualenv: checkov pins
# dependencies that conflict with the project's, so it never enters our env.
#
#   ${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}/checkov-<version>/bin/checkov
#
# Idempotent: a complete venv (marked by .installed) is reused; a half-built one
# (interrupted install) is removed and rebuilt. Prints the binary path last.
set -euo pipefail

CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
CACHE="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
VENV="$CACHE/checkov-$CHECKOV_VERSION"
PYTHON="${PYTHON:-python3}"

if [ -f "$VENV/.installed" ] && "$VENV/bin/checkov" --version >/dev/null 2>&1; then
    echo "install-checkov: checkov $CHECKOV_VERSION already installed in $VENV"
    echo "$VENV/bin/checkov"
    exit 0
fi

echo "install-checkov: creating venv $VENV"
rm -rf "$VENV"
mkdir -p "$CACHE"
"$PYTHON" -m venv "$VENV"
echo "install-checkov: upgrading pip"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
echo "install-checkov: installing checkov==$CHECKOV_VERSION (takes a minute or two)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION"
installed="$("$VENV/bin/checkov" --version)"
echo "install-checkov: checkov $installed ready"
touch "$VENV/.installed"
echo "$VENV/bin/checkov"
