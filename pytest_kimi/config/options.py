"""The ``--layout`` / ``--cluster`` / ``--kimi-*`` options, resolved (:class:`Options`): what
the command line asks of a run, as plain data the run layers read. The pytest side (option
definitions and their resolution) is :mod:`pytest_kimi.plugin.options`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_CLUSTER = Path(__file__).parents[1] / "data" / "local.yaml"
"""The embedded mock backend's cluster file, shipped in the package (clusters/local.yaml is a
copy to read; a test keeps them equal)."""


@dataclass(frozen=True)
class Options:
    """The ``--layout`` / ``--cluster`` / ``--kimi-*`` options, resolved."""

    cluster_path: Path
    layouts: tuple[str, ...]  # empty: every layout of the cluster
    report_dir: Path
    slo_overrides: tuple[str, ...] = ()
    endpoint: str | None = None
    router_metrics: str | None = None  # attached: the router's Prometheus URL (who served what)
    save_baseline: Path | None = None
    baseline: Path | None = None
    fail_thresholds: str = ""
    dataset: str | None = None  # --kimi-dataset: over the cluster file's workload.dataset
    workload: str | None = None  # --kimi-workload: a workload of the file's workloads:
    trace_speed: float | None = None  # --kimi-trace-speed: over a trace workload's trace_speed
    speedbench_config: str | None = None  # over workload.speedbench_config
    category: str | None = None  # over workload.category (a comma list sweeps it)
    prompt: str | None = None  # over workload.prompt
    tokenizer: str | None = None  # local tokenizer dir for prompt: chat_template
    reap: bool = False  # --kimi-reap: stop processes earlier runs left on the nodes
    parallel: bool = False  # -n N (pytest-xdist): layouts are measured at once
    # workload points, each a comma-separated list over the cluster file's
    # (pytest_kimi.config.points)
    concurrency: str | None = None
    request_rate: str | None = None
    num_prompts: str | None = None
    input_len: str | None = None
    output_len: str | None = None
    api: str | None = None
    find_max_concurrency: bool = False  # --kimi-find-max-concurrency
    history: Path | None = None  # --kimi-history: over the cluster file's history:
    commit: str | None = None  # --kimi-commit: the code under test's commit, for the history
    gate: str | None = None  # --kimi-gate: baseline or history (default: baseline if given)
    gate_since: str | None = None  # --kimi-gate-since: the run a history gate's series starts at
    sglang_version: str | None = None  # --kimi-sglang-version: over server.sglang_version
    confidence: str | None = None  # --kimi-confidence: over the cluster file's slo.confidence
    undecided: str = "fail"  # --kimi-undecided: what an undecided SLO test does
    until_decided: int | None = None  # --kimi-until-decided: the most requests per point
    repeat: int = 1  # --kimi-repeat: runs of each point
    repeat_fresh: bool = False  # --kimi-repeat-fresh: a new deployment for each repeat

    def sweep(self) -> dict[str, str]:
        """The workload settings the command line gives (setting -> its comma list)."""
        given = {
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "num_requests": self.num_prompts,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "api": self.api,
            "category": self.category,
        }
        return {name: text for name, text in given.items() if text is not None}
