#!/usr/bin/env bash
# Install one router package release into its own venv (the routers' real parsers and the
# routers themselves, for the tests that hold pytest-kimi against each supported router).
#
#   scripts/install_router.sh sglang-router==0.3.2 .venv-router-sglang-router-0.3.2
#   scripts/install_router.sh smg==1.13.0 .venv-router-smg-1.13.0
#
# Its own venv: sglang-router 0.3 installs a console script named `smg` too, so beside smg in
# one venv one of them would silently run as the other. The project's venv has smg only.
# Idempotent: does nothing when the venv already has that release. ~10-20 s.
set -euo pipefail

if [[ $# -ne 2 || "$1" != *==* ]]; then
    echo "usage: $0 PACKAGE==VERSION VENV_DIR" >&2
    exit 2
fi
SPEC=$1
VENV=$2
PACKAGE=${SPEC%%==*}
VERSION=${SPEC#*==}
PYTHON=${PYTHON:-python3}

installed() {
    [[ "$("$VENV/bin/python" -c "from importlib import metadata; print(metadata.version('$PACKAGE'))" 2>/dev/null)" == "$VERSION" ]]
}

if [[ -x "$VENV/bin/python" ]] && installed; then
    echo "$SPEC already installed in $VENV"
    exit 0
fi
start=$SECONDS
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
echo '*' >"$VENV/.gitignore"   # out of git and of `ruff check .`
"$VENV/bin/pip" install -q --disable-pip-version-check "$SPEC"
installed || { echo "$VENV does not have $SPEC after installing it" >&2; exit 1; }
echo "installed $SPEC in $VENV in $((SECONDS - start)) s"
