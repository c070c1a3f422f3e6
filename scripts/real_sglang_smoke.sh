#!/usr/bin/env bash
# The mission's command against REAL SGLang on one GPU: two `sglang.launch_server` replicas of a
# tiny Llama with random weights behind the real SGLang Router, the harness attached to it.
#
#   scripts/real_sglang_smoke.sh [--check] [WORK_DIR]
#
# Installs SGLang 0.5.9 into WORK_DIR/venv-sglang and this project into WORK_DIR/venv-kimi (pip;
# nothing but the package index is needed), starts replica 1 then replica 2 (one GPU is shared:
# SGLang sizes its KV cache from the memory free when it starts, so they start one after the
# other with growing --mem-fraction-static), each with --enable-metrics, then the router
# (round_robin), reads each replica's /metrics, runs
#   pytest tests/perf --layout=tp32 --cluster clusters/real-smoke.yaml --kimi-endpoint ROUTER
# reads /metrics again, and checks: every request succeeded; each record's prompt tokens equal
# the shipped tokenizer's count of its prompt; completion tokens equal the requested output;
# the replicas' own counters (sglang:num_requests_total, prompt_tokens_total,
# generation_tokens_total) add up to the records; both replicas served requests; the harness's
# report does not claim one replica served everything; nothing is left running afterwards.
# Writes WORK_DIR/result.md (and result.json). Exit status 0 only if every check passed.
#
# --check: no GPU, no install, nothing started: validate the inputs (model config, tokenizer,
# cluster file, prompts, free ports) and print the exact commands a run would use.
#
# Environment: PYTHON (python3) makes the venvs; SGLANG_PYTHON / KIMI_PYTHON use existing
# interpreters instead of installing; GPU (0); PORT_BASE (30100: replicas on +1, +2, router on
# +10, its metrics on +11); MEM_FRACTIONS ("0.2 0.45"); STARTUP_TIMEOUT_S (900);
# EXTRA_SERVER_ARGS, appended to both servers' flags (e.g. "--attention-backend triton
# --sampling-backend pytorch" where FlashInfer's kernels will not build).
# NOT YET RUN ON A GPU: see docs/real-sglang.md.
set -euo pipefail

MODE=run
if [[ ${1:-} == --check ]]; then
    MODE=check
    shift
fi
if [[ $# -gt 1 || ${1:-} == -* ]]; then
    echo "usage: $0 [--check] [WORK_DIR]" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mkdir -p "${1:-${TMPDIR:-/tmp}/kimi-real-smoke}" && cd "${1:-${TMPDIR:-/tmp}/kimi-real-smoke}" && pwd)
PYTHON=${PYTHON:-python3}
GPU=${GPU:-0}
PORT_BASE=${PORT_BASE:-30100}
read -r -a FRACTIONS <<<"${MEM_FRACTIONS:-0.2 0.45}"
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-900}
SGLANG_VERSION=0.5.9
MODEL=$ROOT/pytest_kimi/data/tiny-model
CLUSTER=clusters/real-smoke.yaml
PROMPTS=$ROOT/clusters/real-smoke-prompts.jsonl
LAYOUT=tp32
REPLICA_PORTS=($((PORT_BASE + 1)) $((PORT_BASE + 2)))
ROUTER_PORT=$((PORT_BASE + 10))
ROUTER_METRICS_PORT=$((PORT_BASE + 11))
ROUTER_URL=http://127.0.0.1:$ROUTER_PORT
SGLANG_PY=${SGLANG_PYTHON:-$WORK/venv-sglang/bin/python}
KIMI_PY=${KIMI_PYTHON:-$WORK/venv-kimi/bin/python}

# Never let anything reach a model hub: the model and tokenizer are the shipped files.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9

server_cmd() { # replica index (0, 1)
    local i=$1
    echo env CUDA_VISIBLE_DEVICES="$GPU" "$SGLANG_PY" -m sglang.launch_server \
        --model-path "$MODEL" --tokenizer-path "$MODEL" --load-format dummy \
        --host 127.0.0.1 --port "${REPLICA_PORTS[$i]}" --enable-metrics \
        --mem-fraction-static "${FRACTIONS[$i]}" --max-total-tokens 65536 \
        --context-length 4096 --disable-cuda-graph --random-seed "$((i + 1))" ${EXTRA_SERVER_ARGS:-}
}
router_cmd() {
    echo "$KIMI_PY" -m smg.launch_router \
        --worker-urls "http://127.0.0.1:${REPLICA_PORTS[0]}" "http://127.0.0.1:${REPLICA_PORTS[1]}" \
        --policy round_robin --host 127.0.0.1 --port "$ROUTER_PORT" \
        --prometheus-host 127.0.0.1 --prometheus-port "$ROUTER_METRICS_PORT"
}
pytest_cmd() {
    echo "$KIMI_PY" -m pytest tests/perf --layout=$LAYOUT --cluster $CLUSTER \
        --kimi-endpoint "$ROUTER_URL" --kimi-report-dir "$WORK/reports" -p no:cacheprovider
}

check_inputs() {
    local py=$1 failed=0 f
    for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json; do
        [[ -s $MODEL/$f ]] || { echo "missing: $MODEL/$f" >&2; failed=1; }
    done
    [[ -s $ROOT/$CLUSTER ]] || { echo "missing: $ROOT/$CLUSTER" >&2; failed=1; }
    [[ -s $PROMPTS ]] || { echo "missing: $PROMPTS" >&2; failed=1; }
    [[ ${#FRACTIONS[@]} -eq 2 ]] || { echo "MEM_FRACTIONS needs two values" >&2; failed=1; }
    [[ $failed -eq 0 ]] || return 1
    "$py" - "$MODEL" "$ROOT/$CLUSTER" "$LAYOUT" "${REPLICA_PORTS[@]}" "$ROUTER_PORT" \
        "$ROUTER_METRICS_PORT" <<'PY'
import json, socket, sys
from pathlib import Path

model, cluster, layout, *ports = sys.argv[1:]
config = json.loads(Path(model, "config.json").read_text())
need = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
for key, value in need.items():
    assert config.get(key) == value, f"config.json: {key} is {config.get(key)!r}, want {value!r}"
assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"], "head_dim"
vocab = json.loads(Path(model, "tokenizer.json").read_text())["model"]["vocab"]
assert len(vocab) == config["vocab_size"], f"tokenizer has {len(vocab)} ids, config {config['vocab_size']}"
try:
    from pytest_kimi.config import load_cluster
except ImportError:
    print("note: pytest_kimi not importable here; cluster file not validated")
else:
    loaded = load_cluster(cluster)
    assert layout in loaded.layouts, f"{cluster} has no layout {layout}"
for port in map(int, ports):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sys.exit(f"port {port} is in use (set PORT_BASE)")
print(f"inputs ok: {config['architectures'][0]} {config['num_hidden_layers']} layers, "
      f"vocab {config['vocab_size']}; ports {', '.join(ports)} free")
PY
}

print_commands() {
    echo "# install (unless SGLANG_PYTHON / KIMI_PYTHON are set)"
    echo "$PYTHON -m venv $WORK/venv-sglang && $WORK/venv-sglang/bin/pip install sglang==$SGLANG_VERSION"
    echo "$PYTHON -m venv $WORK/venv-kimi && $WORK/venv-kimi/bin/pip install -e '$ROOT[test]'"
    echo "# replica 1, then (once healthy) replica 2"
    server_cmd 0
    server_cmd 1
    echo "# router"
    router_cmd
    echo "# the mission's command, attached (from $ROOT)"
    pytest_cmd
}

if [[ $MODE == check ]]; then
    check_inputs "${KIMI_PYTHON:-$PYTHON}"
    print_commands
    exit 0
fi

# ---------------------------------------------------------------------------- real run
mkdir -p "$WORK/logs"
PGIDS=()
NAMES=()
LEFTOVERS=""

cleanup() { # TERM every group we started, KILL what is left after 30 s, say what survived
    local rc=$? i pgid deadline
    trap - EXIT INT TERM
    for pgid in "${PGIDS[@]}"; do kill -TERM -- "-$pgid" 2>/dev/null || true; done
    deadline=$((SECONDS + 30))
    for pgid in "${PGIDS[@]}"; do
        while kill -0 -- "-$pgid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
        kill -KILL -- "-$pgid" 2>/dev/null || true
    done
    sleep 1
    for i in "${!PGIDS[@]}"; do
        if kill -0 -- "-${PGIDS[$i]}" 2>/dev/null; then
            LEFTOVERS+="${NAMES[$i]} (pgid ${PGIDS[$i]}) "
        fi
    done
    if command -v nvidia-smi >/dev/null; then # a GPU process of ours outlived its group?
        for pgid in "${PGIDS[@]}"; do
            for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
                [[ $(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ') == "$pgid" ]] &&
                    LEFTOVERS+="gpu pid $pid "
            done
        done
    fi
    if [[ -n $LEFTOVERS ]]; then
        echo "LEFT RUNNING: $LEFTOVERS" | tee -a "$WORK/result.md" >&2
        rc=1
    else
        echo "- nothing left running: PASS" >>"$WORK/result.md"
    fi
    exit "$rc"
}

start() { # name, command...: in its own session (pgid = pid), output to logs/NAME.log
    local name=$1
    shift
    setsid "$@" >"$WORK/logs/$name.log" 2>&1 </dev/null &
    PGIDS+=($!)
    NAMES+=("$name")
    echo "started $name (pgid $!)"
}

wait_http() { # name, url: until it answers 200; fail at once if the process died
    local name=$1 url=$2 i deadline=$((SECONDS + STARTUP_TIMEOUT_S))
    for i in "${!NAMES[@]}"; do [[ ${NAMES[$i]} == "$name" ]] && local pgid=${PGIDS[$i]}; done
    until "$KIMI_PY" -c "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=5)" \
        "$url" 2>/dev/null; do
        if ! kill -0 "$pgid" 2>/dev/null; then
            echo "$name exited during start-up; end of its log:" >&2
            tail -n 40 "$WORK/logs/$name.log" >&2
            return 1
        fi
        if ((SECONDS > deadline)); then
            echo "$name not ready at $url after ${STARTUP_TIMEOUT_S}s" >&2
            return 1
        fi
        sleep 2
    done
}

install() {
    if [[ -z ${SGLANG_PYTHON:-} ]] && ! "$SGLANG_PY" -c "import sglang" 2>/dev/null; then
        "$PYTHON" -m venv "$WORK/venv-sglang"
        "$SGLANG_PY" -m pip install --quiet --disable-pip-version-check "sglang==$SGLANG_VERSION"
    fi
    if [[ -z ${KIMI_PYTHON:-} ]] && ! "$KIMI_PY" -c "import pytest_kimi, tokenizers" 2>/dev/null; then
        "$PYTHON" -m venv "$WORK/venv-kimi"
        "$KIMI_PY" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test]"
    fi
}

scrape() { # label: each replica's and the router's /metrics into WORK/metrics-LABEL-*.txt
    local i
    for i in 0 1; do
        "$KIMI_PY" -c "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())" \
            "http://127.0.0.1:${REPLICA_PORTS[$i]}/metrics" >"$WORK/metrics-$1-replica$i.txt"
    done
    "$KIMI_PY" -c "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())" \
        "http://127.0.0.1:$ROUTER_METRICS_PORT/metrics" >"$WORK/metrics-$1-router.txt" || true
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
rm -rf "$WORK/reports" "$WORK/result.md" "$WORK/result.json"
install
check_inputs "$KIMI_PY"
{
    echo "# real SGLang smoke: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo "- gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
    echo "- sglang: $("$SGLANG_PY" -c 'import sglang; print(sglang.__version__)' 2>&1 | tail -n 1)"
    echo "- router: smg $("$KIMI_PY" -c 'from importlib import metadata; print(metadata.version("smg"))' 2>&1 | tail -n 1)"
    echo "- commands:"
    print_commands | sed 's/^/    /'
} >"$WORK/result.md"
cd "$ROOT"
start replica1 $(server_cmd 0)
wait_http replica1 "http://127.0.0.1:${REPLICA_PORTS[0]}/health"
start replica2 $(server_cmd 1)
wait_http replica2 "http://127.0.0.1:${REPLICA_PORTS[1]}/health"
start router $(router_cmd)
wait_http router "$ROUTER_URL/readiness"
scrape before
set +e
$(pytest_cmd) 2>&1 | tee "$WORK/logs/pytest.log"
PYTEST_RC=${PIPESTATUS[0]}
set -e
scrape after
set +e
"$KIMI_PY" - "$WORK" "$PROMPTS" "$MODEL/tokenizer.json" "$LAYOUT" "$PYTEST_RC" <<'PY' | tee -a "$WORK/result.md"
"""Check the run's records against the shipped tokenizer and the replicas' own counters."""
import glob, json, sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

work, prompts, tokenizer, layout, pytest_rc = sys.argv[1:]
work = Path(work)
checks = []


def check(name, ok, detail=""):
    checks.append({"check": name, "pass": bool(ok), "detail": str(detail)})
    print(f"- {name}: {'PASS' if ok else 'FAIL'} {detail}".rstrip())


def counters(path):
    names = ("sglang:num_requests", "sglang:prompt_tokens", "sglang:generation_tokens")
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(Path(path).read_text()):
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            if base in out and sample.name.endswith("_total"):
                out[base] += sample.value
    return out


check("pytest exit status 0", pytest_rc == "0", f"(exit {pytest_rc})")
found = sorted(glob.glob(str(work / "reports" / "*" / layout / "records.jsonl")))
if not found:
    check("records written", False, "no records.jsonl under reports/")
    sys.exit(1)
records = [json.loads(line) for line in Path(found[-1]).read_text().splitlines() if line]
text = {}
for line in Path(prompts).read_text().splitlines():
    row = json.loads(line)
    text[row["question_id"]] = row["turns"][0]
tok = Tokenizer.from_file(tokenizer)
check("every request succeeded", all(r["success"] for r in records), f"({len(records)} records)")
wrong_in = [r["prompt_id"] for r in records
            if r.get("prompt_tokens") != len(tok.encode(text[r["prompt_id"]]).ids)]
check("prompt tokens = the tokenizer's count", not wrong_in, wrong_in[:5])
wrong_out = [r["prompt_id"] for r in records
             if r.get("completion_tokens") != r["max_output_tokens"]
             or sum(c["tokens"] for c in r["chunks"]) != r["max_output_tokens"]]
check("completion tokens = requested = streamed", not wrong_out, wrong_out[:5])
delta = []
for i in (0, 1):
    before = counters(work / f"metrics-before-replica{i}.txt")
    after = counters(work / f"metrics-after-replica{i}.txt")
    delta.append({k: after[k] - before[k] for k in after})
total = {k: sum(d[k] for d in delta) for k in delta[0]}
check("replicas counted every request", total["sglang:num_requests"] == len(records),
      f"({total['sglang:num_requests']:g} counted, {len(records)} sent)")
check("replicas' prompt tokens = records'",
      total["sglang:prompt_tokens"] == sum(r["prompt_tokens"] or 0 for r in records),
      f"({total['sglang:prompt_tokens']:g})")
check("replicas' generation tokens = records'",
      total["sglang:generation_tokens"] == sum(r["completion_tokens"] or 0 for r in records),
      f"({total['sglang:generation_tokens']:g})")
split = [d["sglang:num_requests"] for d in delta]
check("round robin: both replicas served, evenly", min(split) > 0 and max(split) - min(split) <= 1,
      f"(requests per replica by counters: {split[0]:g}, {split[1]:g})")
summary = json.loads(Path(found[-1]).with_name("summary.json").read_text())
notes = summary.get("notes", [])
claim = [n for n in notes if "only 1 of 2 replicas" in n or n.startswith("requests per replica: ?")]
check("the report does not claim a one-replica split", not claim, claim)
(work / "result.json").write_text(json.dumps({"checks": checks, "notes": notes}, indent=2))
sys.exit(0 if all(c["pass"] for c in checks) else 1)
PY
CHECK_RC=${PIPESTATUS[0]}
set -e
echo "result: $WORK/result.md"
exit "$CHECK_RC"
