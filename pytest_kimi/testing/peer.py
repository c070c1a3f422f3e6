"""sglang.bench_serving, the peer tool whose figures ours must match: where it is, how to
install it, how to run it offline, and how to give it exactly our prompts.

The peer lives in its own venv (``.venv-bench-serving`` at the checkout's root, built by
``scripts/install_bench_serving.sh``) so its pins never touch the project's; the variable
``KIMI_BENCH_SERVING_PYTHON`` names the interpreter of an existing install instead. Used by
the conformance tests and ``benchmarks/client_accuracy.py`` (a source checkout, not a wheel).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install_bench_serving.sh"
DEFAULT_VENV = ROOT / ".venv-bench-serving"
PYTHON_ENV_VAR = "KIMI_BENCH_SERVING_PYTHON"
OBSERVER = Path(__file__).with_name("bench_observed.py")  # run by the peer's interpreter


def offline_env() -> dict[str, str]:
    """Environment for peer processes: no model hub, no proxy between us and loopback."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def import_error(python: Path) -> str | None:
    """None when ``python`` imports sglang.bench_serving, else what went wrong."""
    if not python.is_file():
        return f"{python} does not exist"
    try:
        done = subprocess.run(
            [str(python), "-c", "import sglang.bench_serving"],
            env=offline_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return None
    return (done.stderr or done.stdout).strip()[-3000:] or f"exit code {done.returncode}"


def install(venv: Path = DEFAULT_VENV, timeout_s: float | None = None) -> tuple[int, str]:
    """Run the install script (a no-op when the venv is complete); one installer at a time
    (xdist workers, two checkouts' runs) by locking the script. Returns (exit code, output)."""
    # pip may need the proxy settings that offline_env() strips
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    with INSTALL_SCRIPT.open("rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(
                ["bash", str(INSTALL_SCRIPT), str(venv)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout_s,
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return done.returncode, done.stdout


def write_custom_dataset(path: Path, texts: Sequence[str], seed: int) -> None:
    """bench_serving ``custom`` rows, written so that its ``random.shuffle`` yields ``texts``.

    bench_serving calls ``random.seed(seed)`` and then ``random.shuffle(rows)`` with nothing
    in between drawing from ``random``: row ``order[k]`` of the file becomes request ``k``.
    """
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    rows: list[str] = [""] * len(texts)
    for k, position in enumerate(order):
        rows[position] = texts[k]
    with path.open("w", encoding="utf-8") as fh:
        for text in rows:
            conversation = [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "unused: the output length is fixed"},
            ]
            fh.write(json.dumps({"conversations": conversation}) + "\n")


def bench_serving_argv(
    python: Path,
    base_url: str,
    dataset: Path,
    output: Path,
    *,
    num_prompts: int,
    output_len: int,
    concurrency: int,
    seed: int,
    observe: Path | None = None,
) -> list[str]:
    """bench_serving on native ``/generate`` (streamed) with our prompts (``custom`` rows),
    a fixed output length, one warm-up request and per-request details in ``output``. With
    ``observe``, run through :mod:`pytest_kimi.testing.bench_observed`, which also writes each
    request's start and latency there."""
    tokenizer = str(TOKENIZER_DIR)
    run = ["-m", "sglang.bench_serving"] if observe is None else [str(OBSERVER), str(observe)]
    return [
        str(python), *run,
        "--backend", "sglang",
        "--base-url", base_url,
        "--model", tokenizer,
        "--tokenizer", tokenizer,
        "--dataset-name", "custom",
        "--dataset-path", str(dataset),
        "--num-prompts", str(num_prompts),
        "--sharegpt-output-len", str(output_len),
        "--request-rate", "inf",
        "--max-concurrency", str(concurrency),
        "--warmup-requests", "1",
        "--seed", str(seed),
        "--disable-tqdm",
        "--output-file", str(output),
        "--output-details",
    ]  # fmt: skip
