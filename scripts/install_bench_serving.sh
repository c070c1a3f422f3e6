#!/usr/bin/env bash
# Install the real `sglang.bench_serving` (sglang 0.5.9) into its own venv, without torch.
#
#   scripts/install_bench_serving.sh VENV_DIR
#
# Used by tests/conformance to compare this project's client with the peer everyone knows.
# A separate venv keeps sglang's pins (transformers==4.57.1, ...) out of the project's venv.
# `--no-deps` skips sglang's GPU stack (torch, flashinfer, sgl-kernel, ...): bench_serving
# imports only the packages below. Idempotent: does nothing when the venv already imports
# sglang.bench_serving. Takes ~1.5 min and ~700 MB on a 2-core machine.
#
# Environment: PYTHON (default python3) is the interpreter the venv is made from.
set -euo pipefail

if [[ $# -ne 1 || -z "$1" ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
VENV=$1
PYTHON=${PYTHON:-python3}

# Never let a check or an install reach a model hub.
export HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9 TRANSFORMERS_NO_ADVISORY_WARNINGS=1

check() {
    "$VENV/bin/python" -c "import sglang.bench_serving" >/dev/null 2>&1
}

# Keep the venv out of git (and so out of `ruff check .`), as Python >= 3.13's venv does.
ignore_venv() {
    [[ -e "$VENV/.gitignore" ]] || echo '*' >"$VENV/.gitignore"
}

if [[ -x "$VENV/bin/python" ]] && check; then
    ignore_venv
    echo "sglang.bench_serving already installed in $VENV"
    exit 0
fi

start=$SECONDS
"$PYTHON" -m venv "$VENV"
ignore_venv
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --no-deps sglang==0.5.9
# Versions verified together on Python 3.11. transformers is the version sglang 0.5.9 pins
# (it needs huggingface_hub < 1.0 and tokenizers < 0.23); pydantic is not in the brief's
# list but `import sglang` needs it (sglang/utils.py). pip prints a "dependency conflicts"
# notice about sglang's skipped GPU requirements: expected, not an error.
"${pip[@]}" \
    aiohttp==3.14.5 \
    numpy==2.4.6 \
    requests==2.34.2 \
    tqdm==4.70.1 \
    transformers==4.57.1 \
    huggingface_hub==0.36.2 \
    tokenizers==0.22.2 \
    pybase64==1.5.1 \
    IPython==9.18.1 \
    datasets==5.0.1 \
    pillow==13.0.0 \
    pydantic==2.14.4

if ! check; then
    echo "error: $VENV/bin/python cannot import sglang.bench_serving after install:" >&2
    "$VENV/bin/python" -c "import sglang.bench_serving" >&2 || true
    exit 1
fi
echo "installed sglang.bench_serving into $VENV in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
