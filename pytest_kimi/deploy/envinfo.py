"""What each node runs: hostname, Python, SGLang, the router, GPUs and driver, our variables.

Collected once per layout after bring-up, through the same executor that started the
processes, into ``manifest.json``: the numbers of a run are only as trustworthy as the record
of what produced them. Values of variables that look secret are never written.

Versions are asked of the interpreter (and environment) that runs each process, not of
whatever Python the node has first on its PATH: a router started from another venv than the
servers is recorded as such. Each replica's SGLang also states its version over HTTP
(``/server_info`` ``version``), which is what actually answered.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from pytest_kimi.deploy.executor import Executor
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.secrets import redact_env

PACKAGES = ("sglang", "smg", "sglang_router", "pytest_kimi", "torch")
# the router packages: their metadata states the release (smg 1.13.0's __version__ says 1.1.0)
METADATA_FIRST = {"smg": "smg", "sglang_router": "sglang-router"}

# The module the process imports decides the version (a source checkout on PYTHONPATH wins
# over an installed wheel), so ask the module first and the package metadata only if the
# module has no __version__; the router packages the other way round. A package is found,
# not imported, where its own files assign ``__version__`` a literal (SGLang's _version.py,
# torch's version.py): importing SGLang 0.5.23 to ask takes 5 s of CPU, and four nodes asked
# at once on a loaded machine ran past the probe's minute. A router package is found, not
# imported (its import starts nothing, but takes a second).
_PROBE = """\
import json, platform, re, sys
from importlib import metadata, util
out = {"python": platform.python_version(), "executable": sys.executable}
first = %r
stated = re.compile(
    r"^__version__[ \\t]*(?::[^=\\n]*)?=[ \\t]*(?:\\w+[ \\t]*=[ \\t]*)?"
    r"['\\"]([^'\\"\\n]+)['\\"][ \\t]*(?:#.*)?$", re.M)
def literal(name):
    spec = util.find_spec(name)
    for where in (spec.submodule_search_locations or []) if spec else []:
        for file in ("_version.py", "version.py", "__init__.py"):
            try:
                found = stated.search(open(where + "/" + file, encoding="utf-8").read())
            except OSError:
                continue
            if found:
                return found.group(1)
    return None
for name in %r:
    if name in first:
        try:
            out[name] = metadata.version(first[name]) if util.find_spec(name) else None
        except Exception:
            out[name] = "installed" if util.find_spec(name) else None
        continue
    try:
        out[name] = literal(name)
    except Exception:
        out[name] = None
    if out[name] is not None:
        continue
    try:
        module = __import__(name)
    except Exception:
        out[name] = None
        continue
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = metadata.version(name.replace("_", "-"))
        except Exception:
            version = "installed"
    out[name] = str(version)
print(json.dumps(out))
"""


def probe_command(python: Sequence[str], packages: Sequence[str]) -> str:
    """The shell command that prints ``{"python": ..., package: version or None}`` as JSON.
    No environment on it: the executor runs it in the process's own environment
    (:meth:`~pytest_kimi.deploy.executor.Executor.run_as`)."""
    return shlex.join([*python, "-c", _PROBE % (METADATA_FIRST, tuple(packages))])


def software(
    executor: Executor,
    spec: ProcessSpec,
    python: Sequence[str] | None = None,
    timeout: float = 60,
    packages: Sequence[str] = PACKAGES,
) -> dict[str, Any] | str:
    """Versions as ``spec``'s process sees them (its interpreter, environment, setup lines
    and container); a failed probe is a string saying why."""
    command = probe_command(python or interpreter(spec), packages)
    try:
        code, text = executor.run_as(spec, command, timeout)
    except Exception as exc:
        return f"(probe failed: {exc})"
    try:
        found = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"(probe failed, exit {code}: {text.strip()[-300:]})"
    return found if isinstance(found, dict) else f"(probe failed: {text.strip()[-300:]})"


def interpreter(spec: ProcessSpec) -> tuple[str, ...]:
    """The wrapper and Python of a ``... python -m module ...`` command line (how every plan
    starts its processes); the first element otherwise."""
    argv = spec.argv
    return tuple(argv[: argv.index("-m")]) if "-m" in argv else tuple(argv[:1])


def router_version(executor: Executor, spec: ProcessSpec, timeout: float = 30) -> str:
    """``smg X.Y.Z`` (or ``sglang-router X.Y.Z``) as the router's own interpreter has it, or
    why unknown; for error messages, so never raises."""
    found = software(executor, spec, timeout=timeout, packages=tuple(METADATA_FIRST))
    if isinstance(found, str):
        return f"router version unknown {found}"
    for name, dist in METADATA_FIRST.items():
        if found.get(name):
            return f"{dist} {found[name]}"
    return "neither smg nor sglang-router is installed for the router's Python"


def node_environment(
    executor: Executor, spec: ProcessSpec, smi: Sequence[str] = ("nvidia-smi",)
) -> dict[str, Any]:
    """Probe the node of ``spec``; a failed probe is recorded as such, never raised."""
    node = spec.node
    out: dict[str, Any] = {
        "node": node.name,
        "host": node.host,
        "env_set": redact_env(spec.launch_env, spec.secret_env.keys()),
    }
    tool = shlex.join(smi)
    probes = {
        "hostname": "hostname",
        "nvidia_smi_l": f"{tool} -L 2>/dev/null || echo 'nvidia-smi: not available'",
        "driver": f"{tool} --query-gpu=driver_version --format=csv,noheader 2>/dev/null"
        " | head -n 1 || true",
    }
    for key, command in probes.items():
        try:
            _, text = executor.run(node, command, 60)
        except Exception as exc:
            out[key] = f"(probe failed: {exc})"
            continue
        out[key] = text.strip() or None
    out["software"] = software(executor, spec)
    return out


def server_version(url: str, timeout: float = 10.0) -> str | None:
    """The version a running SGLang server states (``GET url/server_info``, field
    ``version``; ``/get_server_info`` where that is not found: the older name, deprecated
    since 0.5.9 and warned about in the log at every call); None when it does not say (an
    error is not a version)."""
    import httpx

    from pytest_kimi.workload import http

    for path in ("/server_info", "/get_server_info"):
        try:
            response = http.get(url + path, timeout=timeout)
            if response.status_code == 404:
                continue
            version = response.json().get("version") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return str(version) if version is not None else None
    return None
