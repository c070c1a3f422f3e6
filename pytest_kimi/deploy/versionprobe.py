"""Which SGLang the nodes run and which router package the router's node has, asked before any
command line is built.

Each server node's interpreter (the one the plan starts, with its environment, setup lines and
container) is asked for its ``sglang`` release; the router's for ``smg`` and ``sglang-router``
(package metadata: smg's ``__version__`` lags its releases). The answers pick the SGLang
profile and the router package (:mod:`pytest_kimi.config.versions`) the plan is then rebuilt for. A
mock cluster's servers answer as ``server.sglang_version``: they are not asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from packaging.version import InvalidVersion, Version

from pytest_kimi.config import ClusterConfig
from pytest_kimi.config.checks import MOCK_MODULE
from pytest_kimi.config.versions import (
    ROUTER_PACKAGES,
    RouterPackage,
    VersionError,
    Versions,
    package_of_module,
    sglang_profile,
    version_problem,
)
from pytest_kimi.deploy.envinfo import software
from pytest_kimi.deploy.executor import Executor
from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec, cluster_versions
from pytest_kimi.deploy.secrets import REDACTED


class VersionMismatch(RuntimeError):
    """The nodes run no SGLang or router release we can build command lines for."""


def probe_versions(
    executor: Executor, plan: DeploymentPlan, say: Callable[[str], None] = lambda m: None
) -> Versions:
    """What ``plan``'s nodes run, with notes where it differs from what the cluster file
    assumed; a :class:`VersionMismatch` (nothing is started) for an SGLang older than we
    support, nodes on different releases, or no usable router package."""
    cluster = plan.cluster
    base = cluster_versions(cluster)
    sglang, notes = _sglang(executor, plan, base)
    package, version, source, more = _router(executor, plan.router, cluster)
    versions = Versions(sglang, package, version, source, (*base.notes, *notes, *more))
    check_layout(plan, versions)
    say(f"[kimi {plan.layout.name}] {versions.describe()}")
    return versions


def check_layout(plan: DeploymentPlan, versions: Versions) -> None:
    """The layout asks only for what the releases found have: its transfer backend (SGLang's
    choices per release) and its router policies (each package's); else
    :class:`VersionMismatch` naming the setting, the release and what it offers."""
    cluster, layout = plan.cluster, plan.layout
    problems = []
    if layout.disaggregated and layout.transfer_backend not in versions.sglang.transfer_backends:
        problems.append(
            f"layouts.{layout.name}.transfer_backend {layout.transfer_backend!r} is not one of "
            f"{versions.sglang.describe()}'s: {', '.join(versions.sglang.transfer_backends)}"
        )
    sides = layout.sides if layout.disaggregated else (None,)
    policies = {cluster.router_policy(layout, side) for side in sides}
    known = {*versions.router.policies, "bucket"}  # bucket: a prefill policy, checked at load
    for policy in sorted(policies - known):
        problems.append(
            f"layout {layout.name}'s router policy {policy!r} is not one of "
            f"{versions.router.name}'s: {', '.join(versions.router.policies)}"
        )
    if problems:
        raise VersionMismatch("; ".join(problems) + "; nothing was started")


def _sglang(executor: Executor, plan: DeploymentPlan, base: Versions) -> tuple[Any, list[str]]:
    cluster = plan.cluster
    if cluster.server.module == MOCK_MODULE:
        server = cluster.server
        source = (f"the mock, {server.sglang_version_from}" if server.sglang_version
                  else "the mock's default")  # fmt: skip
        return dataclasses.replace(base.sglang, source=source), []
    first: dict[str, ProcessSpec] = {}
    for spec in plan.servers:
        first.setdefault(spec.node.name, spec)

    def ask(spec: ProcessSpec) -> str:
        """The release, or why it could not be read (a string that is not a version)."""
        if _not_yet(spec):
            return "(not asked: its container is started with the process)"
        found = software(executor, spec, packages=("sglang",))
        if isinstance(found, str):
            return _scrubbed(found, spec)
        return str(found.get("sglang") or "(sglang is not importable by its Python)")

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(first)))) as pool:
        found = dict(zip(first, pool.map(ask, first.values()), strict=True))
    versions = {node: v for node, v in found.items() if _is_version(v)}
    unread = sorted(set(found) - set(versions))
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"{node} {v}" for node, v in sorted(versions.items()))
        raise VersionMismatch(
            f"the server nodes run different SGLang releases ({listed}); nothing was started: "
            "every rank of a deployment must run one release"
        )
    if not versions:
        return base.sglang, _unread(plan, base, {node: found[node] for node in unread})
    version = next(iter(versions.values()))
    try:
        profile, notes = sglang_profile(version, "asked of the nodes")
    except VersionError as exc:
        raise VersionMismatch(f"{exc}; nothing was started") from None
    if unread:
        notes.append(f"SGLang's release could not be read on {', '.join(unread)}")
    said = cluster.server.sglang_version
    if said is not None and said != version:
        notes.append(f"{cluster.server.sglang_version_from} says {said}, the nodes run SGLang "
                     f"{version}: command lines built for {version}")  # fmt: skip
    return profile, notes


def _unread(plan: DeploymentPlan, base: Versions, why: dict[str, str]) -> list[str]:
    """No node said its release: the plan stays built for what was assumed, with a note;
    refused for a disaggregated layout without ``server.sglang_version``, whose flags depend
    on the release (assuming the newest would drop 0.5.9's shape flags unseen)."""
    reasons = "; ".join(f"{node}: {text}" for node, text in why.items())
    if plan.layout.disaggregated and plan.cluster.server.sglang_version is None:
        raise VersionMismatch(
            f"SGLang's release could not be read on the server nodes ({reasons}), and a "
            "disaggregated layout's flags depend on it: set server.sglang_version (or "
            "--kimi-sglang-version); nothing was started"
        )
    return [f"SGLang's release could not be read on the server nodes ({reasons}): command "
            f"lines built for {base.sglang.describe()}"]  # fmt: skip


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False  # "installed" (no version stated), or why it could not be read
    return True


def _not_yet(spec: ProcessSpec) -> bool:
    """A process whose container is created with it (``container.mode: run``): nothing
    can be asked inside it before it starts."""
    return spec.container is not None and spec.container.mode == "run"


def _scrubbed(text: str, spec: ProcessSpec) -> str:
    """A failed probe's output (what setup lines printed, too), without the values of the
    process's secret variables: it goes into notes and the manifest."""
    for value in spec.secret_env.values():
        if value:
            text = text.replace(value, REDACTED)
    return text


def _router(
    executor: Executor, router: ProcessSpec, cluster: ClusterConfig
) -> tuple[RouterPackage, str | None, str, list[str]]:
    """The router's package and version on its node, how it was chosen, notes; refused
    (:class:`VersionMismatch`) when not installed, or outside the versions we read without
    ``router.allow_unknown_version``."""
    config = cluster.router
    wanted = config.package
    if wanted == "auto":  # a module named in the file says which
        wanted = package_of_module(config.module) or "auto"
    candidates = list(ROUTER_PACKAGES.values()) if wanted == "auto" else [ROUTER_PACKAGES[wanted]]
    where = f"the router's Python on node {router.node.name}"
    found = ("(not asked: its container is started with the process)" if _not_yet(router)
             else software(executor, router, packages=tuple(p.import_name for p in candidates)))
    if isinstance(found, str):
        found = _scrubbed(found, router)
        if _not_yet(router) or config.allow_unknown_version:
            return candidates[0], None, f"assumed: {where} was not read", [
                f"router: its release could not be read by {where} {found}: command line "
                f"built for {candidates[0].name}'s newest settings"]  # fmt: skip
        raise VersionMismatch(f"the router package could not be read by {where} {found}; "
                              "nothing was started (router.allow_unknown_version: true starts "
                              f"it as {candidates[0].name})")  # fmt: skip
    package = next((p for p in candidates if found.get(p.import_name)), None)
    if package is None:
        names = " nor ".join(p.name for p in candidates)
        has = f"has neither {names}" if len(candidates) > 1 else f"has no {names}"
        wanted_one = candidates[0]
        raise VersionMismatch(
            f"{where} {has} installed; nothing was started. Install the router there (pip install "
            f"'{wanted_one.name}{wanted_one.supported}') or set router.python to the "
            "interpreter that has it"
        )
    version = str(found[package.import_name])
    source = (f"router.package: {config.package}" if config.package != "auto"
              else f"router.package: auto, found on node {router.node.name}")  # fmt: skip
    notes = []
    problem = version_problem(package, version)
    if problem and not config.allow_unknown_version:
        raise VersionMismatch(
            f"router on node {router.node.name}: {problem}; nothing was started. Install "
            f"{package.name}{package.supported} there, or set router.allow_unknown_version: true"
        )
    if problem:
        notes.append(f"router: {problem}: its retry counters may be read wrongly")
    return package, version, source, notes
