#!/usr/bin/env bash
# Install the open-loop benchmark's peers, each in its own venv (benchmarks/dispatch_delay.py):
#   .venv-peer-guidellm         guidellm 0.8.1 on Python 3.11, with torch's CPU wheel (a plain
#                               install resolves torch with several GB of CUDA wheels): from
#                               pip's find-links where a wheel folder holds it, else from
#                               TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu)
#   .venv-peer-inference-perf   inference-perf 0.7.0 on Python 3.12 (every release needs >= 3.12)
# Not CI's: only the benchmark uses them. Idempotent. ~2-4 min with the network.
#
#   bash scripts/install_peers.sh
#   PYTHON312=/usr/bin/python3.12 bash scripts/install_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON311=${PYTHON311:-python3.11}
PYTHON312=${PYTHON312:-python3.12}
"$PYTHON312" -V >/dev/null 2>&1 || PYTHON312=/root/.pyenv/versions/3.12.1/bin/python
torch_index=()
[[ -n "${TORCH_INDEX:-}" ]] && torch_index=(--extra-index-url "$TORCH_INDEX")

install() {  # VENV PYTHON MODULE VERSION PIP-ARGS...
    local venv=$1 python=$2 module=$3 version=$4
    shift 4
    if [[ "$("$venv/bin/python" -c "from importlib import metadata; print(metadata.version('$module'))" 2>/dev/null)" == "$version" ]]; then
        echo "$module $version already installed in $venv"
        return
    fi
    local start=$SECONDS
    rm -rf "$venv"
    "$python" -m venv "$venv"
    echo '*' >"$venv/.gitignore"   # out of git and of `ruff check .`
    "$venv/bin/pip" install -q --disable-pip-version-check "$@"
    echo "installed $module $version in $venv in $((SECONDS - start)) s"
}

install .venv-peer-guidellm "$PYTHON311" guidellm 0.8.1 \
    guidellm==0.8.1 "torch==2.13.0+cpu" "${torch_index[@]}"
install .venv-peer-inference-perf "$PYTHON312" inference-perf 0.7.0 inference-perf==0.7.0
