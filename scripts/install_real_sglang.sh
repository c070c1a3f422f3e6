#!/usr/bin/env bash
# Install a real SGLang server that runs on a CPU (no GPU, no CUDA libraries) into its own venv.
#
#   scripts/install_real_sglang.sh VERSION [DIR]      # VERSION: 0.5.9 or 0.5.23
#
# DIR defaults to .venv-sglang-VERSION at the repository root. What goes in:
#   1. torch 2.13.0, CPU build (pinned as torch==2.13.0+cpu: a CUDA build can never slip in);
#   2. sglang==VERSION with --no-deps (its own requirements are the GPU stack);
#   3. exactly the packages a Llama server imports on a CPU, at the versions this SGLang pins
#      (scripts/real_sglang/requirements-VERSION.txt, --no-deps: nothing else is resolved);
#   4. two import-only stand-ins, sgl_kernel and torchvision (scripts/real_sglang/standins:
#      their docstring says what they stand for and why that is safe).
# The venv serves pytest_kimi/data/tiny-model with --load-format dummy: clusters/cpu-sglang.yaml,
# docs/real-sglang.md. Reused when complete: a second call checks the venv and returns.
#
# Environment: PYTHON (python3, 3.10-3.12) makes the venv. torch 2.13.0+cpu comes from pip's
# configured indexes (these machines have it in /opt/wheels); elsewhere point pip at the CPU
# wheels, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 VERSION [DIR]   (VERSION: 0.5.9 or 0.5.23)" >&2
    exit 2
fi
VERSION=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$ROOT/scripts/real_sglang
REQUIREMENTS=$HERE/requirements-$VERSION.txt
if [[ ! -f $REQUIREMENTS ]]; then
    echo "error: no requirements for SGLang $VERSION ($REQUIREMENTS); supported:" \
        "$(cd "$HERE" && ls requirements-*.txt | sed 's/requirements-//; s/\.txt//' | tr '\n' ' ')" >&2
    exit 2
fi
VENV=${2:-$ROOT/.venv-sglang-$VERSION}
PYTHON=${PYTHON:-python3}
TORCH=torch==2.13.0+cpu

# Never let a check or an install reach a model hub.
export HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9 TRANSFORMERS_NO_ADVISORY_WARNINGS=1

# What a complete venv holds: this version, these requirements, these stand-ins.
stamp() {
    {
        echo "sglang==$VERSION $TORCH"
        cat "$REQUIREMENTS"
        cat "$HERE"/standins/kimi_standin.py "$HERE"/standins/*/__init__.py
    } | sha256sum | cut -d' ' -f1
}
STAMP_FILE=$VENV/.kimi-real-sglang

check() {
    "$VENV/bin/python" - "$VERSION" <<'EOF'
import importlib.util
import sys
from importlib.metadata import version

import sgl_kernel
import torch
import torchvision

import sglang.launch_server  # noqa: F401  (the server's whole import chain)

if importlib.util.find_spec("sglang.benchmark") is not None:  # 0.5.15 on
    import sglang.benchmark.serving  # noqa: F401  (the statistics conformance's peer)

assert version("sglang") == sys.argv[1], version("sglang")
assert torch.__version__.endswith("+cpu"), torch.__version__
assert getattr(sgl_kernel, "__kimi_standin__", False), "sgl_kernel is not the stand-in"
assert getattr(torchvision, "__kimi_standin__", False), "torchvision is not the stand-in"
EOF
}

if [[ -x $VENV/bin/python && -f $STAMP_FILE && $(cat "$STAMP_FILE") == "$(stamp)" ]]; then
    echo "SGLang $VERSION (CPU) already installed in $VENV"
    exit 0
fi

start=$SECONDS
"$PYTHON" -m venv "$VENV"
# Keep the venv out of git (and so out of `ruff check .`), as Python >= 3.13's venv does.
[[ -e $VENV/.gitignore ]] || echo '*' >"$VENV/.gitignore"
rm -f "$STAMP_FILE"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "$TORCH"
# pip may print a "dependency conflicts" notice about sglang's skipped GPU requirements: expected.
"${pip[@]}" --no-deps "sglang==$VERSION" -r "$REQUIREMENTS"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$site/sgl_kernel" "$site/torchvision"
cp -r "$HERE"/standins/kimi_standin.py "$HERE"/standins/sgl_kernel "$HERE"/standins/torchvision "$site/"

if ! check; then
    echo "error: SGLang $VERSION in $VENV does not import after the install (above)" >&2
    exit 1
fi
stamp >"$STAMP_FILE"
echo "installed SGLang $VERSION (CPU) into $VENV in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
