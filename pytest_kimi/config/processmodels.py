"""The cluster file's processes as pydantic models: ``server``, ``router``, ``mock``.

How each SGLang server and the router are started (interpreter, flags, environment, setup
lines, container), and the embedded mock that can stand in for SGLang. Part of the file's
shape (:mod:`pytest_kimi.config.models`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pytest_kimi.config.fields import (
    Argv,
    Env,
    EnvNames,
    Flags,
    GpuSelection,
    Mount,
    NodeName,
    NonNegative,
    Port,
    Seconds,
    ShellLines,
    Text,
    one_of,
)
from pytest_kimi.config.strictmodel import StrictModel

# pytest_kimi.config.versions.ROUTER_PACKAGES, and auto
ROUTER_PACKAGES = ("auto", "smg", "sglang-router")

PYTHON = "Interpreter on the node; 'current' means the one running pytest (local clusters)."
WRAPPER = "argv put before python (not a container runtime: use 'container')."
SETUP = (
    "Shell lines run on the node before the command, in the same shell (conda activate, "
    "module load, source a venv); the first that fails stops the start."
)
ENV_FROM_LOCAL = (
    "NAMES of variables copied from the environment of the machine running pytest "
    "(secrets such as HF_TOKEN: never written in this file or anything we write)."
)


class Container(StrictModel):
    """Run the process inside a container: exec into a running one, or run one from an image.

    The process is started, watched and stopped inside the container (docs/containers.md)."""

    runtime: one_of("docker", "podman", "apptainer", "singularity") = Field(
        description="Container runtime on the nodes."
    )
    mode: one_of("exec", "run") = Field(
        "exec", description="exec: into a running container; run: start one from 'image'."
    )
    name: NodeName | None = Field(
        None, description="exec: the running container (required); run: default kimi-<proc>."
    )
    image: Text | None = Field(None, description="run mode: the image (required there).")
    mounts: list[Mount] = Field(
        default_factory=list, description="run mode: SRC:DST[:ro] bind mounts."
    )
    gpus: GpuSelection = Field(
        "all", description="run mode: 'all', 'none' or a list of GPU indexes."
    )
    args: Argv = Field(default_factory=list, description="run mode: extra runtime flags.")
    executable: Text | None = Field(
        None, description="The runtime's CLI on the nodes; default: the runtime's name."
    )


ARGS = "Command-line flags without leading dashes: flag-name: value (true = a bare flag)."
ROUTER_ARGS = (
    ARGS + " Added to the benchmarking defaults (docs/cluster-file.md#router); false removes "
    "one; any retry-* or cb-* flag given turns the matching disable-* default off."
)


class Server(StrictModel):
    """How to start one SGLang server process on a node."""

    python: Text = Field("python3", description=PYTHON)
    module: Text = Field("sglang.launch_server", description="Module run with python -m.")
    model_path: Text = Field(description="Model directory on the nodes (--model-path).")
    sglang_version: Text | None = Field(
        None,
        description="The SGLang release the servers run, e.g. 0.5.23: what a dry run builds "
        "command lines for and the release the mock answers as (0.5.9 or 0.5.23); bring-up "
        "asks the nodes and says so where they run another. Default: the newest supported.",
    )
    wrapper: Argv = Field(default_factory=list, description=WRAPPER)
    port: Port = Field("auto", description="HTTP port; 'auto' picks a free one (local only).")
    dist_init_port: Port = Field("auto", description="torch.distributed init port, or 'auto'.")
    args: Flags = Field(default_factory=dict, description=ARGS)
    env: Env = Field(default_factory=dict, description="Extra environment of every server.")
    env_from_local: EnvNames = Field(default_factory=list, description=ENV_FROM_LOCAL)
    setup: ShellLines = Field(default_factory=list, description=SETUP)
    container: Container | None = Field(None, description=Container.__doc__)


class Router(StrictModel):
    """How to start the SGLang Router in front of the replicas."""

    python: Text = Field("python3", description=PYTHON)
    package: one_of(*ROUTER_PACKAGES) = Field(
        "auto",
        description="The router package: smg (maintained) or sglang-router (0.3, its "
        "predecessor); auto: whichever the router node's Python has, smg first.",
    )
    module: Text | None = Field(
        None, description="Module run with python -m; default: the package's launcher."
    )
    node: NodeName | None = Field(None, description="Node the router runs on; default: the first.")
    port: Port = Field("auto", description="HTTP port clients use, or 'auto' (local only).")
    prometheus_port: Port = Field("auto", description="Router metrics port, or 'auto'.")
    policy: Text = Field("round_robin", description="Load-balancing policy (--policy).")
    args: Flags = Field(default_factory=dict, description=ROUTER_ARGS)
    env: Env = Field(default_factory=dict, description="Extra environment of the router.")
    wrapper: Argv = Field(default_factory=list, description=WRAPPER)
    model_mount: Text | None = Field(
        None, description="The model dir the router reads its tokenizer from."
    )
    env_from_local: EnvNames = Field(default_factory=list, description=ENV_FROM_LOCAL)
    setup: ShellLines = Field(default_factory=list, description=SETUP)
    container: Container | None = Field(None, description=Container.__doc__)
    allow_unknown_version: bool = Field(
        False,
        description="Start a router outside the versions whose /readiness and /metrics we "
        "read (a note says so) instead of refusing before launch.",
    )


def _profile_schema(schema: dict[str, Any]) -> None:
    """List the mock profile's fields (from the dataclass the mock reads) for editors."""
    from dataclasses import MISSING, fields

    from pytest_kimi.config.profile import Profile

    schema["properties"] = {
        f.name: {"type": "integer" if f.type == "int" else "number", "minimum": 0}
        | ({"default": f.default} if f.default is not MISSING else {})
        for f in fields(Profile)
    }
    schema["additionalProperties"] = False


class Mock(StrictModel):
    """Embedded mock backend settings: time scale, seed and performance profile."""

    time_scale: Seconds = Field(1.0, description="Cluster seconds per wall second.")
    seed: NonNegative = Field(0, description="Seed of the mock's jitter and faults.")
    profile: dict[str, Any] = Field(
        default_factory=dict,
        description="Hardware and model numbers of the performance model (docs/mock.md).",
        json_schema_extra=_profile_schema,
    )
