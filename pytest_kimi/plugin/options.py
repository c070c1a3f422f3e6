"""Command-line options and ini keys, and their resolution into
:class:`~pytest_kimi.config.options.Options`. Standard library and pytest only: this runs in every
pytest session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kimi.config.options import DEFAULT_CLUSTER, Options
from pytest_kimi.plugin.decideoptions import (
    add_decision_options,
    decision_options,
    option_or_ini,
)

if TYPE_CHECKING:
    import pytest

SWEEP_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--kimi-concurrency", "kimi_concurrency", "N[,N...]",
     "requests in flight at once (default: workload.concurrency)"),
    ("--kimi-request-rate", "kimi_request_rate", "RATE[,RATE...]",
     "requests/s, Poisson arrivals, or inf (default: workload.request_rate)"),
    ("--kimi-num-prompts", "kimi_num_prompts", "N[,N...]",
     "measured requests per layout (default: workload.num_requests)"),
    ("--kimi-input-len", "kimi_input_len", "TOKENS[,TOKENS...]",
     "prompt length: SPEED-Bench's throughput config of that length, 1024 (throughput_1k) .. "
     "32768, from a snapshot directory (default: workload.input_len)"),
    ("--kimi-output-len", "kimi_output_len", "TOKENS[,TOKENS...]",
     "tokens generated per request (default: workload.output_len)"),
    ("--kimi-api", "kimi_api", "API[,API...]",
     "generate, completions or chat (default: workload.api)"),
)  # fmt: skip
"""(option, dest, metavar, help) of the workload-point options besides --kimi-category."""


def add_options(parser: pytest.Parser) -> None:
    """The ``kimi`` group's options, by topic, in the order ``--help`` lists them; the ini keys."""
    group = parser.getgroup("kimi", "pytest-kimi: LLM-serving benchmarks as tests")
    add_run_options(group)
    add_decision_options(group)
    add_baseline_options(group)
    add_version_options(group)
    add_workload_options(group)
    add_history_options(group)
    add_search_options(group)
    add_display_options(group)
    add_cleanup_options(group)
    add_ini_keys(parser)


def add_run_options(group: pytest.OptionGroup) -> None:
    """What runs and where: layouts, the cluster, reports, SLOs, an attached
    endpoint; a dry run or a pre-flight check instead of a run."""
    group.addoption(
        "--layout",
        dest="kimi_layout",
        default=None,
        help="comma-separated layouts to benchmark, as named in the cluster file "
        "(e.g. tp32,pp8); the first is the comparison's reference. Default: all.",
    )
    group.addoption(
        "--cluster",
        dest="kimi_cluster",
        default=None,
        help="cluster YAML file (default: the embedded mock backend's, shipped with "
        "pytest-kimi; clusters/local.yaml is a copy to read)",
    )
    group.addoption(
        "--kimi-report-dir",
        dest="kimi_report_dir",
        default=None,
        help="where result directories are written (default: reports/)",
    )
    group.addoption(
        "--kimi-slo",
        dest="kimi_slo",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an SLO, repeatable: ttft_p95=25s, tpot_p95=150ms, success_rate=1",
    )
    group.addoption(
        "--kimi-endpoint",
        dest="kimi_endpoint",
        default=None,
        metavar="URL",
        help="attach to an already running deployment at URL (no bring-up or teardown)",
    )
    group.addoption(
        "--kimi-router-metrics",
        dest="kimi_router_metrics",
        default=None,
        metavar="URL",
        help="with --kimi-endpoint: the router's Prometheus metrics URL (its "
        "--prometheus-port, e.g. http://router:29000/metrics): its per-worker counters give "
        "the replica split and the requests it retried",
    )
    group.addoption(
        "--kimi-dry-run",
        dest="kimi_dry_run",
        action="store_true",
        help="print the exact launch commands per layout and node, start nothing, exit",
    )
    group.addoption(
        "--kimi-preflight-only",
        dest="kimi_preflight_only",
        action="store_true",
        help="check every node's GPUs (count as in the cluster file, none busy), print a table "
        "per node, exit 0 when clean and 1 otherwise; start nothing, run no test",
    )


def add_baseline_options(group: pytest.OptionGroup) -> None:
    """Baselines: store this run as one, judge it against one, and the
    regression thresholds."""
    group.addoption(
        "--kimi-save-baseline",
        dest="kimi_save_baseline",
        default=None,
        metavar="PATH",
        help="store this run (metrics and per-request samples) as a baseline JSON file",
    )
    group.addoption(
        "--kimi-baseline",
        dest="kimi_baseline",
        default=None,
        metavar="PATH",
        help="judge this run against a stored baseline: adds test_no_regression[layout-metric]",
    )
    group.addoption(
        "--kimi-fail",
        dest="kimi_fail",
        default="",
        metavar="METRIC:PCT,...",
        help="regression thresholds, e.g. ttft_p95:10%%,tpot_mean:5%% (defaults: cluster YAML "
        "'regression', else ttft_p95:10%%,tpot_mean:5%%,output_throughput:5%%)",
    )


def add_version_options(group: pytest.OptionGroup) -> None:
    """The SGLang release the command lines are built for."""
    group.addoption(
        "--kimi-sglang-version",
        dest="kimi_sglang_version",
        default=None,
        metavar="X.Y.Z",
        help="the SGLang release the servers run, over the cluster file's server.sglang_version: "
        "what --kimi-dry-run builds command lines for, and the release the mock answers as "
        "(0.5.9 or 0.5.23; default: the newest); bring-up asks real nodes and follows them",
    )


def add_workload_options(group: pytest.OptionGroup) -> None:
    """What is sent: the data, its rows, the workload points (a list
    sweeps), the prompt's form and its tokenizer."""
    group.addoption(
        "--kimi-workload",
        dest="kimi_workload",
        default=None,
        metavar="NAME",
        help="a workload the cluster file names under workloads: (e.g. agentic: multi-turn "
        "sessions); default: the file's workload",
    )
    group.addoption(
        "--kimi-trace-speed",
        dest="kimi_trace_speed",
        default=None,
        type=float,
        metavar="F",
        help="replay a trace workload's timestamps F times as fast (default: its trace_speed, 1)",
    )
    group.addoption(
        "--kimi-dataset",
        dest="kimi_dataset",
        default=None,
        metavar="PATH",
        help="SPEED-Bench data: a .jsonl or .parquet file, or a local snapshot directory of "
        "nvidia/SPEED-Bench; for a sessions workload a JSONL of SPEED-Bench rows of several "
        "turns or of ShareGPT conversations (default: the workload's dataset)",
    )
    group.addoption(
        "--kimi-speedbench-config",
        dest="kimi_speedbench_config",
        default=None,
        metavar="NAME",
        help="config of a snapshot directory, as its dataset card names them, e.g. "
        "throughput_1k, qualitative (default: workload.speedbench_config, else throughput_16k)",
    )
    group.addoption(
        "--kimi-category",
        dest="kimi_category",
        default=None,
        metavar="NAME[,NAME...]",
        help="only rows of this category, e.g. low_entropy (default: workload.category); "
        "a list sweeps it, one workload point each",
    )
    for option, dest, metavar, what in SWEEP_OPTIONS:
        group.addoption(
            option,
            dest=dest,
            default=None,
            metavar=metavar,
            help=f"{what}; a comma-separated list sweeps it: each value is a workload point "
            "with its own test items, records and table, on the same deployment",
        )
    group.addoption(
        "--kimi-prompt",
        dest="kimi_prompt",
        default=None,
        choices=("raw", "chat_template", "chat_template_or_raw"),
        help="what is sent: the first turn as is (raw), or in the served model's chat template "
        "as SGLang's SPEED-Bench loader does (chat_template; _or_raw: fall back to raw when the "
        "tokenizer has none). Default: workload.prompt, else raw",
    )
    group.addoption(
        "--kimi-tokenizer",
        dest="kimi_tokenizer",
        default=None,
        metavar="DIR",
        help="local copy of the served model's tokenizer directory, for the chat template "
        "(default: server.args tokenizer-path, else server.model_path)",
    )


def add_history_options(group: pytest.OptionGroup) -> None:
    """The run history, and the regression gate that reads it (or the
    baseline)."""
    group.addoption(
        "--kimi-history",
        dest="kimi_history",
        default=None,
        metavar="PATH",
        help="append this run to a history file (SQLite; created on first use; default: the "
        "cluster file's history:); read it with python -m pytest_kimi.judge.history PATH",
    )
    group.addoption(
        "--kimi-commit",
        dest="kimi_commit",
        default=None,
        metavar="SHA",
        help="the commit of the code under test, kept with the run in the history "
        "(default: $KIMI_COMMIT)",
    )
    group.addoption(
        "--kimi-gate",
        dest="kimi_gate",
        default=None,
        choices=("baseline", "history"),
        help="the regression gate (test_no_regression[layout-metric]): baseline judges against "
        "--kimi-baseline (the default when it is given), history against each metric's series "
        "in the history (--kimi-history), with change-point detection",
    )
    group.addoption(
        "--kimi-gate-since",
        dest="kimi_gate_since",
        default=None,
        metavar="RUN",
        help="--kimi-gate history: judge against the series from this run on (its run id or "
        "uid), accepting a change before it as the new level",
    )


def add_search_options(group: pytest.OptionGroup) -> None:
    """The search for the highest concurrency that meets every SLO."""
    group.addoption(
        "--kimi-find-max-concurrency",
        dest="kimi_find_max_concurrency",
        action="store_true",
        help="per layout, find the highest concurrency that still meets every SLO: doubling "
        "from the low end of --kimi-concurrency's range (one value N: from 1 to N), then "
        "bisection; adds test_max_concurrency[layout], the answer goes in the verdict table",
    )


def add_display_options(group: pytest.OptionGroup) -> None:
    """How progress is shown."""
    group.addoption(
        "--kimi-progress",
        dest="kimi_progress",
        default=None,
        choices=("auto", "live", "plain", "off"),
        help="how progress is shown: a live display (bring-up per node, then requests, "
        "tokens/s and cluster time per layout), plain lines, or none. Default auto: live on "
        "a terminal, plain lines when output is not a terminal, under xdist, or with -qq",
    )


def add_cleanup_options(group: pytest.OptionGroup) -> None:
    """What earlier runs left running on the nodes."""
    group.addoption(
        "--kimi-reap",
        dest="kimi_reap",
        action="store_true",
        help="SSH clusters: stop the processes earlier runs left running on the nodes (found "
        "from their pid files, checked against boot id and start time) instead of refusing "
        "to start",
    )


def add_ini_keys(parser: pytest.Parser) -> None:
    """Ini-file defaults of some of the options above."""
    parser.addini("kimi_layout", "default for --layout")
    parser.addini("kimi_cluster", "default for --cluster")
    parser.addini("kimi_report_dir", "default for --kimi-report-dir")
    parser.addini("kimi_slo", "SLO overrides, one NAME=VALUE per line", type="linelist")
    parser.addini("kimi_endpoint", "default for --kimi-endpoint")
    parser.addini("kimi_confidence", "default for --kimi-confidence")
    parser.addini("kimi_undecided", "default for --kimi-undecided (pass, fail, xfail)")
    parser.addini("kimi_repeat", "default for --kimi-repeat (runs of each workload point)")
    parser.addini("kimi_router_metrics", "default for --kimi-router-metrics")
    parser.addini("kimi_progress", "default for --kimi-progress (auto, live, plain, off)")


def resolve(config: pytest.Config) -> Options:
    """The options of this session; a relative ``--cluster`` is tried from the current
    directory, then from pytest's rootdir."""
    root = Path(config.rootpath)
    given = option_or_ini(config, "kimi_cluster")
    cluster = Path(given) if given else DEFAULT_CLUSTER
    if not cluster.is_absolute() and not cluster.exists():
        cluster = root / cluster
    named = option_or_ini(config, "kimi_layout") or ""
    layouts = tuple(n.strip() for n in named.split(",") if n.strip())
    report = Path(option_or_ini(config, "kimi_report_dir") or root / "reports")
    slos = (*config.getini("kimi_slo"), *config.getoption("kimi_slo"))
    save = config.getoption("kimi_save_baseline")
    base = config.getoption("kimi_baseline")
    return Options(
        cluster,
        layouts,
        report,
        tuple(slos),
        option_or_ini(config, "kimi_endpoint"),
        router_metrics=option_or_ini(config, "kimi_router_metrics"),
        save_baseline=Path(save) if save else None,
        baseline=Path(base) if base else None,
        fail_thresholds=config.getoption("kimi_fail"),
        dataset=config.getoption("kimi_dataset"),
        workload=config.getoption("kimi_workload"),
        trace_speed=config.getoption("kimi_trace_speed"),
        speedbench_config=config.getoption("kimi_speedbench_config"),
        category=config.getoption("kimi_category"),
        prompt=config.getoption("kimi_prompt"),
        tokenizer=config.getoption("kimi_tokenizer"),
        reap=bool(config.getoption("kimi_reap", False)),
        parallel=_parallel(config),
        **{dest.removeprefix("kimi_"): config.getoption(dest) for _, dest, _, _ in SWEEP_OPTIONS},
        find_max_concurrency=bool(config.getoption("kimi_find_max_concurrency", False)),
        history=Path(history) if (history := config.getoption("kimi_history")) else None,
        commit=config.getoption("kimi_commit") or os.environ.get("KIMI_COMMIT") or None,
        gate=config.getoption("kimi_gate"),
        gate_since=config.getoption("kimi_gate_since"),
        sglang_version=config.getoption("kimi_sglang_version"),
        **decision_options(config),
    )


def _parallel(config: pytest.Config) -> bool:
    """Whether pytest-xdist will run layouts at once (``-n N``, N > 1, or ``-n auto``)."""
    workers = getattr(config.option, "numprocesses", None)
    if getattr(config.option, "dist", "no") == "no" or not workers:
        return False
    return workers == "auto" or int(workers) > 1


def explicit(config: pytest.Config) -> bool:
    """Whether this session asked for pytest-kimi (then inputs are checked up front)."""
    return (
        any(option_or_ini(config, n) for n in ("kimi_layout", "kimi_cluster", "kimi_endpoint"))
        or bool(config.getoption("kimi_dataset"))
        or bool(config.getoption("kimi_workload"))
        or bool(config.getoption("kimi_sglang_version"))
        or any(config.getoption(dest) for _, dest, _, _ in SWEEP_OPTIONS)
        or bool(config.getoption("kimi_slo"))
        or bool(config.getoption("kimi_dry_run"))
        or bool(config.getoption("kimi_preflight_only"))
    )
