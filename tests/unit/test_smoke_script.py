"""scripts/real_sglang_smoke.sh without a GPU: its dry mode, its inputs, and a rehearsal.

The real run needs a GPU and SGLang 0.5.9 (docs/real-sglang.md); here we check what can be
checked without one: ``--check`` validates the shipped model config, tokenizer, cluster file
and prompts and prints the exact commands; the tiny model config is one transformers reads as
a Llama; and a rehearsal runs the whole script with the mock standing in for SGLang's
``launch_server``, so its process handling, attach run, record checks and clean-up are
exercised (the real router is used as in the real run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kimi.testing.peer import DEFAULT_VENV, install

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_sglang_smoke.sh"
MODEL = ROOT / "pytest_kimi" / "data" / "tiny-model"
BENCH_PYTHON = DEFAULT_VENV / "bin" / "python"  # the conformance tests' sglang venv


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "KIMI_PYTHON": sys.executable, **extra}


def test_check_mode_validates_inputs_and_prints_the_commands(tmp_path: Path):
    done = subprocess.run(
        ["bash", str(SCRIPT), "--check", str(tmp_path / "work")],
        env=_env(PORT_BASE="30700"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "inputs ok: LlamaForCausalLM 2 layers, vocab 1004" in out
    assert "pip install sglang==0.5.9" in out
    servers = [line for line in out.splitlines() if "-m sglang.launch_server" in line]
    assert len(servers) == 2
    for port, line in zip((30701, 30702), servers, strict=True):
        assert f"--model-path {MODEL} " in line and "--load-format dummy" in line
        assert f"--port {port} " in line and "--enable-metrics" in line
    assert "--worker-urls http://127.0.0.1:30701 http://127.0.0.1:30702 --policy round_robin" in out
    assert (
        "-m pytest tests/perf --layout=tp32 --cluster clusters/real-smoke.yaml "
        "--kimi-endpoint http://127.0.0.1:30710" in out
    )
    assert not (tmp_path / "work" / "venv-sglang").exists()  # nothing installed


def test_check_mode_refuses_a_bad_invocation(tmp_path: Path):
    done = subprocess.run(
        ["bash", str(SCRIPT), "--check", "a", "b"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "usage:" in done.stderr


def test_the_tiny_model_config_is_a_llama_its_tokenizer_fits():
    config = json.loads((MODEL / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    vocab = json.loads((MODEL / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == config["vocab_size"]
    assert config["eos_token_id"] == vocab["</s>"] and config["bos_token_id"] == vocab["<s>"]


def test_transformers_reads_the_tiny_model_as_llama():
    code, output = install()  # sglang 0.5.9's venv (transformers included); a no-op when built
    assert code == 0, output
    code = (
        "import sys; from transformers import AutoConfig; "
        "c = AutoConfig.from_pretrained(sys.argv[1]); "
        "print(type(c).__name__, c.head_dim, c.num_key_value_heads, c.vocab_size)"
    )
    done = subprocess.run(
        [str(BENCH_PYTHON), "-c", code, str(MODEL)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-4:] == ["LlamaConfig", "64", "2", "1004"]


FAKE_SGLANG_PYTHON = """#!/usr/bin/env bash
# an SGLang venv's python, played by the mock: "-m sglang.launch_server ARGS" runs the mock
if [[ $1 == -c ]]; then exec "{python}" "$@"; fi
exec "{python}" -m pytest_kimi.mock.launch_server "${{@:3}}" --mock-time-scale 50
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_rehearsal_with_the_mock_runs_checks_and_leaves_nothing(tmp_path: Path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_SGLANG_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    work = tmp_path / "work"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(work)],
        env=_env(SGLANG_PYTHON=str(fake), PORT_BASE="30800", STARTUP_TIMEOUT_S="60"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = (work / "result.md").read_text()
    for passed in (
        "pytest exit status 0: PASS",
        "every request succeeded: PASS (9 records)",
        "prompt tokens = the tokenizer's count: PASS",
        "completion tokens = requested = streamed: PASS",
        "replicas counted every request: PASS (9 counted, 9 sent)",
        "replicas' prompt tokens = records': PASS (2304)",
        "replicas' generation tokens = records': PASS (288)",
        "round robin: both replicas served, evenly: PASS",
        "nothing left running: PASS",
    ):
        assert passed in result, done.stdout[-3000:] + done.stderr[-2000:]
    checks = json.loads((work / "result.json").read_text())["checks"]
    assert [c for c in checks if not c["pass"]] == []  # the mock's counters are SGLang's
    assert done.returncode == 0
