"""Version profiles (pytest_kimi.config.versions) and the probe that picks them at bring-up
(pytest_kimi.deploy.versionprobe), without any network: the nodes answer from a table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_kimi.config import ClusterConfig, load_cluster
from pytest_kimi.config.serverargs import flags
from pytest_kimi.config.versions import (
    SGLANG_ROUTER,
    SMG,
    SGLangProfile,
    VersionError,
    assumed,
    router_args,
    sglang_profile,
    version_problem,
)
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.deploy.versionprobe import VersionMismatch, probe_versions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pro6000() -> ClusterConfig:
    return load_cluster(ROOT / "clusters" / "pro6000.yaml")


# ----------------------------------------------------------------------------- profiles


def test_a_release_older_than_supported_or_not_a_release_is_refused_with_the_range() -> None:
    with pytest.raises(VersionError, match=r"0\.5\.8 \(x\) is older .* 0\.5\.9 and newer"):
        sglang_profile("0.5.8", "x")
    with pytest.raises(VersionError, match=r"'latest' .* is not a version"):
        sglang_profile("latest")
    assert sglang_profile("0.5.9") == (SGLangProfile("0.5.9"), [])
    assert sglang_profile("0.5.23.post1")[1] == []  # a post release of the newest is read


def test_a_newer_release_runs_on_the_newest_profile_with_a_note() -> None:
    profile, [note] = sglang_profile("0.6.1", "asked of the nodes")
    assert "newer than the newest release pytest-kimi has read (0.5.23)" in note
    assert not profile.pd_shape_flags and profile.kv_transfer_histograms
    assert profile.mock_wire == "0.5.23"


@pytest.mark.parametrize(
    ("version", "shape", "queue", "tcp", "accepted", "graphs", "streaming"),
    [
        ("0.5.9", True, True, False, "spec_accept_token_num", "--disable-cuda-graph", False),
        ("0.5.10", False, False, False, "spec_accept_token_num", "--disable-cuda-graph", False),
        ("0.5.11", False, False, False, "spec_accepted_drafts", "--disable-cuda-graph", False),
        ("0.5.13", False, False, True, "spec_num_correct_drafts", "--disable-cuda-graph", False),
        ("0.5.14", False, False, True, "spec_num_correct_drafts",
         "--cuda-graph-backend-decode=disabled", False),
        ("0.5.17", False, False, True, "spec_num_correct_drafts",
         "--cuda-graph-backend-decode=disabled", True),
    ],
)  # fmt: skip
def test_each_fact_changes_at_the_release_that_changed_it(
    version, shape, queue, tcp, accepted, graphs, streaming
) -> None:
    # the releases between were read (pip download, each one's own parser and collector)
    profile = SGLangProfile(version)
    assert profile.pd_shape_flags is shape and profile.pd_queue_stages is queue
    assert profile.kv_transfer_histograms is not queue
    assert ("mooncake_tcp" in profile.transfer_backends) is tcp
    assert profile.spec_keys["accepted"] == accepted
    assert profile.cuda_graph_flags[0] == graphs
    assert profile.is_streaming_label is streaming
    assert profile.mock_wire == "0.5.9"  # the newest recording not newer than the release


# ------------------------------------------------------------------------------ routers


def test_each_router_gets_the_settings_its_release_has() -> None:
    common = {"disable-retries", "disable-circuit-breaker", "health-check-timeout-secs",
              "health-failure-threshold", "max-concurrent-requests",
              "worker-startup-check-interval", "shutdown-grace-period-secs"}  # fmt: skip
    assert set(SGLANG_ROUTER.benchmark_args()) == common
    assert set(SMG.benchmark_args("1.1.0")) == common
    assert set(SMG.benchmark_args("1.11.0")) == common | {"pd-admission-wait-secs"}
    v112 = set(SMG.benchmark_args("1.12.0"))
    assert "disable-worker-overload-protection" in v112 and "sse-keepalive-secs" not in v112
    assert SMG.benchmark_args() == SMG.benchmark_args("1.13.0")  # unknown: the newest read
    assert {"worker-stale-secs", "idle-connection-timeout-secs", "sse-keepalive-secs"} <= set(
        SMG.benchmark_args("1.13.0"))
    assert SMG.benchmark_args()["worker-stall-secs"] == 86400  # 0 would veto at once


def test_the_file_wins_over_the_settings_and_tuning_a_feature_asks_for_it() -> None:
    given = router_args(SMG, {"health-check-timeout-secs": 300, "disable-circuit-breaker": False})
    assert given["health-check-timeout-secs"] == 300
    assert "--disable-circuit-breaker" not in flags(given)  # false removes a flag
    tuned = router_args(SGLANG_ROUTER, {"retry-max-retries": 2, "cb-failure-threshold": 4})
    assert "disable-retries" not in tuned and "disable-circuit-breaker" not in tuned


def test_router_versions_outside_the_range_are_named() -> None:
    assert version_problem(SMG, "1.13.0") is None
    assert version_problem(SGLANG_ROUTER, "0.3.2") is None
    assert "sglang-router 0.4.0, outside" in version_problem(SGLANG_ROUTER, "0.4.0")
    assert "smg 2.0.0" in version_problem(SMG, "2.0.0")
    assert "not installed" in version_problem(SMG, None)
    assert "installed" in version_problem(SMG, "installed")  # no release: not one we read


# --------------------------------------------------------------------------- the probe


class Nodes:
    """An executor whose processes answer the version probe from a table: node -> found."""

    def __init__(self, servers: dict[str, dict], router: dict) -> None:
        self.servers, self.router, self.asked = servers, router, []

    def run_as(self, spec, command, timeout=None):
        self.asked.append(spec.name)
        found = self.router if spec.role == "router" else self.servers[spec.node.name]
        return 0, json.dumps({"python": "3.11", **found})


def _nodes(sglang: str | None, router: dict, odd: dict | None = None) -> Nodes:
    servers = {f"node60{i}": {"sglang": sglang} for i in range(1, 9)}
    return Nodes({**servers, **(odd or {})}, router)


SMG_ONLY = {"smg": "1.13.0", "sglang_router": None}


def test_the_nodes_release_and_router_pick_the_profile_with_notes(pro6000) -> None:
    cluster = dataclasses.replace(pro6000, server=dataclasses.replace(
        pro6000.server, sglang_version="0.5.9"))  # fmt: skip
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"))
    said: list[str] = []
    versions = probe_versions(_nodes("0.5.23", SMG_ONLY), plan, said.append)  # type: ignore[arg-type]
    assert (versions.sglang.version, versions.sglang.source) == ("0.5.23", "asked of the nodes")
    assert (versions.router.name, versions.router_version) == ("smg", "1.13.0")
    assert versions.notes == ("server.sglang_version says 0.5.9, the nodes run SGLang 0.5.23: "
                              "command lines built for 0.5.23",)  # fmt: skip
    assert said == ["[kimi pd-pp8-tp32] SGLang 0.5.23 (asked of the nodes); router smg 1.13.0 "
                    "(router.package: auto, found on node node601)"]  # fmt: skip
    # rebuilt for what was found: 0.5.23 takes no shape flags
    rebuilt = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"), versions=versions)
    assert all("--disaggregation-decode-tp" not in s.argv for s in rebuilt.servers)
    assert rebuilt.router.argv[2] == "smg.launch_router"
    assert "--disable-worker-overload-protection" in rebuilt.router.argv


def test_auto_prefers_smg_and_takes_sglang_router_where_only_it_is_there(pro6000) -> None:
    plan = plan_deployment(pro6000, pro6000.layout("tp32"))
    both = probe_versions(_nodes("0.5.9", {"smg": "1.12.0", "sglang_router": "0.3.2"}), plan)  # type: ignore[arg-type]
    assert (both.router.name, both.router_version) == ("smg", "1.12.0")
    old = probe_versions(_nodes("0.5.9", {"smg": None, "sglang_router": "0.3.2"}), plan)  # type: ignore[arg-type]
    assert (old.router.name, old.router_version) == ("sglang-router", "0.3.2")
    rebuilt = plan_deployment(pro6000, pro6000.layout("tp32"), versions=old)
    assert rebuilt.router.argv[2] == "sglang_router.launch_router"
    assert "--disable-worker-overload-protection" not in rebuilt.router.argv


@pytest.mark.parametrize(
    ("sglang", "router", "odd", "package", "words"),
    [
        ("0.5.8", SMG_ONLY, None, "auto", "older than pytest-kimi supports"),
        ("0.5.23", SMG_ONLY, {"node605": {"sglang": "0.5.9"}}, "auto",
         "different SGLang releases (node601 0.5.23, node602 0.5.23, node603 0.5.23, "
         "node604 0.5.23, node605 0.5.9"),
        ("0.5.23", {"smg": None, "sglang_router": None}, None, "auto",
         "node601 has neither smg nor sglang-router installed"),
        ("0.5.23", SMG_ONLY, None, "sglang-router", "has no sglang-router installed"),
        ("0.5.23", {"smg": "0.9.0", "sglang_router": None}, None, "auto",
         "it is smg 0.9.0, outside the versions whose /readiness and /metrics we read"),
    ],
    ids=["old-sglang", "mixed-releases", "no-router", "wrong-package", "old-smg"],
)  # fmt: skip
def test_what_the_plan_cannot_be_built_for_starts_nothing(
    pro6000, sglang, router, odd, package, words
) -> None:
    cluster = dataclasses.replace(pro6000, router=dataclasses.replace(
        pro6000.router, package=package))  # fmt: skip
    plan = plan_deployment(cluster, cluster.layout("tp32"))
    with pytest.raises(VersionMismatch, match="nothing was started") as caught:
        probe_versions(_nodes(sglang, router, odd), plan)  # type: ignore[arg-type]
    assert words in str(caught.value)


def test_an_unknown_router_release_may_start_with_a_note(pro6000) -> None:
    allowed = dataclasses.replace(pro6000.router, allow_unknown_version=True)
    cluster = dataclasses.replace(pro6000, router=allowed)
    plan = plan_deployment(cluster, cluster.layout("tp32"))
    versions = probe_versions(_nodes("0.5.23", {"smg": "2.0.0", "sglang_router": None}), plan)  # type: ignore[arg-type]
    assert any("smg 2.0.0, outside" in note for note in versions.notes)


def test_a_module_in_the_file_names_the_package_and_a_mock_is_not_asked(pro6000) -> None:
    router = dataclasses.replace(pro6000.router, module="sglang_router.launch_router")
    cluster = dataclasses.replace(pro6000, router=router)
    plan = plan_deployment(cluster, cluster.layout("tp32"))
    with pytest.raises(VersionMismatch, match="has no sglang-router installed"):
        probe_versions(_nodes("0.5.23", SMG_ONLY), plan)  # type: ignore[arg-type]
    local = load_cluster(ROOT / "clusters" / "local.yaml")
    nodes = _nodes(None, SMG_ONLY)
    versions = probe_versions(nodes, plan_deployment(local, local.layout("tp32")))  # type: ignore[arg-type]
    assert nodes.asked == ["router"]  # the mock's servers answer as server.sglang_version
    assert (versions.sglang.version, versions.sglang.source) == ("0.5.23", "the mock's default")


def test_a_layout_asking_what_the_releases_lack_is_refused(pro6000, tmp_path) -> None:
    text = (ROOT / "clusters" / "pro6000.yaml").read_text()
    text = text.replace("transfer_backend: mooncake", "transfer_backend: mooncake_tcp")
    text = text.replace("policy: round_robin", "policy: least_load")
    (tmp_path / "c.yaml").write_text(text)
    cluster = load_cluster(tmp_path / "c.yaml")  # every release's choices load
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"))
    with pytest.raises(VersionMismatch) as caught:
        probe_versions(_nodes("0.5.9", {"smg": None, "sglang_router": "0.3.2"}), plan)  # type: ignore[arg-type]
    said = str(caught.value)
    assert ("transfer_backend 'mooncake_tcp' is not one of SGLang 0.5.9 (asked of the "
            "nodes)'s") in said
    assert "router policy 'least_load' is not one of sglang-router's" in said
    probe_versions(_nodes("0.5.13", SMG_ONLY), plan)  # type: ignore[arg-type]  # both have them


def test_a_dry_run_assumes_the_option_the_field_or_the_newest(pro6000) -> None:
    assert assumed(None, "auto").describe() == (
        "SGLang 0.5.23 (the newest profile); router smg (router.package: auto, smg assumed)")
    assert assumed("0.5.9", "sglang-router", "--kimi-sglang-version").describe() == (
        "SGLang 0.5.9 (--kimi-sglang-version); router sglang-router (router.package: "
        "sglang-router)")  # fmt: skip


def test_an_unread_release_keeps_what_was_assumed_except_where_the_flags_depend_on_it(
    pro6000,
) -> None:
    """A node that states no release ("installed": no version, no metadata) or cannot be
    asked is a note on a unified layout (its flags are the same in every release); a
    disaggregated one refuses without server.sglang_version, and follows it with one."""
    unified = plan_deployment(pro6000, pro6000.layout("tp32"))
    versions = probe_versions(_nodes("installed", SMG_ONLY), unified)  # type: ignore[arg-type]
    assert versions.sglang.version == "0.5.23"
    assert "could not be read on the server nodes (node601: installed" in versions.notes[0]
    pd = plan_deployment(pro6000, pro6000.layout("pd-pp8-tp32"))
    with pytest.raises(VersionMismatch, match="a disaggregated layout's flags depend on it"):
        probe_versions(_nodes(None, SMG_ONLY), pd)  # type: ignore[arg-type]
    told = dataclasses.replace(pro6000, server=dataclasses.replace(
        pro6000.server, sglang_version="0.5.9"))  # fmt: skip
    versions = probe_versions(_nodes(None, SMG_ONLY), plan_deployment(told, pd.layout))  # type: ignore[arg-type]
    assert versions.sglang.version == "0.5.9"


def test_a_process_in_a_run_mode_container_is_not_asked_before_it_exists(pro6000) -> None:
    from pytest_kimi.config import ContainerConfig

    box = ContainerConfig(runtime="docker", mode="run", name=None, image="lmsys/sglang:v0.5.9")
    cluster = dataclasses.replace(
        pro6000,
        server=dataclasses.replace(pro6000.server, container=box, sglang_version="0.5.9"),
        router=dataclasses.replace(pro6000.router, container=box, package="sglang-router"),
    )
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"))
    nodes = _nodes("0.5.23", SMG_ONLY)
    versions = probe_versions(nodes, plan)  # type: ignore[arg-type]
    assert nodes.asked == []  # nothing exec'd into a container that does not exist yet
    assert (versions.sglang.version, versions.router.name) == ("0.5.9", "sglang-router")
    assert any("not asked: its container is started with the process" in n
               for n in versions.notes)  # fmt: skip


def test_an_unreadable_router_is_refused_unless_allowed(pro6000) -> None:
    class Broken(Nodes):
        def run_as(self, spec, command, timeout=None):
            if spec.role == "router":
                return 1, "sh: 1: /opt/venv/bin/python: not found HF_TOKEN=hunter2"
            return super().run_as(spec, command, timeout)

    secret = dataclasses.replace(pro6000.router, secret_env={"HF_TOKEN": "hunter2"})
    cluster = dataclasses.replace(pro6000, router=secret)
    plan = plan_deployment(cluster, cluster.layout("tp32"))
    broken = Broken({f"node60{i}": {"sglang": "0.5.23"} for i in range(1, 9)}, {})
    with pytest.raises(VersionMismatch, match="could not be read") as caught:
        probe_versions(broken, plan)  # type: ignore[arg-type]
    assert "hunter2" not in str(caught.value)  # a probe's output keeps no secret
    allowed = dataclasses.replace(cluster, router=dataclasses.replace(
        secret, allow_unknown_version=True))  # fmt: skip
    versions = probe_versions(broken, plan_deployment(allowed, allowed.layout("tp32")))  # type: ignore[arg-type]
    assert versions.router.name == "smg" and versions.router_version is None
    assert "hunter2" not in json.dumps(versions.to_dict())


def test_a_module_in_the_file_decides_a_dry_runs_router_and_a_contradiction_is_refused(
    tmp_path,
) -> None:
    text = (ROOT / "clusters" / "pro6000.yaml").read_text()
    old = "  package: auto"
    assert old in text
    (tmp_path / "a.yaml").write_text(text.replace(old, "  module: sglang_router.launch_router"))
    cluster = load_cluster(tmp_path / "a.yaml")
    plan = plan_deployment(cluster, cluster.layout("tp32"))  # a dry run: nothing asked
    assert plan.router.argv[2] == "sglang_router.launch_router"
    assert "--disable-worker-overload-protection" not in plan.router.argv  # not smg's settings
    assert plan.versions is not None and plan.versions.router.name == "sglang-router"
    (tmp_path / "b.yaml").write_text(text.replace(
        old, "  package: smg\n  module: sglang_router.launch_router"))  # fmt: skip
    with pytest.raises(Exception, match=r"router\.module.*sglang-router's launcher"):
        load_cluster(tmp_path / "b.yaml")
