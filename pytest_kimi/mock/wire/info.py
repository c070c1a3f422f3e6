"""``/get_server_info`` and ``/get_model_info`` as the mock's wire version answers them.

The keys, their order and every value the mock does not model come from the version's
recording (a real server of that version on the tiny model); over them go the mock's own:
its parsed flags (``tp_size``, ``port``, ``model_path``, ...: a flag left unset keeps the
recorded value, which is what SGLang resolved it to), the model's type from its
``config.json``, and what its scheduler knows (token capacity, running-request limit, the
average accept length of speculative decoding).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from pytest_kimi.mock.wire import recording


def _overlay(recorded: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``recorded`` with the mock's value for each key it has a value for."""
    out = copy.deepcopy(recorded)
    for key, value in own.items():
        if key in out and value is not None:
            out[key] = value
    return out


def max_total_tokens(version: str, flag: int | None) -> int:
    """The KV pool in tokens: ``--max-total-tokens``, else the recorded server's (the mock
    has no memory to size one from)."""
    return int(flag) if flag else int(recording(version).server_info["max_total_num_tokens"])


def server_info(version: str, own: dict[str, Any], scheduler: dict[str, Any]) -> dict[str, Any]:
    """``/get_server_info``: ``{**server_args, **scheduler_info, internal_states, version}``.
    ``own``: the mock's parsed flags; ``scheduler``: ``max_total_num_tokens``,
    ``max_running_requests`` and, when it speculates, ``avg_spec_accept_length``."""
    rec = recording(version)
    own = {**own, "tokenizer_path": own.get("tokenizer_path") or own["model_path"]}
    info = _overlay(rec.server_info, own)  # every key in the recorded order
    if "launch_command" in info:
        info["launch_command"] = " ".join(sys.argv[1:])
    total = scheduler["max_total_num_tokens"]
    info["status"] = "ready"
    info["max_total_num_tokens"] = total
    info["max_req_input_len"] = min(int(info["context_length"]) - 1, total - 1) - 5
    state = _overlay(rec.server_info["internal_states"][0], own)
    if isinstance(state.get("last_gen_throughput"), float):
        state["last_gen_throughput"] = 0.0
    if isinstance(state.get("memory_usage"), dict):
        state["memory_usage"]["token_capacity"] = total
    if "effective_max_running_requests_per_dp" in state:
        state["effective_max_running_requests_per_dp"] = scheduler["max_running_requests"]
    if "avg_spec_accept_length" in scheduler:  # Scheduler.get_internal_state, when speculating
        state["avg_spec_accept_length"] = scheduler["avg_spec_accept_length"]
    info["internal_states"] = [state]
    info["version"] = f"{version}-kimi-mock"
    return info


def _model_config(model_path: str) -> dict[str, Any]:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def model_info(version: str, own: dict[str, Any]) -> dict[str, Any]:
    """``/get_model_info``: the recorded keys, the mock's paths, names and modes, and the
    model type and architectures of the ``config.json`` in ``--model-path``."""
    info = _overlay(recording(version).model_info, own)
    info["tokenizer_path"] = own.get("tokenizer_path") or own["model_path"]
    config = _model_config(str(own["model_path"]))
    for key in ("model_type", "architectures"):
        if key in config:
            info[key] = config[key]
    return info
