"""Typed, validated cluster configuration (``clusters/*.yaml``).

One YAML file describes a cluster (nodes, how to start SGLang and the router), the layouts it
can run, the workload and the SLOs. Every problem is a :class:`ConfigError` that names the
file, the line and the field, raised before anything is started. The file's shape is defined
once, by the pydantic models in :mod:`pytest_kimi.config.models` (also the source of the
JSON Schema, ``python -m pytest_kimi.config.schema``); callers read the frozen records below.
"""

from __future__ import annotations

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
