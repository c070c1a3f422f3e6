"""A small but complete cluster file for the configuration tests, and the helpers that write,
edit and load it.

The line numbers below are counted by hand from ``BASE``; edits that replace one line with one
line keep them valid.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kimi.config import ConfigError, load_cluster

BASE = """\
name: t
executor: local
nodes:
  - {name: n1, host: 127.0.0.1, gpus: 8}
  - {name: n2, host: 127.0.0.1, gpus: 8}
  - {name: n3, host: 127.0.0.1, gpus: 8}
  - {name: n4, host: 127.0.0.1, gpus: 8}
deployment:
  replicas: 2
  nodes_per_replica: 2
layouts:
  tp16: {tp: 16, pp: 1, ep: 4}
  pp2: {tp: 8, pp: 2, ep: 8}
server:
  model_path: /models/m
  args:
    chunked-prefill-size: 8192
router:
  node: n1
workload:
  dataset: /data/d.jsonl
  num_requests: 4
  input_len: 16
  output_len: 8
  concurrency: 2
slo:
  ttft_p95: 30s
"""
# Hand-counted line numbers in BASE.
L_NODE_N2 = 5
L_DEPLOYMENT = 8
L_REPLICAS = 9
L_NODES_PER_REPLICA = 10
L_LAYOUTS = 11
L_TP16 = 12
L_PP2 = 13
L_SERVER = 14
L_ROUTER_NODE = 19
L_WORKLOAD = 20
L_NUM_REQUESTS = 22
L_INPUT_LEN = 23
L_SLO = 26


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def edit(old: str, new: str, text: str = BASE) -> str:
    """Replace one exact, unique piece of ``text``."""
    assert text.count(old) == 1, f"{old!r} must occur exactly once"
    return text.replace(old, new)


def load_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    return path, str(info.value)
