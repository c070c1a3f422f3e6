"""Every command line the plan builds parses with the real parser of every supported release.

For every cluster file in ``clusters/`` and every layout in it (PD and speculative ones
included), the plan ``--kimi-dry-run`` prints is built for each SGLang release we support and
each router package; then each server's arguments go through that release's own parser
(``ServerArgs.add_cli_args``, in the release's venv: ``scripts/install_real_sglang.sh``) and
each router's through the package's own (``RouterArgs``: smg from the project's venv,
sglang-router 0.3.2 from its own). The truth is the packages', not ours: a flag a release
dropped fails here with the parser's words, the release, the file and the layout. A mock
cluster's servers get the mock's command line, which is SGLang's plus ``--mock-*`` flags:
those are the mock's own and are left out.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from pytest_kimi.config import ClusterConfig, load_cluster
from pytest_kimi.config.versions import ROUTER_PACKAGES, assumed
from pytest_kimi.deploy.plan import DeploymentPlan, plan_deployment
from pytest_kimi.testing.realsglang import (
    ROOT,
    VERSIONS,
    install,
    offline_env,
    router_python,
)

pytestmark = pytest.mark.slow

CLUSTERS = sorted((ROOT / "clusters").glob("*.yaml"))
PARSE = ROOT / "scripts" / "real_sglang" / "parse_args.py"
# (package, release): the project's smg (""), the smg releases where the settings change
# (pytest_kimi.config.versions.SMG: 1.11, 1.12, 1.13), the first smg, and sglang-router 0.3.2
ROUTERS = [("smg", ""), ("smg", "1.12.0"), ("smg", "1.11.0"), ("smg", "1.10.1"),
           ("smg", "1.1.0"), ("sglang-router", "0.3.2")]  # fmt: skip
ENVIRON = {"KIMI_SGLANG_VENV": ".venv-sglang-0.5.23"}  # cpu-sglang.yaml's ${} references


def _clusters() -> list[ClusterConfig]:
    return [load_cluster(path, environ=ENVIRON) for path in CLUSTERS]


def _plans(
    sglang: str, router: str, router_version: str = ""
) -> list[tuple[str, DeploymentPlan]]:
    """``(where, plan)`` of every layout of every cluster file, built for the releases."""
    out = []
    for cluster in _clusters():
        name = Path(cluster.source.path).relative_to(ROOT)
        for layout_name in cluster.layouts:
            layout = cluster.layout(layout_name)
            versions = dataclasses.replace(assumed(sglang, router),
                                           router_version=router_version or None)  # fmt: skip
            plan = plan_deployment(cluster, layout, ports=iter(range(40000, 41000)),
                                   versions=versions)  # fmt: skip
            out.append((f"{name} layout {layout_name}", plan))
    return out


def _arguments(argv: tuple[str, ...]) -> list[str]:
    """What follows ``python -m MODULE``, without the mock's own ``--mock-*`` flags."""
    args = list(argv[argv.index("-m") + 2 :])
    out, skipping = [], False
    for token in args:
        if token.startswith("--"):
            skipping = token.startswith("--mock-")
        if not skipping:
            out.append(token)
    return out


def _parse(python: Path, kind: str, argvs: list[list[str]]) -> list[dict]:
    done = subprocess.run(
        [str(python), str(PARSE), kind], input=json.dumps(argvs), capture_output=True,
        text=True, timeout=600, env=offline_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_cluster_file_and_layout_is_seen() -> None:
    # the parser tests below cover what is there: PD and speculative layouts among them
    names = {Path(c.source.path).name: set(c.layouts) for c in _clusters()}
    assert {"local.yaml", "pro6000.yaml", "slurm-example.yaml", "cpu-sglang.yaml"} <= set(names)
    assert {"pd-pp8-tp32", "tp32-eagle"} <= names["local.yaml"] & names["pro6000.yaml"]


@pytest.mark.parametrize("sglang", VERSIONS)
def test_every_server_command_line_parses_with_that_releases_own_parser(sglang: str) -> None:
    python = install(sglang)
    lines = [(f"{where}, {spec.name}", _arguments(spec.argv))
             for where, plan in _plans(sglang, "auto") for spec in plan.servers]  # fmt: skip
    answers = _parse(python, "server", [argv for _, argv in lines])
    refused = [f"{where}: SGLang {sglang} refuses it: {a['error']}"
               for (where, _), a in zip(lines, answers, strict=True) if not a["ok"]]  # fmt: skip
    assert refused == [], "\n".join(refused)
    seen = {where.split(" layout ")[0] for where, _ in lines}  # every file's servers were read
    assert seen == {str(path.relative_to(ROOT)) for path in CLUSTERS}


@pytest.mark.parametrize(("package", "release"), ROUTERS)
def test_every_router_command_line_parses_with_that_packages_own_parser(
    package: str, release: str
) -> None:
    python = router_python(package, release)
    plans = [(where, plan) for sglang in VERSIONS
             for where, plan in _plans(sglang, package, release)]  # fmt: skip
    lines = [(where, _arguments(plan.router.argv)) for where, plan in plans]
    assert all(plan.router.argv[plan.router.argv.index("-m") + 1]
               == ROUTER_PACKAGES[package].module for _, plan in plans)  # fmt: skip
    answers = _parse(python, package, [argv for _, argv in lines])
    refused = [f"{where}: {package} {release or 'of the project'} refuses it: {a['error']}"
               for (where, _), a in zip(lines, answers, strict=True) if not a["ok"]]  # fmt: skip
    assert refused == [], "\n".join(refused)


def test_a_newer_smgs_settings_are_refused_by_an_older_smg() -> None:
    """The check can fail: smg 1.11 has no switch for overload protection (it is off there)."""
    [(_, plan)] = _plans("0.5.23", "smg", "1.13.0")[:1]
    [answer] = _parse(router_python("smg", "1.11.0"), "smg", [_arguments(plan.router.argv)])
    assert not answer["ok"] and "--disable-worker-overload-protection" in answer["error"]


def test_a_dropped_flag_is_refused_by_the_real_parser_with_its_words() -> None:
    """The check can fail: 0.5.23's parser refuses what 0.5.9's plan gives a PD prefill."""
    python = install("0.5.23")
    [cluster] = [c for c in _clusters() if Path(c.source.path).name == "pro6000.yaml"]
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"), ports=iter(()),
                           versions=assumed("0.5.9", "auto"))  # fmt: skip
    [answer] = _parse(python, "server", [_arguments(plan.servers[0].argv)])
    assert answer == {"ok": False, "error": "sglang.launch_server: error: unrecognized "
                      "arguments: --disaggregation-decode-tp 32"}  # fmt: skip
