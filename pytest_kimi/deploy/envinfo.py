"""What each node runs: hostname, Python, SGLang, GPUs and driver, the variables we set.

Collected once per layout after bring-up, through the same executor that started the
processes, into ``manifest.json``: the numbers of a run are only as trustworthy as the record
of what produced them. Values of variables that look secret are never written.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from pytest_kimi.config import Node
from pytest_kimi.deploy.executor import Executor
from pytest_kimi.deploy.secrets import redact_env

_PROBE = """\
import json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable}
for name in ("sglang", "sglang_router", "pytest_kimi", "torch"):
    try:
        module = __import__(name)
        out[name] = getattr(module, "__version__", "installed")
    except Exception:
        out[name] = None
print(json.dumps(out))
"""


def node_environment(
    executor: Executor, node: Node, python: tuple[str, ...], env: Mapping[str, str]
) -> dict[str, Any]:
    """Probe one node; a failed probe is recorded as such, never raised."""
    out: dict[str, Any] = {"node": node.name, "host": node.host, "env_set": redact_env(env)}
    probes = {
        "hostname": "hostname",
        "python": shlex.join([*python, "-c", _PROBE]),
        "nvidia_smi_l": "nvidia-smi -L 2>/dev/null || echo 'nvidia-smi: not available'",
        "driver": "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null"
        " | head -n 1 || true",
    }
    for key, command in probes.items():
        try:
            code, text = executor.run(node, command, 60)
        except Exception as exc:
            out[key] = f"(probe failed: {exc})"
            continue
        text = text.strip()
        if key == "python":
            try:
                out["software"] = json.loads(text.splitlines()[-1])
            except (ValueError, IndexError):
                out["software"] = f"(probe failed, exit {code}: {text[-300:]})"
        else:
            out[key] = text or None
    return out
