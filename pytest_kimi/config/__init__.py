"""Typed, validated cluster configuration (``clusters/*.yaml``).

One YAML file describes a cluster (nodes, how to start SGLang and the router), the layouts it
can run, the workload and the SLOs. Every problem is a :class:`ConfigError` that names the
file, the line and the field, raised before anything is started. The file's shape is defined
once, by the pydantic models in :mod:`pytest_kimi.config.models` (also the source of the
JSON Schema, ``python -m pytest_kimi.config.schema``); callers read the frozen records below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kimi.config.cluster import ClusterConfig
    from pytest_kimi.config.load import load_cluster
    from pytest_kimi.config.processes import ContainerConfig, MockConfig, RouterConfig, ServerConfig
    from pytest_kimi.config.runsettings import (
        LockConfig,
        NetworkConfig,
        PreflightConfig,
        WatchdogConfig,
        WorkloadConfig,
    )
    from pytest_kimi.config.topology import Layout, Node, PDSide, Replica, SSHConfig
    from pytest_kimi.config.yamlfile import ConfigError

# Read on first use (PEP 562): importing one light module of this package (the resolved
# options the plugin reads in every pytest session) must not import pydantic and the whole
# cluster-file model with it; a session that runs no pytest-kimi test pays nothing for it.
_WHERE = {
    "ClusterConfig": "pytest_kimi.config.cluster",
    "ConfigError": "pytest_kimi.config.yamlfile",
    "ContainerConfig": "pytest_kimi.config.processes",
    "Layout": "pytest_kimi.config.topology",
    "LockConfig": "pytest_kimi.config.runsettings",
    "MockConfig": "pytest_kimi.config.processes",
    "NetworkConfig": "pytest_kimi.config.runsettings",
    "Node": "pytest_kimi.config.topology",
    "PDSide": "pytest_kimi.config.topology",
    "PreflightConfig": "pytest_kimi.config.runsettings",
    "Replica": "pytest_kimi.config.topology",
    "RouterConfig": "pytest_kimi.config.processes",
    "SSHConfig": "pytest_kimi.config.topology",
    "ServerConfig": "pytest_kimi.config.processes",
    "WatchdogConfig": "pytest_kimi.config.runsettings",
    "WorkloadConfig": "pytest_kimi.config.runsettings",
    "load_cluster": "pytest_kimi.config.load",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ClusterConfig",
    "ConfigError",
    "ContainerConfig",
    "Layout",
    "LockConfig",
    "MockConfig",
    "NetworkConfig",
    "Node",
    "PDSide",
    "PreflightConfig",
    "Replica",
    "RouterConfig",
    "SSHConfig",
    "ServerConfig",
    "WatchdogConfig",
    "WorkloadConfig",
    "load_cluster",
]
